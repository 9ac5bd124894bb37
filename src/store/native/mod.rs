//! A TCPStore server and client written in Rust that speak the wire protocol
//! of PyTorch's `c10d::TCPStore` (torch 2.11), so either side can be torch.
//!
//! - [`wire`]: the frame format (opcodes, encoding, hardened decoding);
//! - [`TcpStoreServer`]: the server (`LibUVStoreDaemon` semantics);
//! - `client`: one connection with torch's request logic (`doWait`, ...);
//! - [`TcpStore`]: the [`Store`] users open, the counterpart of
//!   `c10d::TCPStore` (hosts the server when `is_server`).

mod client;
mod server;
pub mod wire;

use std::sync::{Mutex, MutexGuard, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

pub use server::{MAX_CONNECTIONS, TcpStoreServer};

use self::client::{Client, check_limits};
use super::{Store, StoreError, StoreOptions};

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
pub struct TcpStore {
    // Declared before `server` so that it is dropped first: our own
    // connection closes before the server shuts the others down.
    client: Mutex<Client>,
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
    /// (no server in `opts.timeout`), [`StoreError::WorkersTimeout`] (peers
    /// missing after `opts.timeout`), [`StoreError::Io`] (connection lost).
    pub fn open(opts: &StoreOptions) -> Result<Self, StoreError> {
        let server = if opts.is_server {
            Some(TcpStoreServer::bind(opts.port)?)
        } else {
            None
        };
        let port = server.as_ref().map_or(opts.port, TcpStoreServer::port);
        let client = Client::connect(&opts.host, port, opts.timeout)?;
        let store = TcpStore {
            client: Mutex::new(client),
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

    fn client(&self) -> MutexGuard<'_, Client> {
        self.client.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `TCPStore::waitForWorkers`: count ourselves in; the host then polls
    /// the counter until `expected` participants have joined.
    fn join_workers(&self, expected: u32) -> Result<(), StoreError> {
        let mut client = self.client();
        client.add(INIT_KEY, 1)?;
        if self.server.is_none() {
            return Ok(());
        }
        let start = Instant::now();
        loop {
            let joined = match client.get(INIT_KEY, self.timeout)? {
                Some(v) => wire::parse_stoll(&v).unwrap_or(0),
                None => 0,
            };
            if joined >= i64::from(expected) {
                return Ok(());
            }
            let waited = start.elapsed();
            if !self.timeout.is_zero() && waited > self.timeout {
                return Err(StoreError::WorkersTimeout {
                    addr: format!("{}:{}", self.host, self.port),
                    joined,
                    expected,
                    after: waited,
                });
            }
            thread::sleep(JOIN_POLL);
        }
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

fn timed_out(keys: &[&str], after: Duration) -> StoreError {
    StoreError::Timeout {
        keys: keys.iter().map(|k| k.to_string()).collect(),
        after,
    }
}

impl Store for TcpStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        let key = wire_key(key);
        check_limits(&key, Some(value))?;
        self.client().set(&key, value)
    }

    fn get(&self, key: &str) -> Result<Vec<u8>, StoreError> {
        let wkey = wire_key(key);
        check_limits(&wkey, None)?;
        self.client()
            .get(&wkey, self.timeout)?
            .ok_or_else(|| timed_out(&[key], self.timeout))
    }

    fn wait(&self, keys: &[&str], timeout: Duration) -> Result<(), StoreError> {
        let wkeys = wire_keys(keys)?;
        let refs: Vec<&[u8]> = wkeys.iter().map(Vec::as_slice).collect();
        if self.client().wait(&refs, timeout)? {
            Ok(())
        } else {
            Err(timed_out(keys, timeout))
        }
    }

    fn check(&self, keys: &[&str]) -> Result<bool, StoreError> {
        let wkeys = wire_keys(keys)?;
        let refs: Vec<&[u8]> = wkeys.iter().map(Vec::as_slice).collect();
        self.client().check(&refs)
    }

    fn add(&self, key: &str, delta: i64) -> Result<i64, StoreError> {
        let key = wire_key(key);
        check_limits(&key, None)?;
        self.client().add(&key, delta)
    }

    fn compare_set(
        &self,
        key: &str,
        expected: &[u8],
        desired: &[u8],
    ) -> Result<Vec<u8>, StoreError> {
        let key = wire_key(key);
        check_limits(&key, Some(expected))?;
        check_limits(&key, Some(desired))?;
        self.client().compare_set(&key, expected, desired)
    }

    fn multi_get(&self, keys: &[&str]) -> Result<Vec<Vec<u8>>, StoreError> {
        let wkeys = wire_keys(keys)?;
        let refs: Vec<&[u8]> = wkeys.iter().map(Vec::as_slice).collect();
        self.client()
            .multi_get(&refs, self.timeout)?
            .ok_or_else(|| timed_out(keys, self.timeout))
    }

    fn delete_key(&self, key: &str) -> Result<bool, StoreError> {
        let key = wire_key(key);
        check_limits(&key, None)?;
        self.client().delete_key(&key)
    }

    fn num_keys(&self) -> Result<i64, StoreError> {
        self.client().num_keys()
    }

    fn timeout(&self) -> Duration {
        self.timeout
    }
}
