//! An in-process store for single-process examples.
//!
//! The semantics are those of a torch TCPStore client talking to torch's
//! server (`add` stores decimal ASCII, `compare_set` on a missing key with a
//! non-empty `expected` returns `expected` and stores nothing, `num_keys`
//! counts every key), minus the network: no size limits, and a waiter is only
//! released once its keys really exist.

use std::collections::HashMap;
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use super::native::wire::parse_stoll;
use super::{Bounded, StoreError};

/// A [`Store`](super::Store) in this process's memory: a map behind a mutex, with a condvar
/// waking waiters on every change. Share it between threads with `Arc`.
pub struct MemoryStore {
    map: Mutex<HashMap<String, Vec<u8>>>,
    changed: Condvar,
    timeout: Duration,
}

impl MemoryStore {
    /// An empty store whose `get`/`multi_get` wait at most `timeout`
    /// (`Duration::ZERO`: no limit, like torch's `kNoTimeout`).
    pub fn new(timeout: Duration) -> Self {
        Self {
            map: Mutex::new(HashMap::new()),
            changed: Condvar::new(),
            timeout,
        }
    }

    /// Every key stored now, sorted: what a test names when keys were left
    /// behind.
    pub fn keys(&self) -> Vec<String> {
        let mut keys: Vec<String> = self.map().keys().cloned().collect();
        keys.sort();
        keys
    }

    fn map(&self) -> MutexGuard<'_, HashMap<String, Vec<u8>>> {
        self.map.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits until every key exists; returns the guard so callers can read
    /// the values atomically.
    fn wait_for(
        &self,
        keys: &[&str],
        timeout: Duration,
    ) -> Result<MutexGuard<'_, HashMap<String, Vec<u8>>>, StoreError> {
        let deadline = (!timeout.is_zero()).then(|| Instant::now() + timeout);
        let mut map = self.map();
        while !keys.iter().all(|k| map.contains_key(*k)) {
            map = match deadline {
                None => self
                    .changed
                    .wait(map)
                    .unwrap_or_else(PoisonError::into_inner),
                Some(deadline) => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Err(StoreError::Timeout {
                            addr: "memory".into(),
                            keys: keys.iter().map(|k| k.to_string()).collect(),
                            after: timeout,
                        });
                    }
                    self.changed
                        .wait_timeout(map, left)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0
                }
            };
        }
        Ok(map)
    }
}

impl Default for MemoryStore {
    /// Torch's default store timeout, 300 s.
    fn default() -> Self {
        Self::new(Duration::from_secs(300))
    }
}

/// Requests never stall here (no peer, no socket): deadlines only bound how
/// long `get` and `multi_get` wait for their keys.
impl Bounded for MemoryStore {
    fn default_deadline(&self) -> Duration {
        self.timeout
    }

    fn set_by(&self, key: &str, value: &[u8], _: Duration) -> Result<(), StoreError> {
        self.map().insert(key.to_owned(), value.to_vec());
        self.changed.notify_all();
        Ok(())
    }

    fn get_by(&self, key: &str, deadline: Duration) -> Result<Vec<u8>, StoreError> {
        let map = self.wait_for(&[key], deadline)?;
        Ok(map[key].clone())
    }

    fn wait_by(&self, keys: &[&str], timeout: Duration, _: Duration) -> Result<(), StoreError> {
        self.wait_for(keys, timeout).map(drop)
    }

    fn check_by(&self, keys: &[&str], _: Duration) -> Result<bool, StoreError> {
        let map = self.map();
        Ok(keys.iter().all(|k| map.contains_key(*k)))
    }

    /// Under one lock: a key is there or not, never half-deleted.
    fn try_get_by(&self, key: &str, _: Duration) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.map().get(key).cloned())
    }

    fn try_multi_get_by(
        &self,
        keys: &[&str],
        _: Duration,
    ) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
        let map = self.map();
        Ok(keys.iter().map(|k| map.get(*k).cloned()).collect())
    }

    fn add_by(&self, key: &str, delta: i64, _: Duration) -> Result<i64, StoreError> {
        let mut map = self.map();
        let now = match map.get(key) {
            None => delta,
            Some(old) => parse_stoll(old).and_then(|n| n.checked_add(delta)).ok_or_else(|| {
                StoreError::Protocol(format!(
                    "add({key:?}, {delta}): the stored value {:?} is not a decimal integer, or the sum overflows i64",
                    String::from_utf8_lossy(old)
                ))
            })?,
        };
        map.insert(key.to_owned(), now.to_string().into_bytes());
        self.changed.notify_all();
        Ok(now)
    }

    fn compare_set_by(
        &self,
        key: &str,
        expected: &[u8],
        desired: &[u8],
        _: Duration,
    ) -> Result<Vec<u8>, StoreError> {
        let mut map = self.map();
        let now = match map.get_mut(key) {
            None if expected.is_empty() => {
                map.insert(key.to_owned(), desired.to_vec());
                self.changed.notify_all();
                desired.to_vec()
            }
            None => expected.to_vec(),
            Some(current) => {
                if current == expected {
                    *current = desired.to_vec();
                    self.changed.notify_all();
                }
                current.clone()
            }
        };
        Ok(now)
    }

    fn multi_get_by(&self, keys: &[&str], deadline: Duration) -> Result<Vec<Vec<u8>>, StoreError> {
        let map = self.wait_for(keys, deadline)?;
        Ok(keys.iter().map(|k| map[*k].clone()).collect())
    }

    fn delete_key_by(&self, key: &str, _: Duration) -> Result<bool, StoreError> {
        Ok(self.map().remove(key).is_some())
    }

    fn num_keys_by(&self, _: Duration) -> Result<i64, StoreError> {
        Ok(self.map().len() as i64)
    }
}
