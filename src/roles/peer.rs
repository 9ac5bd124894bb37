//! The store as seen by one role: waits that notice when the peer gave up,
//! died, or this process was interrupted.
//!
//! Three ways a wait ends early, each with its own message:
//! - the peer published [`keys::ABORT`] with its error;
//! - the peer's heartbeat (a counter it bumps every [`BEAT`]) stood still for
//!   [`DEAD_AFTER`]: it was killed or hangs;
//! - this process received SIGINT/SIGTERM ([`crate::interrupt`]).

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};

use super::keys;
use crate::store::{Store, StoreError};

/// How often each side bumps its heartbeat counter.
pub const BEAT: Duration = Duration::from_millis(250);
/// A heartbeat that has not moved for this long means the peer is gone.
pub const DEAD_AFTER: Duration = Duration::from_secs(3);

/// One side's handle on the shared store.
pub struct Peer<'a> {
    pub store: &'a dyn Store,
    /// Our role, for messages ("initiator" / "target").
    pub me: &'static str,
    /// The other role.
    pub peer: &'static str,
    pub timeout: Duration,
    /// The peer's heartbeat as last read, and when it last moved.
    seen: Mutex<Option<(i64, Instant)>>,
}

impl<'a> Peer<'a> {
    pub fn new(
        store: &'a dyn Store,
        me: &'static str,
        peer: &'static str,
        timeout: Duration,
    ) -> Self {
        Self {
            store,
            me,
            peer,
            timeout,
            seen: Mutex::new(None),
        }
    }

    /// Runs `work` while a scoped thread bumps our heartbeat every [`BEAT`].
    pub fn with_heartbeat<T>(&self, work: impl FnOnce() -> T) -> T {
        let stop = AtomicBool::new(false);
        let key = keys::alive(self.me);
        std::thread::scope(|s| {
            s.spawn(|| {
                while !stop.load(Ordering::Relaxed) {
                    if self.store.add(&key, 1).is_err() {
                        break; // store gone; the waits will say so
                    }
                    std::thread::sleep(BEAT);
                }
            });
            let out = work();
            stop.store(true, Ordering::Relaxed);
            out
        })
    }

    /// Waits for `key` and returns its value. Fails early, with the reason,
    /// if the peer gave up or died or we were interrupted; names the peer
    /// when it never comes.
    pub fn get(&self, key: &str, what: &str) -> Result<Vec<u8>> {
        let start = Instant::now();
        let slice = Duration::from_millis(100).min(self.timeout);
        loop {
            match self.store.wait(&[key], slice) {
                Ok(()) => return Ok(self.store.get(key)?),
                Err(StoreError::Timeout { .. }) => {}
                Err(e) => bail!("waiting for the {} {what}: {e}", self.peer),
            }
            if let Some(why) = self.probe() {
                bail!("{why}");
            }
            if start.elapsed() >= self.timeout {
                bail!(
                    "the {} did not publish its {what} (key {key}) within {:?}: is it running, on the same --host/--port? \
                     (raise --timeout if it is just slow)",
                    self.peer,
                    self.timeout
                );
            }
        }
    }

    /// A reason to stop waiting now, if any: interrupted, the peer aborted,
    /// the peer's heartbeat stopped, or the store is gone.
    pub fn probe(&self) -> Option<String> {
        if let Some(sig) = crate::interrupt::received() {
            return Some(sig.to_string());
        }
        match self.store.check(&[keys::ABORT]) {
            Ok(false) => {}
            Ok(true) => {
                let why = self.store.get(keys::ABORT).unwrap_or_default();
                return Some(format!(
                    "the {} gave up: {}",
                    self.peer,
                    String::from_utf8_lossy(&why)
                ));
            }
            Err(e) => {
                return Some(format!(
                    "lost the store ({e}): the {} probably exited",
                    self.peer
                ));
            }
        }
        self.peer_gone()
    }

    /// `Some(message)` when the peer's heartbeat has not moved for
    /// [`DEAD_AFTER`] (after having been seen at least once).
    fn peer_gone(&self) -> Option<String> {
        // ADD 0 reads the counter without waiting for it to exist.
        let beat = self.store.add(&keys::alive(self.peer), 0).ok()?;
        let mut seen = self.seen.lock().unwrap();
        match *seen {
            Some((v, _)) if v != beat => *seen = Some((beat, Instant::now())),
            None if beat > 0 => *seen = Some((beat, Instant::now())),
            Some((_, t)) if t.elapsed() > DEAD_AFTER => {
                return Some(format!(
                    "the {} stopped responding (no heartbeat for {:.0?}): it was killed or hangs",
                    self.peer,
                    t.elapsed()
                ));
            }
            _ => {}
        }
        None
    }

    /// Tells the peer we failed, best effort.
    pub fn abort(&self, why: &str) {
        let _ = self
            .store
            .set(keys::ABORT, format!("{}: {why}", self.me).as_bytes());
    }

    pub fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        Ok(self.store.set(key, value)?)
    }

    /// Deletes keys, ignoring errors (cleanup).
    pub fn delete(&self, keys: &[&str]) {
        for k in keys {
            let _ = self.store.delete_key(k);
        }
    }
}
