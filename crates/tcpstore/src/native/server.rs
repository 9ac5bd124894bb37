//! The TCPStore server: torch's `LibUVStoreDaemon` semantics on std threads.
//!
//! One acceptor thread, and per connection a reader thread (decodes requests,
//! applies them to the shared [`State`] under one lock) and a writer thread
//! (drains that connection's [`Outbox`] into the socket). Every reply and
//! every wake-up is queued while the state lock is held, so each client sees
//! them in the order the single-threaded libuv loop would have produced them,
//! and a client that stops reading can only block its own writer.
//!
//! A client is disconnected, without disturbing the others, when it breaks
//! the protocol: a first request other than VALIDATE with the right magic, a
//! second VALIDATE, an unknown opcode, a key, value or key count over
//! [`Limits::LIBUV`], a truncated frame, or an ADD on a value that is not a
//! decimal integer (torch closes the connection in all these cases too).
//!
//! What a connection costs, and the bounds (the server runs inside the
//! process that hosts the store, so exhausting threads or descriptors would
//! break that process, not just the store):
//! - two threads with [`CONN_STACK`] (256 KiB) stacks, one descriptor, and
//!   a [`READ_BUF`] + [`WRITE_BUF`] (2 × 16 KiB) buffer pair: about 35 KiB
//!   resident and 0.8 MiB of address space while idle, 100 KiB resident in
//!   a process with libtorch loaded, whose 26 KiB of thread-local storage
//!   every thread gets a copy of (measured by `tests/store_hostile.rs`);
//! - at most [`TcpStoreServer::max_connections`] connections at once
//!   ([`MAX_CONNECTIONS`], less where `RLIMIT_NOFILE` is low); the server
//!   hangs up on any connection over that at once and says so on stderr;
//! - a request's memory grows with the bytes that actually arrive, never
//!   with the lengths it announces ([`wire`]), so the memory of requests in
//!   flight is at most what clients sent; a client that does not read its
//!   replies is not read from either once [`OUTBOX_HIGH_WATER`] (32 MiB) of
//!   them are queued, and queued replies share the stored values rather
//!   than copying them.
//!
//! The store has no authentication (neither has torch's): a client can fill
//! it, or hold every connection slot. Serve it on a trusted network.

use std::collections::{HashMap, VecDeque};
use std::io::{self, BufRead, BufReader, BufWriter, Write};
use std::net::{Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use super::wire::{self, Field, Limits, Op, Request, WireError};
use crate::StoreError;

type ConnId = u64;
/// Values are shared between the map and queued replies without copying.
type Value = Arc<[u8]>;

/// Bytes of replies a connection may have queued before the server stops
/// reading its requests (back-pressure on a client that does not read).
const OUTBOX_HIGH_WATER: usize = 32 << 20;

/// Most connections a server serves at once, where `RLIMIT_NOFILE` allows
/// (see [`TcpStoreServer::bind`]). Each costs two threads, so this is also
/// what keeps a connection flood from taking all of the hosting process's
/// threads (8192 at the cap).
pub const MAX_CONNECTIONS: usize = 4096;

/// Fewest connections a server allows, however low `RLIMIT_NOFILE` is.
const MIN_CONNECTIONS: usize = 64;

/// Stack of each connection thread, bytes. The handlers do not recurse and
/// keep their buffers on the heap; std's default (2 MiB) would reserve 16 GiB
/// of address space at [`MAX_CONNECTIONS`].
const CONN_STACK: usize = 256 << 10;

/// Read buffer per connection, bytes: holds many small frames; longer
/// fields are read straight into their own buffers past it.
const READ_BUF: usize = 16 << 10;

/// Write buffer per connection, bytes: batches small replies; long values
/// are written straight from the store past it.
const WRITE_BUF: usize = 16 << 10;

/// Pending-connection queue asked of the kernel (which caps it at
/// `net.core.somaxconn`), as torch's `DEFAULT_BACKLOG`. std's 128 overflows
/// when a few thousand ranks connect at once, and every overflow stalls a
/// client for a 1 s SYN retransmit.
const LISTEN_BACKLOG: libc::c_int = 16384;

/// A c10d TCPStore server listening on all interfaces, on its own threads.
///
/// Mirrors the server half of `c10d::TCPStore` with `isServer=true` (the
/// libuv backend, torch's default): it binds `[::]:port` (dual-stack), falls
/// back to `0.0.0.0:port`, and serves until dropped. Dropping it closes every
/// client connection (their pending calls fail instead of hanging) and waits
/// until all its threads are done.
pub struct TcpStoreServer {
    shared: Arc<Shared>,
    addr: SocketAddr,
    acceptor: Option<JoinHandle<()>>,
}

struct Shared {
    state: Mutex<State>,
    stopping: AtomicBool,
    /// Every live connection: counted against `max_connections`, and shut
    /// down on drop.
    conns: Mutex<HashMap<ConnId, Arc<TcpStream>>>,
    /// Notified whenever a connection leaves `conns`.
    conn_ended: Condvar,
    max_connections: usize,
}

impl TcpStoreServer {
    /// Starts a server on `port` (0: an ephemeral port, see [`Self::port`]).
    ///
    /// It serves at most [`MAX_CONNECTIONS`] (4096) connections at once, or
    /// half the process's soft `RLIMIT_NOFILE` if that is less (but at least
    /// 64), so that store clients cannot take every descriptor of the
    /// hosting process; a connection over the limit is closed at once (its
    /// client sees the connection drop before any reply, and our client and
    /// torch's retry until their timeout), and the server prints one line on
    /// stderr each time it starts refusing.
    ///
    /// Errors: [`StoreError::Bind`] when neither `[::]:port` nor
    /// `0.0.0.0:port` can be bound (typically the port is in use);
    /// [`StoreError::Io`] if the acceptor thread cannot be started.
    pub fn bind(port: u16) -> Result<Self, StoreError> {
        Self::bind_with_max_connections(port, default_max_connections())
    }

    /// [`Self::bind`] with a given connection limit (at least 1) instead of
    /// the default.
    pub fn bind_with_max_connections(
        port: u16,
        max_connections: usize,
    ) -> Result<Self, StoreError> {
        let listener = match TcpListener::bind((Ipv6Addr::UNSPECIFIED, port)) {
            Ok(l) => l,
            Err(v6) => TcpListener::bind((Ipv4Addr::UNSPECIFIED, port)).map_err(|v4| {
                // "In use" is the actionable cause; report it whichever family hit it.
                let source = if v6.kind() == io::ErrorKind::AddrInUse {
                    v6
                } else {
                    v4
                };
                StoreError::Bind {
                    addr: format!("[::]:{port} (and 0.0.0.0:{port})"),
                    source,
                }
            })?,
        };
        // Deepen the accept queue (listen() again only updates it). Best
        // effort: std's 128 still works, only slower under a burst.
        // SAFETY: a valid listening socket descriptor owned by `listener`.
        let _ = unsafe { libc::listen(listener.as_raw_fd(), LISTEN_BACKLOG) };
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            stopping: AtomicBool::new(false),
            conns: Mutex::new(HashMap::new()),
            conn_ended: Condvar::new(),
            max_connections: max_connections.max(1),
        });
        let acceptor = {
            let shared = Arc::clone(&shared);
            thread::Builder::new()
                .name(format!("tcpstore-accept-{}", addr.port()))
                .spawn(move || accept_loop(listener, shared))?
        };
        Ok(Self {
            shared,
            addr,
            acceptor: Some(acceptor),
        })
    }

    /// The port the server listens on (the ephemeral one when bound with 0).
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// The bound address: `[::]:port`, or `0.0.0.0:port` without IPv6.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Most connections served at once; more are closed on arrival.
    pub fn max_connections(&self) -> usize {
        self.shared.max_connections
    }

    /// Connections open now, each counted from its arrival until both of
    /// its threads have ended.
    pub fn open_connections(&self) -> usize {
        lock(&self.shared.conns).len()
    }
}

/// [`MAX_CONNECTIONS`], or half the soft `RLIMIT_NOFILE` if that is less
/// (each connection holds one descriptor; the other half is left to the
/// hosting process), but at least [`MIN_CONNECTIONS`].
fn default_max_connections() -> usize {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the valid, local `lim`.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return MAX_CONNECTIONS;
    }
    let half = usize::try_from(lim.rlim_cur / 2).unwrap_or(usize::MAX);
    half.clamp(MIN_CONNECTIONS, MAX_CONNECTIONS)
}

impl Drop for TcpStoreServer {
    fn drop(&mut self) {
        self.shared.stopping.store(true, Ordering::SeqCst);
        // `accept` has no timeout: a connection of our own wakes it up to see
        // the flag. Without one (no loopback at all) the thread is detached.
        let port = self.addr.port();
        let woke = [
            SocketAddr::from((Ipv4Addr::LOCALHOST, port)),
            SocketAddr::from((Ipv6Addr::LOCALHOST, port)),
        ]
        .iter()
        .any(|a| TcpStream::connect_timeout(a, Duration::from_secs(1)).is_ok());
        if let Some(acceptor) = self.acceptor.take() {
            if woke {
                let _ = acceptor.join();
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // The state stays consistent across a panicking handler (each request is
    // applied before replies are queued), so keep serving the others.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    let port = listener.local_addr().map_or(0, |a| a.port());
    let mut next_id: ConnId = 0;
    // Whether the last arrival was refused: the stderr line is printed once
    // per stretch of refusals, not once per connection.
    let mut refusing = false;
    for incoming in listener.incoming() {
        if shared.stopping.load(Ordering::SeqCst) {
            break;
        }
        let stream = match incoming {
            Ok(stream) => Arc::new(stream),
            // Out of descriptors and the like: back off instead of spinning.
            Err(_) => {
                thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        let id = {
            let mut conns = lock(&shared.conns);
            if conns.len() >= shared.max_connections {
                drop(conns);
                let _ = stream.shutdown(Shutdown::Both);
                if !refusing {
                    tracing::warn!(
                        "TCPStore server on port {port}: refusing connections: {} are open, \
                         the most it serves at once (TcpStoreServer::max_connections)",
                        shared.max_connections
                    );
                }
                refusing = true;
                continue;
            }
            next_id += 1;
            conns.insert(next_id, Arc::clone(&stream));
            next_id
        };
        refusing = false;
        // The connection's slot: whatever happens to its thread (even a
        // panic, or not starting at all) the slot is given back.
        let slot = Slot {
            id,
            shared: Arc::clone(&shared),
        };
        let spawned = thread::Builder::new()
            .name(format!("tcpstore-conn-{id}"))
            .stack_size(CONN_STACK)
            .spawn(move || serve(slot, stream));
        // Detached: a finished connection's thread is gone at once, with
        // nothing to reap; `Slot` tells the acceptor when all have ended.
        drop(spawned);
    }
    drop(listener);
    let mut conns = lock(&shared.conns);
    for stream in conns.values() {
        let _ = stream.shutdown(Shutdown::Both);
    }
    while !conns.is_empty() {
        conns = shared
            .conn_ended
            .wait(conns)
            .unwrap_or_else(PoisonError::into_inner);
    }
}

/// A connection's place in [`Shared::conns`], freed when dropped.
struct Slot {
    id: ConnId,
    shared: Arc<Shared>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some(stream) = lock(&self.shared.conns).remove(&self.id) {
            let _ = stream.shutdown(Shutdown::Both);
        }
        self.shared.conn_ended.notify_all();
    }
}

/// Why a session ended.
enum End {
    /// The client closed the connection between requests.
    Clean,
    /// I/O failure or protocol violation: drop the connection at once.
    Abort,
}

fn serve(slot: Slot, stream: Arc<TcpStream>) {
    let (id, shared) = (slot.id, &*slot.shared);
    let _ = stream.set_nodelay(true);
    let outbox = Arc::new(Outbox::default());
    // Closes the outbox however this thread leaves, so that the writer
    // never waits for replies that will not come.
    let closer = CloseOnDrop(Arc::clone(&outbox));
    let writer: Option<JoinHandle<()>> = {
        let (outbox, out) = (Arc::clone(&outbox), Arc::clone(&stream));
        thread::Builder::new()
            .name(format!("tcpstore-conn-{id}-tx"))
            .stack_size(CONN_STACK)
            .spawn(move || write_loop(&outbox, &out))
            .ok()
    };
    let end = match writer {
        Some(_) => {
            lock(&shared.state).outboxes.insert(id, Arc::clone(&outbox));
            let mut reader = BufReader::with_capacity(READ_BUF, &*stream);
            session(id, &mut reader, shared, &outbox)
        }
        None => End::Abort,
    };
    {
        let mut state = lock(&shared.state);
        state.clear_wait_state(id);
        state.outboxes.remove(&id);
    }
    match end {
        End::Clean => outbox.finish(),
        End::Abort => {
            outbox.close();
            let _ = stream.shutdown(Shutdown::Both);
        }
    }
    if let Some(writer) = writer {
        let _ = writer.join();
    }
    drop(closer);
    // `slot` drops last: the connection counts until both threads are done.
    drop(slot);
}

/// Closes an [`Outbox`] when dropped.
struct CloseOnDrop(Arc<Outbox>);

impl Drop for CloseOnDrop {
    fn drop(&mut self) {
        self.0.close();
    }
}

fn session(
    id: ConnId,
    reader: &mut BufReader<&TcpStream>,
    shared: &Shared,
    outbox: &Outbox,
) -> End {
    let limits = Limits::LIBUV;
    // torch's server ignores every request until a VALIDATE with its magic.
    // Hang up at the first byte that cannot start one: garbage must not make
    // us wait for, and buffer, a frame whose length it happens to announce.
    loop {
        match reader.fill_buf() {
            Ok([]) => return End::Clean,
            Ok([op, ..]) if *op == Op::Validate as u8 => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            _ => return End::Abort,
        }
    }
    match Request::read_from(reader, &limits) {
        Ok(Request::Validate {
            magic: wire::VALIDATION_MAGIC,
        }) => {}
        Err(WireError::Closed) => return End::Clean,
        _ => return End::Abort,
    }
    loop {
        if !outbox.wait_below(OUTBOX_HIGH_WATER) {
            return End::Abort;
        }
        let request = match Request::read_from(reader, &limits) {
            Ok(r) => r,
            Err(WireError::Closed) => return End::Clean,
            Err(_) => return End::Abort,
        };
        if lock(&shared.state).apply(id, request, outbox).is_err() {
            return End::Abort;
        }
    }
}

/// A request the server refuses by closing the connection.
struct Violation;

/// The store itself, and who waits for what. Mirrors `LibUVStoreDaemon`'s
/// members: `tcpStore_`, `queues_`, `waitingSockets_`, `keysAwaited_`.
#[derive(Default)]
struct State {
    kv: HashMap<Vec<u8>, Value>,
    queues: HashMap<Vec<u8>, VecDeque<Value>>,
    /// Key → connections waiting for it (a connection once per mention).
    waiting: HashMap<Vec<u8>, Vec<ConnId>>,
    /// Connection → keys it still waits for.
    awaited: HashMap<ConnId, usize>,
    outboxes: HashMap<ConnId, Arc<Outbox>>,
}

fn empty() -> Value {
    Arc::from(&[][..])
}

impl State {
    /// Applies one request from connection `id`, queueing its reply.
    fn apply(
        &mut self,
        id: ConnId,
        request: Request<'static>,
        out: &Outbox,
    ) -> Result<(), Violation> {
        match request {
            Request::Validate { .. } => return Err(Violation),
            Request::Ping { nonce } => out.push_raw(nonce.to_le_bytes().to_vec()),
            Request::Set { key, value } => {
                self.set(key.into_owned(), Value::from(value.into_owned()))
            }
            Request::CompareSet {
                key,
                expected,
                desired,
            } => {
                let now = self.compare_set(key.into_owned(), &expected, desired.into_owned());
                out.push_value(now);
            }
            Request::Get { key } => out.push_value(self.get(&key)),
            Request::Add { key, delta } => {
                let now = self.add(key.into_owned(), delta)?;
                out.push_raw(now.to_le_bytes().to_vec());
            }
            Request::Check { keys } => {
                let ready = self.check(&keys);
                out.push_raw(vec![if ready {
                    wire::CHECK_READY
                } else {
                    wire::CHECK_NOT_READY
                }]);
            }
            Request::Wait { keys } => {
                if self.wait_keys(id, keys) {
                    out.push_raw(vec![wire::WAIT_STOP_WAITING]);
                }
            }
            Request::GetNumKeys => out.push_raw((self.kv.len() as i64).to_le_bytes().to_vec()),
            Request::DeleteKey { key } => {
                let deleted = i64::from(self.kv.remove(&*key).is_some());
                out.push_raw(deleted.to_le_bytes().to_vec());
            }
            Request::Append { key, value } => self.append(key.into_owned(), &value),
            Request::MultiGet { keys } => keys.iter().for_each(|k| out.push_value(self.get(k))),
            Request::MultiSet { pairs } => {
                for (key, value) in pairs {
                    self.set(key.into_owned(), Value::from(value.into_owned()));
                }
            }
            Request::CancelWait => {
                self.clear_wait_state(id);
                out.push_raw(vec![wire::WAIT_CANCELED]);
            }
            Request::QueuePush { key, value } => {
                let key = key.into_owned();
                self.queues
                    .entry(key.clone())
                    .or_default()
                    .push_back(Value::from(value.into_owned()));
                self.wake_one(&key);
            }
            Request::QueuePop { key } => {
                let queue = self.queues.entry(key.into_owned()).or_default();
                out.push_raw((queue.len() as i64).to_le_bytes().to_vec());
                if let Some(v) = queue.pop_front() {
                    out.push_value(v);
                }
            }
            Request::QueueLen { key } => {
                let len = self.queues.get(&*key).map_or(0, VecDeque::len);
                out.push_raw((len as i64).to_le_bytes().to_vec());
            }
            Request::ListKeys => {
                let mut reply = Vec::new();
                wire::put_i64(&mut reply, self.kv.len() as i64);
                self.kv.keys().for_each(|k| wire::put_bytes(&mut reply, k));
                out.push_raw(reply);
            }
        }
        Ok(())
    }

    /// A missing key reads as empty, as in torch (its client waits first).
    fn get(&self, key: &[u8]) -> Value {
        self.kv.get(key).cloned().unwrap_or_else(empty)
    }

    fn set(&mut self, key: Vec<u8>, value: Value) {
        self.kv.insert(key.clone(), value);
        self.wake_all(&key);
    }

    fn append(&mut self, key: Vec<u8>, value: &[u8]) {
        let joined: Value = match self.kv.get(&key) {
            Some(old) => [&old[..], value].concat().into(),
            None => Value::from(value),
        };
        self.set(key, joined);
    }

    /// `compareAndSet`, quirks included: a missing key with a non-empty
    /// `expected` is left missing and `expected` is returned, and waiters of
    /// the key are woken in every case.
    fn compare_set(&mut self, key: Vec<u8>, expected: &[u8], desired: Vec<u8>) -> Value {
        let now = match self.kv.get_mut(&key) {
            None if expected.is_empty() => {
                let v = Value::from(desired);
                self.kv.insert(key.clone(), Arc::clone(&v));
                v
            }
            None => Value::from(expected),
            Some(current) => {
                if **current == *expected {
                    *current = Value::from(desired);
                }
                Arc::clone(current)
            }
        };
        self.wake_all(&key);
        now
    }

    /// The counter lives as decimal ASCII (`std::to_string`), read back with
    /// `std::stoll`; where torch would throw, the client is disconnected.
    fn add(&mut self, key: Vec<u8>, delta: i64) -> Result<i64, Violation> {
        let now = match self.kv.get(&key) {
            Some(old) => wire::parse_stoll(old)
                .and_then(|n| n.checked_add(delta))
                .ok_or(Violation)?,
            None => delta,
        };
        self.set(key, Value::from(now.to_string().into_bytes()));
        Ok(now)
    }

    /// A key counts as present if it is set or names a non-empty queue.
    fn check(&self, keys: &[Field<'_>]) -> bool {
        keys.iter().all(|k| {
            self.kv.contains_key(&**k) || self.queues.get(&**k).is_some_and(|q| !q.is_empty())
        })
    }

    /// Registers `id` as waiting for the missing keys; true if none is missing.
    fn wait_keys(&mut self, id: ConnId, keys: Vec<Field<'static>>) -> bool {
        if self.check(&keys) {
            return true;
        }
        let mut missing = 0;
        for key in keys {
            if !self.kv.contains_key(&*key) {
                self.waiting.entry(key.into_owned()).or_default().push(id);
                missing += 1;
            }
        }
        self.awaited.insert(id, missing);
        false
    }

    /// Counts one awaited key off `id`; true when that was its last.
    fn count_off(&mut self, id: ConnId) -> bool {
        match self.awaited.get_mut(&id) {
            Some(n) if *n > 0 => {
                *n -= 1;
                *n == 0
            }
            _ => false,
        }
    }

    fn stop_waiting(&self, id: ConnId) {
        if let Some(out) = self.outboxes.get(&id) {
            out.push_raw(vec![wire::WAIT_STOP_WAITING]);
        }
    }

    fn wake_all(&mut self, key: &[u8]) {
        for id in self.waiting.remove(key).unwrap_or_default() {
            if self.count_off(id) {
                self.stop_waiting(id);
            }
        }
    }

    /// QUEUE_PUSH wakes the first waiter whose wait it completes; like torch
    /// it leaves the key's waiter list in place.
    fn wake_one(&mut self, key: &[u8]) {
        let ids = self.waiting.get(key).cloned().unwrap_or_default();
        if let Some(id) = ids.into_iter().find(|&id| self.count_off(id)) {
            self.stop_waiting(id);
        }
    }

    fn clear_wait_state(&mut self, id: ConnId) {
        if self.awaited.remove(&id).is_none() {
            return;
        }
        self.waiting.retain(|_, ids| {
            ids.retain(|&i| i != id);
            !ids.is_empty()
        });
    }
}

/// Replies queued for one connection, written by its writer thread.
#[derive(Default)]
struct Outbox {
    queue: Mutex<OutQueue>,
    changed: Condvar,
}

#[derive(Default)]
struct OutQueue {
    frames: VecDeque<Frame>,
    bytes: usize,
    mode: Mode,
}

#[derive(Default, PartialEq, Eq)]
enum Mode {
    #[default]
    Open,
    /// Write what is queued, then stop.
    Finishing,
    /// Drop everything, stop now.
    Closed,
}

enum Frame {
    /// Bytes sent as they are.
    Raw(Vec<u8>),
    /// A `bytes` field: u64 length, then the value.
    Value(Value),
}

impl Frame {
    fn len(&self) -> usize {
        match self {
            Frame::Raw(b) => b.len(),
            Frame::Value(v) => 8 + v.len(),
        }
    }
}

impl Outbox {
    fn push(&self, frame: Frame) {
        let mut q = lock(&self.queue);
        if q.mode == Mode::Open {
            q.bytes += frame.len();
            q.frames.push_back(frame);
            self.changed.notify_all();
        }
    }

    fn push_raw(&self, bytes: Vec<u8>) {
        self.push(Frame::Raw(bytes));
    }

    fn push_value(&self, value: Value) {
        self.push(Frame::Value(value));
    }

    /// Blocks while more than `limit` bytes are queued; false once closed.
    fn wait_below(&self, limit: usize) -> bool {
        let mut q = lock(&self.queue);
        while q.bytes > limit && q.mode == Mode::Open {
            q = self.changed.wait(q).unwrap_or_else(PoisonError::into_inner);
        }
        q.mode == Mode::Open
    }

    fn finish(&self) {
        let mut q = lock(&self.queue);
        if q.mode == Mode::Open {
            q.mode = Mode::Finishing;
        }
        self.changed.notify_all();
    }

    fn close(&self) {
        let mut q = lock(&self.queue);
        q.mode = Mode::Closed;
        q.frames.clear();
        q.bytes = 0;
        self.changed.notify_all();
    }

    /// Everything queued so far; `None` when the writer should stop.
    fn next_batch(&self) -> Option<Vec<Frame>> {
        let mut q = lock(&self.queue);
        loop {
            if q.mode == Mode::Closed {
                return None;
            }
            if !q.frames.is_empty() {
                return Some(q.frames.drain(..).collect());
            }
            if q.mode == Mode::Finishing {
                return None;
            }
            q = self.changed.wait(q).unwrap_or_else(PoisonError::into_inner);
        }
    }

    fn sent(&self, bytes: usize) {
        let mut q = lock(&self.queue);
        q.bytes = q.bytes.saturating_sub(bytes);
        self.changed.notify_all();
    }
}

fn write_loop(outbox: &Outbox, stream: &TcpStream) {
    let mut out = BufWriter::with_capacity(WRITE_BUF, stream);
    while let Some(batch) = outbox.next_batch() {
        let written = batch.iter().try_for_each(|frame| match frame {
            Frame::Raw(b) => out.write_all(b),
            Frame::Value(v) => {
                out.write_all(&(v.len() as u64).to_le_bytes())?;
                out.write_all(v)
            }
        });
        let flushed = written.and_then(|()| out.flush());
        outbox.sent(batch.iter().map(Frame::len).sum());
        if flushed.is_err() {
            // The reader may be blocked on the socket: wake it too.
            outbox.close();
            let _ = stream.shutdown(Shutdown::Both);
            return;
        }
    }
}
