//! A store that goes silent: it completes the c10d handshake (VALIDATE, then
//! PING answered with its nonce) exactly as a TCPStore server does, relays
//! the next `answered` requests of each connection to a real
//! [`TcpStoreServer`] (so their replies are genuine), and then neither reads
//! nor answers anything more on that connection, as a process stopped with
//! SIGSTOP behaves: its sockets stay open and its kernel keeps accepting
//! connections and bytes until the buffers are full. [`SilentStore::mute`]
//! does not even answer the PING (a store frozen before the peer connected).

use std::io::{self, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use tcpstore::native::TcpStoreServer;
use tcpstore::native::wire::{self, Limits, Request};

/// Streams and threads that live until the silent store is dropped.
#[derive(Default)]
struct Held {
    streams: Vec<TcpStream>,
    threads: Vec<JoinHandle<()>>,
}

/// See the module docs. Dropping it closes every connection and ends every
/// thread it started.
pub struct SilentStore {
    port: u16,
    stop: Arc<AtomicBool>,
    held: Arc<Mutex<Held>>,
    acceptor: Option<JoinHandle<()>>,
    // Dropped after the relays are shut down (field order).
    _upstream: Option<TcpStoreServer>,
}

impl SilentStore {
    /// Listens on 127.0.0.1 (ephemeral port). Every connection gets its
    /// first `answered` requests after the PING answered, then silence.
    pub fn start(answered: usize) -> Self {
        Self::listen(Some(answered))
    }

    /// Accepts connections but reads and answers nothing, not even the
    /// handshake's PING.
    pub fn mute() -> Self {
        Self::listen(None)
    }

    fn listen(answered: Option<usize>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the silent store");
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let upstream = (answered.unwrap_or(0) > 0).then(|| TcpStoreServer::bind(0).unwrap());
        let upstream_port = upstream.as_ref().map(TcpStoreServer::port);
        let stop = Arc::new(AtomicBool::new(false));
        let held = Arc::new(Mutex::new(Held::default()));
        let acceptor = {
            let (stop, held) = (stop.clone(), held.clone());
            thread::spawn(move || accept_loop(&listener, &stop, &held, answered, upstream_port))
        };
        Self {
            port,
            stop,
            held,
            acceptor: Some(acceptor),
            _upstream: upstream,
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}

impl Drop for SilentStore {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(a) = self.acceptor.take() {
            let _ = a.join();
        }
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        for s in held.streams.drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
        let threads: Vec<_> = held.threads.drain(..).collect();
        drop(held);
        for t in threads {
            let _ = t.join();
        }
    }
}

fn accept_loop(
    listener: &TcpListener,
    stop: &AtomicBool,
    held: &Arc<Mutex<Held>>,
    answered: Option<usize>,
    upstream: Option<u16>,
) {
    while !stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((conn, _)) => {
                conn.set_nonblocking(false).unwrap();
                let Some(answered) = answered else {
                    lock(held).streams.push(conn);
                    continue;
                };
                let held2 = held.clone();
                let t = thread::spawn(move || {
                    // A client that gives up mid-handshake is no failure here.
                    let _ = serve(conn, &held2, answered, upstream);
                });
                lock(held).threads.push(t);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                thread::sleep(Duration::from_millis(5));
            }
            Err(e) => panic!("silent store accept: {e}"),
        }
    }
}

fn lock(held: &Mutex<Held>) -> std::sync::MutexGuard<'_, Held> {
    held.lock().unwrap_or_else(PoisonError::into_inner)
}

fn bad(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

/// One connection: handshake, relay `answered` requests, then hold the
/// socket open without reading it.
fn serve(
    mut conn: TcpStream,
    held: &Arc<Mutex<Held>>,
    answered: usize,
    upstream: Option<u16>,
) -> io::Result<()> {
    let limits = Limits::LIBUV;
    match Request::read_from(&mut conn, &limits).map_err(|e| bad(e.to_string()))? {
        Request::Validate { magic } if magic == wire::VALIDATION_MAGIC => {}
        other => return Err(bad(format!("expected VALIDATE, got {:?}", other.op()))),
    }
    match Request::read_from(&mut conn, &limits).map_err(|e| bad(e.to_string()))? {
        Request::Ping { nonce } => conn.write_all(&nonce.to_le_bytes())?,
        other => return Err(bad(format!("expected PING, got {:?}", other.op()))),
    }
    lock(held).streams.push(conn.try_clone()?);
    let Some(port) = upstream else {
        return Ok(());
    };
    let mut up = TcpStream::connect(("127.0.0.1", port))?;
    up.set_nodelay(true)?;
    let mut frame = Vec::new();
    Request::Validate {
        magic: wire::VALIDATION_MAGIC,
    }
    .encode(&mut frame);
    up.write_all(&frame)?;
    lock(held).streams.push(up.try_clone()?);
    // Replies flow back untouched until the store is dropped.
    let (mut from, mut to) = (up.try_clone()?, conn.try_clone()?);
    let pump = thread::spawn(move || {
        let _ = io::copy(&mut from, &mut to);
    });
    lock(held).threads.push(pump);
    for _ in 0..answered {
        let req = Request::read_from(&mut conn, &limits).map_err(|e| bad(e.to_string()))?;
        frame.clear();
        req.encode(&mut frame);
        up.write_all(&frame)?;
    }
    Ok(())
}
