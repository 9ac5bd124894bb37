//! PyTorch's c10d TCPStore in Rust: a blocking key-value store that every
//! process of a run can reach, with the semantics of `c10d::Store`.
//!
//! The examples of the nixl-device-examples crate (which re-exports this
//! crate as `store`) publish agent metadata and descriptor lists through a
//! [`Store`]. Three implementations share the trait:
//!
//! - [`native`]: a TCPStore server and client written in Rust that speak the
//!   wire protocol of PyTorch's `c10d::TCPStore` (torch 2.11), so a Python
//!   `torch.distributed.TCPStore` can sit on the other side. The default.
//! - `libtorch` (cargo feature `libtorch`): `c10d::TCPStore` itself, through a
//!   thin C++ shim.
//! - [`memory`]: an in-process map, for one process.
//!
//! Keys are plain strings (`NIXL_2PROC/target_meta`); the TCP client puts the
//! `/` prefix on the wire as torch's client does. Values are raw bytes.

use std::time::Duration;

#[cfg(feature = "libtorch")]
pub mod libtorch;
pub mod memory;
pub mod native;

/// What can go wrong talking to a store. Each message names the store
/// (`host:port`), the operation and the key(s), and the cause; it says
/// nothing of the program using the store: programs add their own context
/// (which process hosts the store, which flag fixes it).
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// No server answered at `addr` within `waited`.
    #[error(
        "no TCPStore answered at {addr} within {waited:.0?} (connect): nothing listens there yet, or the host or port is wrong"
    )]
    Unreachable {
        /// `host:port` the client tried.
        addr: String,
        /// How long it kept retrying.
        waited: Duration,
    },
    /// The store's host name does not resolve (the resolver says it does
    /// not exist; a resolver that cannot answer now is retried instead).
    #[error("cannot resolve the store's host '{host}'")]
    UnknownHost {
        /// The name as given.
        host: String,
        #[source]
        source: std::io::Error,
    },
    /// The server could not bind its port.
    #[error("cannot listen on {addr}: {source}; another process (an earlier run?) holds the port")]
    Bind {
        /// The address(es) tried, e.g. `[::]:9998 (and 0.0.0.0:9998)`.
        addr: String,
        /// Why (usually `AddrInUse`).
        #[source]
        source: std::io::Error,
    },
    /// Keys did not appear in time.
    #[error(
        "timed out after {after:.0?} waiting for key(s) {keys:?} in the store at {addr} (WAIT): no client set them"
    )]
    Timeout {
        /// `host:port` of the store (`memory` for the in-process one).
        addr: String,
        /// The keys waited for, as the caller named them (no `/` prefix).
        keys: Vec<String>,
        /// The timeout that expired.
        after: Duration,
    },
    /// Not all participants joined a store opened with `num_workers`.
    #[error(
        "only {joined} of {expected} participants joined the store at {addr} within {after:.0?} (ADD \"init/\"): the others never connected"
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
    /// The store took a request but did not answer it (or did not take it,
    /// or an earlier request held the connection) within the request's
    /// deadline: the process hosting the store, or the store itself, is
    /// frozen or overloaded. A frozen process keeps its sockets open, so this
    /// deadline is the only way to notice it. The connection is unusable
    /// afterwards (replies could no longer be matched to requests): later
    /// requests on it fail at once with this same error.
    #[error("{}", no_reply_message(.addr, .op, .keys, *.after, *.stalled))]
    NoReply {
        /// `host:port` of the store.
        addr: String,
        /// The operation, by its c10d wire name: `GET`, `ADD`, `PING`, ...
        op: &'static str,
        /// The keys as the caller named them (no `/` prefix); none for
        /// `GETNUMKEYS` and `PING`.
        keys: Vec<String>,
        /// The deadline that passed.
        after: Duration,
        /// Where the request stalled.
        stalled: Stalled,
    },
    /// The connection broke, e.g. the server exited.
    #[error("lost the connection to the store: {0} (did the process hosting it exit?)")]
    Io(#[from] std::io::Error),
    /// The peer sent something that is not the c10d protocol, or a request
    /// was refused (key or value over the server's limits, ...).
    #[error("store protocol error: {0}")]
    Protocol(String),
    /// A request argument is out of range for the store.
    #[error("invalid store request: {0}")]
    Invalid(String),
}

/// Where a request stalled, in [`StoreError::NoReply`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stalled {
    /// Waiting for the connection, which an earlier request holds.
    Queued,
    /// Writing the request: the store stopped reading its socket and the
    /// buffers are full.
    Sending,
    /// Waiting for the answer.
    Replying,
}

/// `GETNUMKEYS`, `ADD "hb"`, `CHECK ["a", "b"]`.
fn request_name(op: &str, keys: &[String]) -> String {
    match keys {
        [] => op.to_owned(),
        [key] => format!("{op} {key:?}"),
        keys => format!("{op} {keys:?}"),
    }
}

fn no_reply_message(
    addr: &str,
    op: &str,
    keys: &[String],
    after: Duration,
    stalled: Stalled,
) -> String {
    let what = request_name(op, keys);
    let head = match stalled {
        Stalled::Replying => {
            format!("the store at {addr} did not answer {what} within {after:.1?}")
        }
        Stalled::Sending => format!(
            "the store at {addr} stopped reading requests: {what} could not be sent within {after:.1?}"
        ),
        Stalled::Queued => format!(
            "{what} could not be sent to the store at {addr} within {after:.1?}: an earlier request holds the connection \
             (one the store never answered, or a long wait on the same handle)"
        ),
    };
    format!(
        "{head}. The process hosting the store, or the store itself, is frozen or overloaded \
         (stopped with SIGSTOP or Ctrl-Z, paused in a debugger, in a paused container): \
         check that process, or give requests a longer deadline if it is only slow"
    )
}

impl StoreError {
    /// A copy of a [`StoreError::NoReply`], which a broken connection
    /// returns for every later request; `None` for other errors.
    pub(crate) fn replay(&self) -> Option<StoreError> {
        match self {
            StoreError::NoReply {
                addr,
                op,
                keys,
                after,
                stalled,
            } => Some(StoreError::NoReply {
                addr: addr.clone(),
                op,
                keys: keys.clone(),
                after: *after,
                stalled: *stalled,
            }),
            _ => None,
        }
    }
}

/// Blocking key-value store with the semantics of `c10d::Store`.
///
/// All methods may block; `get` and `wait` block until the keys exist or the
/// timeout passes ([`StoreError::Timeout`]). Implementations are shared
/// between threads.
///
/// Every request has a deadline: the TCP stores give each wire request
/// [`Store::timeout`] (the binaries' `--timeout`) to be written and answered,
/// and fail with [`StoreError::NoReply`] naming the store, the operation and
/// the key when the store stays silent — a frozen peer keeps its sockets
/// open, so without it nothing would ever fail. [`Store::with_deadline`]
/// gives the same store with a shorter (or longer) deadline, for liveness
/// probes that must not wait the whole run timeout. `Duration::ZERO` means
/// no deadline (torch's `kNoTimeout`).
pub trait Store: Send + Sync {
    /// Sets `key` to `value`, replacing any earlier value; wakes waiters.
    /// There is no reply: the deadline bounds writing the request, which
    /// blocks only once a silent store's socket buffers are full.
    fn set(&self, key: &str, value: &[u8]) -> Result<(), StoreError>;
    /// Waits (up to [`Store::timeout`]) for `key`, then returns its value.
    /// Worst case against a silent store: the timeout for the key, then the
    /// deadline for the answer to cancelling that wait.
    fn get(&self, key: &str) -> Result<Vec<u8>, StoreError>;
    /// Waits until every key exists, for at most `timeout`
    /// (`Duration::ZERO`: no limit, torch's `kNoTimeout`). A wait that times
    /// out is cancelled (torch's CANCEL_WAIT), and that answer has the
    /// request deadline.
    fn wait(&self, keys: &[&str], timeout: Duration) -> Result<(), StoreError>;
    /// Whether every key exists now, without waiting.
    fn check(&self, keys: &[&str]) -> Result<bool, StoreError>;
    /// `key`'s value if it exists now, `None` if not: never waits for the
    /// key. A key deleted by another client between this client's look and
    /// its read reads as `None` (a plain CHECK then GET would wait the
    /// whole deadline for it, holding the connection).
    fn try_get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError>;
    /// Each key's value if it exists now, `None` for each that does not,
    /// in order: [`Store::try_get`] for many keys at once, never waiting
    /// for one. A [`Store::multi_get`] after a CHECK would wait the whole
    /// deadline for a key deleted in between, holding the connection (and
    /// every request of this client queued behind it) all that time.
    fn try_multi_get(&self, keys: &[&str]) -> Result<Vec<Option<Vec<u8>>>, StoreError>;
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
    /// Deletes every key of `keys`; returns how many existed. The native
    /// client pipelines the requests (one round trip per batch of
    /// [`DELETE_BATCH`] rather than one per key); other backends delete
    /// one by one.
    fn delete_keys(&self, keys: &[&str]) -> Result<usize, StoreError>;
    /// Number of keys in the store (torch counts its internal `init/` key too).
    fn num_keys(&self) -> Result<i64, StoreError>;
    /// The default timeout of `get` and `multi_get`, and the deadline of
    /// every request.
    fn timeout(&self) -> Duration;
    /// This store (same connection, same keys) with `deadline` in place of
    /// [`Store::timeout`]: every request through the view must be written
    /// and answered within `deadline`, and its `get`/`multi_get` wait at
    /// most `deadline` for their keys (its `timeout()` is `deadline`).
    ///
    /// Meant for quick liveness probes, e.g. a heartbeat
    /// `store.with_deadline(Duration::from_secs(2)).add("hb", 1)`, which
    /// fails with [`StoreError::NoReply`] after 2 s instead of the run's
    /// timeout when the store is frozen. Requests share one connection, so a
    /// probe queued behind another request also gives up after `deadline`
    /// ([`Stalled::Queued`]).
    fn with_deadline(&self, deadline: Duration) -> Box<dyn Store + '_>;
}

/// The backends' side of [`Store`]: every request takes its deadline
/// explicitly. The blanket [`Store`] impl passes [`Store::timeout`]; the
/// view of [`Store::with_deadline`] passes its own.
pub(crate) trait Bounded: Send + Sync {
    /// The store's own timeout: `get`'s wait and every request's deadline.
    fn default_deadline(&self) -> Duration;
    fn set_by(&self, key: &str, value: &[u8], deadline: Duration) -> Result<(), StoreError>;
    /// `get`, waiting at most `deadline` for the key as well.
    fn get_by(&self, key: &str, deadline: Duration) -> Result<Vec<u8>, StoreError>;
    fn wait_by(
        &self,
        keys: &[&str],
        timeout: Duration,
        deadline: Duration,
    ) -> Result<(), StoreError>;
    fn check_by(&self, keys: &[&str], deadline: Duration) -> Result<bool, StoreError>;
    /// [`Store::try_get`]. This default (CHECK, then a GET that waits at
    /// most `deadline`) serves the backends that cannot read without
    /// waiting; the native client does better.
    fn try_get_by(&self, key: &str, deadline: Duration) -> Result<Option<Vec<u8>>, StoreError> {
        if !self.check_by(&[key], deadline)? {
            return Ok(None);
        }
        match self.get_by(key, deadline) {
            Ok(v) => Ok(Some(v)),
            Err(StoreError::Timeout { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }
    /// [`Store::try_multi_get`]. This default reads key by key
    /// ([`Bounded::try_get_by`]); the native client reads them all in one
    /// request.
    fn try_multi_get_by(
        &self,
        keys: &[&str],
        deadline: Duration,
    ) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
        keys.iter().map(|k| self.try_get_by(k, deadline)).collect()
    }
    fn add_by(&self, key: &str, delta: i64, deadline: Duration) -> Result<i64, StoreError>;
    fn compare_set_by(
        &self,
        key: &str,
        expected: &[u8],
        desired: &[u8],
        deadline: Duration,
    ) -> Result<Vec<u8>, StoreError>;
    /// `multi_get`, waiting at most `deadline` for the keys as well.
    fn multi_get_by(&self, keys: &[&str], deadline: Duration) -> Result<Vec<Vec<u8>>, StoreError>;
    fn delete_key_by(&self, key: &str, deadline: Duration) -> Result<bool, StoreError>;
    /// [`Store::delete_keys`]; this default deletes one by one, each within
    /// `deadline`.
    fn delete_keys_by(&self, keys: &[&str], deadline: Duration) -> Result<usize, StoreError> {
        let mut existed = 0;
        for k in keys {
            existed += usize::from(self.delete_key_by(k, deadline)?);
        }
        Ok(existed)
    }
    fn num_keys_by(&self, deadline: Duration) -> Result<i64, StoreError>;
}

/// How many DELETE_KEY requests the native client writes before it reads
/// their answers ([`Store::delete_keys`]): few enough that the answers
/// (8 bytes each) never fill a socket buffer while requests still go out.
pub const DELETE_BATCH: usize = 256;

/// What the blanket [`Store`] impl needs: a [`Bounded`] backend and the
/// deadline to give its requests. Implemented by every backend (its own
/// timeout) and by the view of [`Store::with_deadline`].
trait Deadlined: Send + Sync {
    type Backend: Bounded;
    fn backend(&self) -> &Self::Backend;
    fn deadline(&self) -> Duration;
}

impl<B: Bounded> Deadlined for B {
    type Backend = B;
    fn backend(&self) -> &B {
        self
    }
    fn deadline(&self) -> Duration {
        self.default_deadline()
    }
}

/// The view [`Store::with_deadline`] returns.
struct Within<'a, B> {
    backend: &'a B,
    deadline: Duration,
}

impl<B: Bounded> Deadlined for Within<'_, B> {
    type Backend = B;
    fn backend(&self) -> &B {
        self.backend
    }
    fn deadline(&self) -> Duration {
        self.deadline
    }
}

impl<T: Deadlined> Store for T {
    fn set(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        self.backend().set_by(key, value, self.deadline())
    }
    fn get(&self, key: &str) -> Result<Vec<u8>, StoreError> {
        self.backend().get_by(key, self.deadline())
    }
    fn wait(&self, keys: &[&str], timeout: Duration) -> Result<(), StoreError> {
        self.backend().wait_by(keys, timeout, self.deadline())
    }
    fn check(&self, keys: &[&str]) -> Result<bool, StoreError> {
        self.backend().check_by(keys, self.deadline())
    }
    fn try_get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.backend().try_get_by(key, self.deadline())
    }
    fn try_multi_get(&self, keys: &[&str]) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
        self.backend().try_multi_get_by(keys, self.deadline())
    }
    fn add(&self, key: &str, delta: i64) -> Result<i64, StoreError> {
        self.backend().add_by(key, delta, self.deadline())
    }
    fn compare_set(
        &self,
        key: &str,
        expected: &[u8],
        desired: &[u8],
    ) -> Result<Vec<u8>, StoreError> {
        self.backend()
            .compare_set_by(key, expected, desired, self.deadline())
    }
    fn multi_get(&self, keys: &[&str]) -> Result<Vec<Vec<u8>>, StoreError> {
        self.backend().multi_get_by(keys, self.deadline())
    }
    fn delete_key(&self, key: &str) -> Result<bool, StoreError> {
        self.backend().delete_key_by(key, self.deadline())
    }
    fn delete_keys(&self, keys: &[&str]) -> Result<usize, StoreError> {
        self.backend().delete_keys_by(keys, self.deadline())
    }
    fn num_keys(&self) -> Result<i64, StoreError> {
        self.backend().num_keys_by(self.deadline())
    }
    fn timeout(&self) -> Duration {
        self.deadline()
    }
    fn with_deadline(&self, deadline: Duration) -> Box<dyn Store + '_> {
        Box::new(Within {
            backend: self.backend(),
            deadline,
        })
    }
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
