//! A TCPStore server and client written in Rust that speak the wire protocol
//! of PyTorch's `c10d::TCPStore` (torch 2.11), so either side can be torch.
//!
//! - [`wire`]: the frame format (opcodes, encoding, hardened decoding);
//! - [`TcpStoreServer`]: the server (`LibUVStoreDaemon` semantics);
//! - `client`: one connection with torch's request logic (`doWait`, ...);
//! - [`TcpStore`]: the [`Store`](super::Store) users open, the counterpart of
//!   `c10d::TCPStore` (hosts the server when `is_server`).

mod client;
mod server;
pub mod wire;

use std::ops::{Deref, DerefMut};
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

pub use server::{MAX_CONNECTIONS, TcpStoreServer};

use self::client::{Client, Ctx, check_limits};
use super::{Bounded, Stalled, StoreError, StoreOptions};

/// The worker counter `TCPStore::waitForWorkers` bumps; torch's client sends
/// it without the `/` prefix, so user keys can never collide with it.
const INIT_KEY: &[u8] = b"init/";

/// How often the hosting side re-reads the worker counter (torch: 10 ms).
const JOIN_POLL: Duration = Duration::from_millis(10);

/// A c10d TCPStore client, hosting the server too when opened with
/// `is_server` — the Rust counterpart of `c10d::TCPStore`.
///
/// Every user key goes on the wire as `/` + key, as torch's client sends it.
/// Calls are serialised on one connection (torch's `activeOpLock_`), so a
/// `TcpStore` can be shared between threads; a second handle that must not
/// queue behind a long `wait` needs its own `TcpStore`.
///
/// Every request has a deadline, [`Store::timeout`](super::Store::timeout)
/// unless given another through
/// [`Store::with_deadline`](super::Store::with_deadline): writing it, waiting
/// for its answer, and waiting for the connection while another request
/// holds it. Past it the call fails with [`StoreError::NoReply`] and the
/// connection is unusable from then on (torch's client has no such deadline
/// and waits forever for a frozen server).
pub struct TcpStore {
    // Declared before `server` so that it is dropped first: our own
    // connection closes before the server shuts the others down.
    client: Slot<Client>,
    server: Option<TcpStoreServer>,
    host: String,
    port: u16,
    timeout: Duration,
}

impl TcpStore {
    /// Opens the store per `opts`, like `c10d::TCPStore(host, opts)`:
    /// starts the server if `is_server`, connects (retrying until
    /// `opts.timeout`), validates and pings; then, with `wait_workers` and
    /// `num_workers = Some(n)`, joins with `ADD init/ 1`, and the server side
    /// blocks until the counter reaches `n`.
    ///
    /// Errors: [`StoreError::Bind`] (port taken), [`StoreError::Unreachable`]
    /// (no server in `opts.timeout`), [`StoreError::NoReply`] (a server
    /// accepted but did not answer the PING, or `ADD`/`GET init/`, within
    /// `opts.timeout`), [`StoreError::WorkersTimeout`] (peers missing after
    /// `opts.timeout`), [`StoreError::Io`] (connection lost).
    pub fn open(opts: &StoreOptions) -> Result<Self, StoreError> {
        let server = if opts.is_server {
            Some(TcpStoreServer::bind(opts.port)?)
        } else {
            None
        };
        let port = server.as_ref().map_or(opts.port, TcpStoreServer::port);
        let client = Client::connect(&opts.host, port, opts.timeout)?;
        let store = TcpStore {
            client: Slot::new(client),
            server,
            host: opts.host.clone(),
            port,
            timeout: opts.timeout,
        };
        // As in torch, only a store that waits for workers counts itself in.
        if let (true, Some(expected)) = (opts.wait_workers, opts.num_workers) {
            store.join_workers(expected)?;
        }
        Ok(store)
    }

    /// The server's port: the one actually bound when hosting (so port 0 in
    /// the options yields the ephemeral port here), else `opts.port`.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The host this client connected to.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The server this store hosts, if opened with `is_server`.
    pub fn server(&self) -> Option<&TcpStoreServer> {
        self.server.as_ref()
    }

    fn addr(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }

    /// The connection, once no other request holds it; waits at most
    /// `ctx.deadline` for it ([`StoreError::NoReply`], [`Stalled::Queued`]).
    fn client(&self, ctx: &Ctx<'_>) -> Result<Lent<'_, Client>, StoreError> {
        self.client
            .take(ctx.deadline)
            .ok_or_else(|| ctx.no_reply(&self.addr(), Stalled::Queued))
    }

    /// `TCPStore::waitForWorkers`: count ourselves in; the host then polls
    /// the counter until `expected` participants have joined.
    fn join_workers(&self, expected: u32) -> Result<(), StoreError> {
        let init = std::str::from_utf8(INIT_KEY).unwrap_or("init/");
        let keys = [init];
        let add = Ctx {
            op: "ADD",
            keys: &keys,
            deadline: self.timeout,
        };
        let get = Ctx { op: "GET", ..add };
        let mut client = self.client(&add)?;
        client.add(&add, INIT_KEY, 1)?;
        if self.server.is_none() {
            return Ok(());
        }
        let start = Instant::now();
        loop {
            let joined = match client.get(&get, INIT_KEY, self.timeout)? {
                Some(v) => wire::parse_stoll(&v).unwrap_or(0),
                None => 0,
            };
            if joined >= i64::from(expected) {
                return Ok(());
            }
            let waited = start.elapsed();
            if !self.timeout.is_zero() && waited > self.timeout {
                return Err(StoreError::WorkersTimeout {
                    addr: self.addr(),
                    joined,
                    expected,
                    after: waited,
                });
            }
            thread::sleep(JOIN_POLL);
        }
    }
}

/// The connection, lent to one request at a time (torch's `activeOpLock_`)
/// with a bounded wait: a request stuck on a frozen store holds it, and the
/// callers queued behind must not wait forever either (a `Mutex` cannot
/// give up waiting).
struct Slot<T> {
    item: Mutex<Option<T>>,
    returned: Condvar,
}

impl<T> Slot<T> {
    fn new(item: T) -> Self {
        Self {
            item: Mutex::new(Some(item)),
            returned: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Option<T>> {
        self.item.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes the item, waiting at most `limit` (`Duration::ZERO`: no limit)
    /// for the holder to give it back; `None` if it did not.
    fn take(&self, limit: Duration) -> Option<Lent<'_, T>> {
        let guard = self.lock();
        let mut guard = if limit.is_zero() {
            self.returned
                .wait_while(guard, |i| i.is_none())
                .unwrap_or_else(PoisonError::into_inner)
        } else {
            self.returned
                .wait_timeout_while(guard, limit, |i| i.is_none())
                .unwrap_or_else(PoisonError::into_inner)
                .0
        };
        let item = guard.take()?;
        Some(Lent {
            slot: self,
            item: Some(item),
        })
    }
}

/// An item taken from a [`Slot`]; goes back (waking one waiter) when
/// dropped, also when the borrower panics.
struct Lent<'a, T> {
    slot: &'a Slot<T>,
    item: Option<T>,
}

impl<T> Deref for Lent<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        self.item
            .as_ref()
            .expect("a lent item is present until dropped")
    }
}

impl<T> DerefMut for Lent<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        self.item
            .as_mut()
            .expect("a lent item is present until dropped")
    }
}

impl<T> Drop for Lent<'_, T> {
    fn drop(&mut self) {
        *self.slot.lock() = self.item.take();
        self.slot.returned.notify_one();
    }
}

/// The key as torch's client puts it on the wire.
fn wire_key(key: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(key.len() + 1);
    k.push(b'/');
    k.extend_from_slice(key.as_bytes());
    k
}

fn wire_keys(keys: &[&str]) -> Result<Vec<Vec<u8>>, StoreError> {
    let max = wire::Limits::LIBUV.max_key_count;
    if keys.len() > max {
        return Err(StoreError::Invalid(format!(
            "{} keys in one request: torch's TCPStore server accepts at most {max}",
            keys.len()
        )));
    }
    keys.iter()
        .map(|k| {
            let k = wire_key(k);
            check_limits(&k, None).map(|()| k)
        })
        .collect()
}

fn timed_out(addr: String, keys: &[&str], after: Duration) -> StoreError {
    StoreError::Timeout {
        addr,
        keys: keys.iter().map(|k| k.to_string()).collect(),
        after,
    }
}

/// One operation's request: its keys in wire form, each checked against
/// torch's limits, and the context its errors name.
struct Request<'a> {
    ctx: Ctx<'a>,
    wire: Vec<Vec<u8>>,
}

impl<'a> Request<'a> {
    fn new(op: &'static str, keys: &'a [&'a str], deadline: Duration) -> Result<Self, StoreError> {
        let wire = wire_keys(keys)?;
        Ok(Self {
            ctx: Ctx { op, keys, deadline },
            wire,
        })
    }

    /// The wire keys, as the client's calls take them.
    fn refs(&self) -> Vec<&[u8]> {
        self.wire.iter().map(Vec::as_slice).collect()
    }

    /// The wire key of a one-key operation.
    fn key(&self) -> &[u8] {
        &self.wire[0]
    }
}

impl TcpStore {
    /// A connection for `req` (lent from the pool, or opened).
    fn client_for(&self, req: &Request<'_>) -> Result<Lent<'_, Client>, StoreError> {
        self.client(&req.ctx)
    }
}

impl Bounded for TcpStore {
    fn default_deadline(&self) -> Duration {
        self.timeout
    }

    fn set_by(&self, key: &str, value: &[u8], deadline: Duration) -> Result<(), StoreError> {
        let req = Request::new("SET", std::slice::from_ref(&key), deadline)?;
        check_limits(req.key(), Some(value))?;
        self.client_for(&req)?.set(&req.ctx, req.key(), value)
    }

    fn get_by(&self, key: &str, deadline: Duration) -> Result<Vec<u8>, StoreError> {
        let req = Request::new("GET", std::slice::from_ref(&key), deadline)?;
        self.client_for(&req)?
            .get(&req.ctx, req.key(), deadline)?
            .ok_or_else(|| timed_out(self.addr(), &[key], deadline))
    }

    fn wait_by(
        &self,
        keys: &[&str],
        timeout: Duration,
        deadline: Duration,
    ) -> Result<(), StoreError> {
        let req = Request::new("WAIT", keys, deadline)?;
        if self
            .client_for(&req)?
            .wait(&req.ctx, &req.refs(), timeout)?
        {
            Ok(())
        } else {
            Err(timed_out(self.addr(), keys, timeout))
        }
    }

    fn check_by(&self, keys: &[&str], deadline: Duration) -> Result<bool, StoreError> {
        let req = Request::new("CHECK", keys, deadline)?;
        self.client_for(&req)?.check(&req.ctx, &req.refs())
    }

    /// CHECK, then a GET without the WAIT before it, on one connection
    /// held for both: the server answers a key deleted in between with an
    /// empty value, which a second CHECK tells from a value that is empty.
    fn try_get_by(&self, key: &str, deadline: Duration) -> Result<Option<Vec<u8>>, StoreError> {
        let req = Request::new("GET", std::slice::from_ref(&key), deadline)?;
        let mut client = self.client_for(&req)?;
        if !client.check(&req.ctx, &[req.key()])? {
            return Ok(None);
        }
        let value = client.get_now(&req.ctx, req.key())?;
        if value.is_empty() && !client.check(&req.ctx, &[req.key()])? {
            return Ok(None);
        }
        Ok(Some(value))
    }

    /// One MULTI_GET without the WAIT before it (the server answers a
    /// missing key with an empty value, as torch's does), then, on the same
    /// connection, a CHECK for each empty value, which tells a deleted key
    /// from an empty one: one round trip while every key exists.
    fn try_multi_get_by(
        &self,
        keys: &[&str],
        deadline: Duration,
    ) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let req = Request::new("MULTI_GET", keys, deadline)?;
        let refs = req.refs();
        let mut client = self.client_for(&req)?;
        let values = client.multi_get_now(&req.ctx, &refs)?;
        let mut out = Vec::with_capacity(values.len());
        for (value, key) in values.into_iter().zip(&refs) {
            let gone = value.is_empty() && !client.check(&req.ctx, &[key])?;
            out.push((!gone).then_some(value));
        }
        Ok(out)
    }

    fn add_by(&self, key: &str, delta: i64, deadline: Duration) -> Result<i64, StoreError> {
        let req = Request::new("ADD", std::slice::from_ref(&key), deadline)?;
        self.client_for(&req)?.add(&req.ctx, req.key(), delta)
    }

    fn compare_set_by(
        &self,
        key: &str,
        expected: &[u8],
        desired: &[u8],
        deadline: Duration,
    ) -> Result<Vec<u8>, StoreError> {
        let req = Request::new("COMPARE_SET", std::slice::from_ref(&key), deadline)?;
        check_limits(req.key(), Some(expected))?;
        check_limits(req.key(), Some(desired))?;
        self.client_for(&req)?
            .compare_set(&req.ctx, req.key(), expected, desired)
    }

    fn multi_get_by(&self, keys: &[&str], deadline: Duration) -> Result<Vec<Vec<u8>>, StoreError> {
        let req = Request::new("MULTI_GET", keys, deadline)?;
        self.client_for(&req)?
            .multi_get(&req.ctx, &req.refs(), deadline)?
            .ok_or_else(|| timed_out(self.addr(), keys, deadline))
    }

    fn delete_key_by(&self, key: &str, deadline: Duration) -> Result<bool, StoreError> {
        let req = Request::new("DELETE_KEY", std::slice::from_ref(&key), deadline)?;
        self.client_for(&req)?.delete_key(&req.ctx, req.key())
    }

    fn delete_keys_by(&self, keys: &[&str], deadline: Duration) -> Result<usize, StoreError> {
        let mut existed = 0;
        for batch in keys.chunks(crate::DELETE_BATCH) {
            let req = Request::new("DELETE_KEY", batch, deadline)?;
            existed += self.client_for(&req)?.delete_keys(&req.ctx, &req.refs())?;
        }
        Ok(existed)
    }

    fn num_keys_by(&self, deadline: Duration) -> Result<i64, StoreError> {
        let req = Request::new("GETNUMKEYS", &[], deadline)?;
        self.client_for(&req)?.num_keys(&req.ctx)
    }
}
