//! The store as one role sees it: typed reads and writes of
//! [`super::protocol`] entries, and waits that end early, with
//! the reason, when the other side can no longer answer.
//!
//! A wait for the peer ends early when:
//! - the peer published [`protocol::abort`] with its error;
//! - the peer's heartbeat (a counter it bumps every [`BEAT`]) stood still
//!   for [`SILENT_AFTER`]: it was killed, or it is frozen (SIGSTOP, a
//!   debugger, a paused container) even though its sockets stay open;
//! - the store stopped answering within [`SILENT_AFTER`]: the process that
//!   hosts it is frozen or gone;
//! - this process received SIGINT/SIGTERM ([`crate::interrupt`]).

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};

use super::protocol::{self, Abort, Entry, Marker, Role, Value};
use crate::deadline::{Pace, poll};
use crate::store::{Store, StoreError};

/// How often each side bumps its heartbeat counter.
pub const BEAT: Duration = Duration::from_millis(250);
/// A heartbeat that has not moved for this long, or a store that has not
/// answered for this long, means the peer is gone or frozen.
pub const SILENT_AFTER: Duration = Duration::from_secs(3);

/// One role's handle on the shared store.
pub struct Session<'a> {
    store: &'a dyn Store,
    /// The same connection with [`SILENT_AFTER`] as every request's
    /// deadline: probes and heartbeats must not wait the run's timeout.
    quick: Box<dyn Store + 'a>,
    /// Our role.
    pub me: Role,
    /// Every wait's limit.
    pub timeout: Duration,
    /// The peer's heartbeat as last read, and when it last moved.
    seen: Mutex<Option<(i64, Instant)>>,
}

impl<'a> Session<'a> {
    pub fn new(store: &'a dyn Store, me: Role, timeout: Duration) -> Self {
        Self {
            store,
            quick: store.with_deadline(SILENT_AFTER.min(timeout)),
            me,
            timeout,
            seen: Mutex::new(None),
        }
    }

    /// The other role.
    pub fn peer(&self) -> Role {
        self.me.peer()
    }

    /// Writes `value` under `entry`.
    pub fn put<T: Value>(&self, entry: &Entry<T>, value: &T) -> Result<()> {
        Ok(self.store.set(entry.key(), &entry.encode(value))?)
    }

    /// Writes a [`Marker`].
    pub fn mark(&self, entry: &Entry<Marker>) -> Result<()> {
        self.put(entry, &Marker)
    }

    /// Waits for `entry` and returns its value. Fails early, with the
    /// reason, if the peer gave up, died, froze, or we were interrupted;
    /// names the peer and the value (`what`) when it never comes.
    pub fn get<T: Value>(&self, entry: &Entry<T>, what: &str) -> Result<T> {
        let slice = Duration::from_millis(100).min(self.timeout);
        let peer = self.peer();
        poll(
            self.timeout,
            Pace::Every(Duration::ZERO),
            || {
                match self.store.wait(&[entry.key()], slice) {
                    Ok(()) => return Ok(Some(entry.decode(&self.store.get(entry.key())?)?)),
                    Err(StoreError::Timeout { .. }) => {}
                    Err(e) => bail!("waiting for the {peer}'s {what}: {e}"),
                }
                match self.probe() {
                    Some(why) => bail!("{why}"),
                    None => Ok(None),
                }
            },
            |waited| {
                anyhow::anyhow!(
                    "the {peer} did not publish its {what} (key {}) within {waited:.0?}: is it running, on the same \
                     --host/--port? (raise --timeout if it is just slow)",
                    entry.key()
                )
            },
        )
    }

    /// A reason to stop waiting now, if any: interrupted, the peer aborted,
    /// the peer's heartbeat stopped, or the store is gone or silent.
    pub fn probe(&self) -> Option<String> {
        if let Some(sig) = crate::interrupt::received() {
            return Some(sig.to_string());
        }
        let abort = protocol::abort();
        match self.quick.check(&[abort.key()]) {
            Ok(false) => {}
            Ok(true) => {
                let why = self
                    .quick
                    .get(abort.key())
                    .ok()
                    .and_then(|b| abort.decode(&b).ok())
                    .map_or_else(|| "(no reason given)".into(), |a| a.message);
                return Some(format!("the {} gave up: {why}", self.peer()));
            }
            Err(e) => return Some(self.store_lost(&e)),
        }
        self.peer_silent()
    }

    fn store_lost(&self, e: &StoreError) -> String {
        match self.me {
            // The initiator hosts the store: losing it means the initiator
            // is frozen (its server thread stands still) or gone.
            Role::Target => format!(
                "lost the store, which the initiator hosts ({e}): the initiator exited, or it is frozen (stopped, in a \
                 debugger, a paused container)"
            ),
            Role::Initiator => format!("lost our own store ({e})"),
        }
    }

    /// `Some(message)` when the peer's heartbeat has not moved for
    /// [`SILENT_AFTER`] (after having been seen at least once).
    fn peer_silent(&self) -> Option<String> {
        // ADD 0 reads the counter without waiting for it to exist.
        let beat = match self.quick.add(protocol::alive(self.peer()).key(), 0) {
            Ok(b) => b,
            Err(e) => return Some(self.store_lost(&e)),
        };
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        match *seen {
            Some((v, _)) if v != beat => *seen = Some((beat, Instant::now())),
            None if beat > 0 => *seen = Some((beat, Instant::now())),
            Some((_, t)) if t.elapsed() > SILENT_AFTER => {
                return Some(format!(
                    "the {} stopped responding (no heartbeat for {:.0?}): it was killed, or it is frozen (stopped, in \
                     a debugger, a paused container)",
                    self.peer(),
                    t.elapsed()
                ));
            }
            _ => {}
        }
        None
    }

    /// Runs `work` while a scoped thread bumps our heartbeat every [`BEAT`].
    pub fn with_heartbeat<T>(&self, work: impl FnOnce() -> T) -> T {
        let stop = AtomicBool::new(false);
        let key = protocol::alive(self.me);
        std::thread::scope(|s| {
            s.spawn(|| {
                while !stop.load(Ordering::Relaxed) {
                    if self.quick.add(key.key(), 1).is_err() {
                        break; // the store is gone or silent; the waits say so
                    }
                    std::thread::sleep(BEAT);
                }
            });
            let out = work();
            stop.store(true, Ordering::Relaxed);
            out
        })
    }

    /// Tells the peer we failed, best effort (a quick request: the store
    /// may be the thing that failed).
    pub fn abort(&self, why: &str) {
        let entry = protocol::abort();
        let msg = Abort {
            role: self.me,
            message: why.to_string(),
        };
        let _ = self.quick.set(entry.key(), &entry.encode(&msg));
    }

    /// Claims `entry` with compare-and-set: `Ok(None)` when we got it,
    /// `Ok(Some(holder))` when someone else holds it.
    pub fn claim<T: Value + PartialEq>(&self, entry: &Entry<T>, mine: &T) -> Result<Option<T>> {
        let ours = entry.encode(mine);
        let holder = self.store.compare_set(entry.key(), b"", &ours)?;
        if holder == ours {
            return Ok(None);
        }
        Ok(Some(entry.decode(&holder)?))
    }

    /// Deletes keys, ignoring errors (cleanup runs on every path, and the
    /// store may already be gone: quick requests, and after the first
    /// failure the connection fails the rest at once).
    pub fn delete<K: AsRef<str>>(&self, keys: impl IntoIterator<Item = K>) {
        for k in keys {
            let _ = self.quick.delete_key(k.as_ref());
        }
    }
}
