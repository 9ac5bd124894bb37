//! The metadata exchange: a key-value store both processes can reach.
//!
//! Every two-process example publishes agent metadata and descriptor lists
//! through a [`Store`]. Three implementations share the trait:
//!
//! - [`native`]: a TCPStore server and client written in Rust that speak the
//!   wire protocol of PyTorch's `c10d::TCPStore` (torch 2.11), so a Python
//!   `torch.distributed.TCPStore` can sit on the other side. The default.
//! - `libtorch` (cargo feature `libtorch`): `c10d::TCPStore` itself, through a
//!   thin C++ shim.
//! - [`memory`]: an in-process map for single-process examples.
//!
//! Keys are plain strings (`NIXL_2PROC/target_meta`); the TCP client puts the
//! `/` prefix on the wire as torch's client does. Values are raw bytes.

use std::time::Duration;

#[cfg(feature = "libtorch")]
pub mod libtorch;
pub mod memory;
pub mod native;

/// What can go wrong talking to a store. Each message names the cause and
/// the usual fix, because these surface directly to users of the examples.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// No server answered at `addr` within `waited`.
    #[error(
        "no TCPStore at {addr} after {waited:.0?}: start the side that hosts the store first (the initiator), or check --host/--port"
    )]
    Unreachable {
        /// `host:port` the client tried.
        addr: String,
        /// How long it kept retrying.
        waited: Duration,
    },
    /// The server could not bind its port.
    #[error(
        "cannot listen on {addr}: {source}; another process (an earlier run?) holds the port: stop it or pick another with --port"
    )]
    Bind {
        /// The address(es) tried, e.g. `[::]:9998 (and 0.0.0.0:9998)`.
        addr: String,
        /// Why (usually `AddrInUse`).
        #[source]
        source: std::io::Error,
    },
    /// Keys did not appear in time.
    #[error(
        "timed out after {after:.0?} waiting for key(s) {keys:?}: the peer never published them (is it running, and on the same --host/--port?)"
    )]
    Timeout {
        /// The keys waited for, as the caller named them (no `/` prefix).
        keys: Vec<String>,
        /// The timeout that expired.
        after: Duration,
    },
    /// Not all participants joined a store opened with `num_workers`.
    #[error(
        "only {joined} of {expected} participants joined the store at {addr} within {after:.0?}: start the peer process"
    )]
    WorkersTimeout {
        /// `host:port` of the store.
        addr: String,
        /// Participants counted in `init/` at the last look.
        joined: i64,
        /// `num_workers`.
        expected: u32,
        /// How long the host waited.
        after: Duration,
    },
    /// The connection broke, e.g. the server exited.
    #[error("lost the connection to the store: {0} (did the peer that hosts it exit?)")]
    Io(#[from] std::io::Error),
    /// The peer sent something that is not the c10d protocol, or a request
    /// was refused (key or value over the server's limits, ...).
    #[error("store protocol error: {0}")]
    Protocol(String),
    /// A request argument is out of range for the store.
    #[error("invalid store request: {0}")]
    Invalid(String),
}

/// Blocking key-value store with the semantics of `c10d::Store`.
///
/// All methods may block; `get` and `wait` block until the keys exist or the
/// timeout passes ([`StoreError::Timeout`]). Implementations are shared
/// between threads.
pub trait Store: Send + Sync {
    /// Sets `key` to `value`, replacing any earlier value; wakes waiters.
    fn set(&self, key: &str, value: &[u8]) -> Result<(), StoreError>;
    /// Waits (up to [`Store::timeout`]) for `key`, then returns its value.
    fn get(&self, key: &str) -> Result<Vec<u8>, StoreError>;
    /// Waits until every key exists, for at most `timeout`
    /// (`Duration::ZERO`: no limit, torch's `kNoTimeout`).
    fn wait(&self, keys: &[&str], timeout: Duration) -> Result<(), StoreError>;
    /// Whether every key exists now, without waiting.
    fn check(&self, keys: &[&str]) -> Result<bool, StoreError>;
    /// Adds `delta` to the integer stored (as decimal ASCII) at `key`,
    /// creating it at 0; returns the new value.
    fn add(&self, key: &str, delta: i64) -> Result<i64, StoreError>;
    /// Sets `key` to `desired` if its value is `expected` (or if it is absent
    /// and `expected` is empty); returns the value now stored.
    fn compare_set(
        &self,
        key: &str,
        expected: &[u8],
        desired: &[u8],
    ) -> Result<Vec<u8>, StoreError>;
    /// Waits for all keys, then returns their values in order.
    fn multi_get(&self, keys: &[&str]) -> Result<Vec<Vec<u8>>, StoreError>;
    /// Deletes `key`; returns whether it existed.
    fn delete_key(&self, key: &str) -> Result<bool, StoreError>;
    /// Number of keys in the store (torch counts its internal `init/` key too).
    fn num_keys(&self) -> Result<i64, StoreError>;
    /// The default timeout of `get` and `multi_get`.
    fn timeout(&self) -> Duration;
}

/// How to open a TCP store, mirroring `c10d::TCPStoreOptions`.
#[derive(Clone, Debug)]
pub struct StoreOptions {
    /// Host to connect to (clients) — the server always listens on all
    /// interfaces (`::`, else `0.0.0.0`) as torch's does.
    pub host: String,
    /// TCP port; 9998 in the examples.
    pub port: u16,
    /// Host the server in this process (torch's `is_master`).
    pub is_server: bool,
    /// Number of participants, the server's own client included. With
    /// `wait_workers`, every participant counts itself in (`ADD init/ 1`)
    /// and opening the server blocks until all have joined. Without
    /// `wait_workers` it has no effect (as in torch, nobody counts in).
    pub num_workers: Option<u32>,
    /// See `num_workers`.
    pub wait_workers: bool,
    /// Connect timeout, join timeout and default `get` timeout.
    pub timeout: Duration,
}

impl StoreOptions {
    /// A client of the store at `host:port` that counts no workers.
    pub fn client(host: &str, port: u16, timeout: Duration) -> Self {
        Self {
            host: host.to_string(),
            port,
            is_server: false,
            num_workers: None,
            wait_workers: false,
            timeout,
        }
    }

    /// A server on `port` (0: any free port) that counts no workers.
    pub fn server(port: u16, timeout: Duration) -> Self {
        Self {
            is_server: true,
            ..Self::client("127.0.0.1", port, timeout)
        }
    }

    /// The options upstream's `simple_write` uses: 127.0.0.1:9998,
    /// `numWorkers=2`, `waitWorkers=true`, 30 s.
    pub fn two_process(is_server: bool) -> Self {
        Self {
            host: "127.0.0.1".into(),
            port: 9998,
            is_server,
            num_workers: Some(2),
            wait_workers: true,
            timeout: Duration::from_secs(30),
        }
    }
}

/// Which TCP store implementation to open.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum StoreBackend {
    /// [`native`]: Rust client and server speaking the c10d wire protocol.
    #[default]
    Native,
    /// `c10d::TCPStore` from libtorch (cargo feature `libtorch`).
    Libtorch,
}

/// Opens a TCP store (server or client per `opts.is_server`).
///
/// Errors: [`StoreError::Bind`] if the port is taken, [`StoreError::Unreachable`]
/// if no server answers in `opts.timeout`, [`StoreError::WorkersTimeout`] if
/// `wait_workers` and the peers do not join, [`StoreError::Invalid`] if the
/// libtorch backend was not compiled in.
pub fn open(backend: StoreBackend, opts: &StoreOptions) -> Result<Box<dyn Store>, StoreError> {
    match backend {
        StoreBackend::Native => Ok(Box::new(native::TcpStore::open(opts)?)),
        #[cfg(feature = "libtorch")]
        StoreBackend::Libtorch => Ok(Box::new(libtorch::TorchStore::open(opts)?)),
        #[cfg(not(feature = "libtorch"))]
        StoreBackend::Libtorch => Err(StoreError::Invalid(
            "this binary was built without the libtorch store: rebuild with `--features libtorch`"
                .into(),
        )),
    }
}
