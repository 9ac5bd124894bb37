//! Liveness: our heartbeat, the probe that watches the others' and the
//! abort key, and the abort itself: a [`Member`]'s side of [`Watch`](super::watch::Watch).

use std::sync::mpsc::RecvTimeoutError;
use std::time::{Duration, Instant};

use super::entry::{Entry, Value};
use super::member::Member;
use super::watch::parse;
use super::{Abort, BEAT, PROBE_EVERY};

impl Member<'_> {
    pub(super) fn alive_key(&self, i: usize) -> String {
        self.roster
            .key(format_args!("alive/{}", self.roster.names[i]))
    }

    fn abort_entry(&self) -> Entry<Abort> {
        Entry::new(self.roster.key("abort"))
    }

    /// Bumps our heartbeat if the last beat is [`BEAT`] old (one request
    /// then, none otherwise). Called by the heartbeat thread and by every
    /// probe, so the beat goes on even while our waits hold the store
    /// connection.
    fn beat_if_due(&self) {
        let due = {
            let w = self.watch.lock().unwrap_or_else(|p| p.into_inner());
            w.last_beat.is_none_or(|t| t.elapsed() >= BEAT)
        };
        if due && self.store.add(&self.alive_key(self.me), 1).is_ok() {
            let mut w = self.watch.lock().unwrap_or_else(|p| p.into_inner());
            w.beats += 1;
            w.last_beat = Some(Instant::now());
        }
    }

    /// Runs `work` while a scoped thread keeps our heartbeat going.
    pub fn with_heartbeat<T>(&self, work: impl FnOnce() -> T) -> T {
        self.note(&self.alive_key(self.me));
        // Dropping `stop` ends the thread at once (its wait disconnects).
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        std::thread::scope(|s| {
            s.spawn(move || {
                // Errors are the probes' to report; keep beating.
                self.beat_if_due();
                while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(BEAT / 4) {
                    self.beat_if_due();
                }
            });
            let out = work();
            drop(stop);
            out
        })
    }

    /// A reason to stop waiting now, if any: interrupted, a member aborted,
    /// a member's heartbeat stopped, or the store is gone or silent. Cheap
    /// to call often: requests go out at most every [`PROBE_EVERY`].
    pub fn probe(&self) -> Option<String> {
        if let Some(sig) = crate::interrupt::received() {
            return Some(sig.to_string());
        }
        // A wait holds the store connection most of the time, and the
        // heartbeat thread may lose every race for it: beat from here too.
        self.beat_if_due();
        {
            let w = self.watch.lock().unwrap_or_else(|p| p.into_inner());
            if w.found.is_some() || Instant::now() < w.next {
                return w.found.clone();
            }
        }
        let found = self.aborted().or_else(|| self.silent_member());
        let mut w = self.watch.lock().unwrap_or_else(|p| p.into_inner());
        w.next = Instant::now() + PROBE_EVERY;
        w.found.clone_from(&found);
        found
    }

    /// The abort a member published, or a lost store.
    fn aborted(&self) -> Option<String> {
        let entry = self.abort_entry();
        match self.store.check(&[entry.key()]) {
            Ok(false) => None,
            Ok(true) => {
                let why = (self.store.get(entry.key()).ok())
                    .and_then(|b| entry.decode(&b).ok())
                    .map_or_else(
                        || "a member gave up (no reason given)".into(),
                        |a| format!("{} gave up: {}", a.member, a.message),
                    );
                Some(why)
            }
            Err(e) => Some(self.roster.store_lost(self.me, &e)),
        }
    }

    /// The first member whose heartbeat stood still for [`super::SILENT_AFTER`]
    /// and [`super::SILENT_BEATS`] of ours. One CHECK and one MULTI_GET for all.
    fn silent_member(&self) -> Option<String> {
        let others: Vec<usize> = (0..self.size()).filter(|&i| i != self.me).collect();
        let keys: Vec<String> = others.iter().map(|&i| self.alive_key(i)).collect();
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        // Until every member beats (or once one has left), there is nothing
        // to compare: MULTI_GET would wait for the missing key.
        let values = match self.store.check(&refs) {
            Ok(true) => self.store.multi_get(&refs),
            Ok(false) => return None,
            Err(e) => return Some(self.roster.store_lost(self.me, &e)),
        };
        let values = match values {
            Ok(v) => v,
            Err(crate::store::StoreError::Timeout { .. }) => return None,
            Err(e) => return Some(self.roster.store_lost(self.me, &e)),
        };
        let mut w = self.watch.lock().unwrap_or_else(|p| p.into_inner());
        for (&i, raw) in others.iter().zip(&values) {
            if let Some(quiet) = parse(raw).and_then(|v| w.judge(i, v)) {
                return Some(silent(self.label(i), quiet));
            }
        }
        None
    }

    /// Whether member `i` is gone: its heartbeat key is missing (it left)
    /// or stood still long enough (dead, frozen), or the store fails.
    pub(super) fn gone(&self, i: usize) -> bool {
        let key = self.alive_key(i);
        if !self.store.check(&[&key]).unwrap_or(false) {
            return true;
        }
        let Some(value) = self.store.get(&key).ok().and_then(|b| parse(&b)) else {
            return true;
        };
        let mut w = self.watch.lock().unwrap_or_else(|p| p.into_inner());
        w.judge(i, value).is_some()
    }

    /// Tells every member we failed, best effort; the first abort wins
    /// (compare-and-set), so every member reports the first cause.
    pub fn abort(&self, why: &str) {
        let entry = self.abort_entry();
        let msg = Abort {
            member: self.label(self.me).to_string(),
            message: why.to_string(),
        };
        let _ = self
            .store
            .compare_set(entry.key(), b"", &Value::encode(&msg));
    }
}

fn silent(who: &str, quiet: Duration) -> String {
    format!(
        "{who} stopped responding (no heartbeat for {quiet:.1?}): it was killed, or it is frozen (stopped, in a \
         debugger, a paused container)"
    )
}
