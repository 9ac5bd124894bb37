//! Liveness: our heartbeat, the probe that watches the others' and the
//! abort key, and the abort itself: a [`Member`]'s side of [`Watch`](super::watch::Watch).

use std::sync::mpsc::RecvTimeoutError;
use std::time::{Duration, Instant};

use super::entry::{Entry, Value};
use super::member::Member;
use super::watch::parse;
use super::{Abort, BEAT, PROBE_EVERY};

/// A watched member: its index and its name in keys.
type Watched = (usize, String);

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

    /// Runs `work` while a scoped thread keeps our heartbeat going. The
    /// first beat is sent before `work` starts: a member frozen before a
    /// late-scheduled thread beat once would have no heartbeat key, and a
    /// member without one is never judged silent (its peers would wait
    /// for --timeout instead of naming it).
    pub fn with_heartbeat<T>(&self, work: impl FnOnce() -> T) -> T {
        self.note(&self.alive_key(self.me));
        // Errors are the probes' to report; keep beating.
        self.beat_if_due();
        // Dropping `stop` ends the thread at once (its wait disconnects).
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        std::thread::scope(|s| {
            s.spawn(move || {
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
        if let Some(stall) = crate::stall::stalled() {
            return Some(stall);
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

    /// The abort a member published, or a lost store. One CHECK while
    /// there is none; read without waiting (`try_get`), as the host deletes
    /// it at the end of the run.
    fn aborted(&self) -> Option<String> {
        let entry = self.abort_entry();
        match self.store.try_get(entry.key()) {
            Ok(None) => None,
            Ok(Some(b)) => Some(entry.decode(&b).map_or_else(
                |_| "a member gave up (no reason given)".into(),
                |a| format!("{} gave up: {}", a.member, a.message),
            )),
            Err(e) => Some(self.roster.store_lost(self.me, &e)),
        }
    }

    /// The first watched member whose heartbeat stood still for
    /// [`super::SILENT_AFTER`] and [`super::SILENT_BEATS`] of ours. One
    /// CHECK and one MULTI_GET for all.
    fn silent_member(&self) -> Option<String> {
        let watched = self.watched();
        // Until every watched member beats (or once one has left), there is
        // nothing to compare: MULTI_GET would wait for the missing key.
        match self.heartbeats(&watched, false) {
            Ok(values) => {
                let mut w = self.watch.lock().unwrap_or_else(|p| p.into_inner());
                for ((i, name), raw) in &values {
                    if let Some(quiet) = parse(raw).and_then(|v| w.judge(*i, name, v)) {
                        return Some(silent(self.label(*i), quiet));
                    }
                }
                None
            }
            Err(e) => Some(self.roster.store_lost(self.me, &e)),
        }
    }

    /// The members the probe watches, as (member, name in keys).
    fn watched(&self) -> Vec<(usize, String)> {
        let w = self.watch.lock().unwrap_or_else(|p| p.into_inner());
        w.watched.clone().unwrap_or_else(|| {
            (0..self.size())
                .filter(|&i| i != self.me)
                .map(|i| (i, self.roster.names[i].clone()))
                .collect()
        })
    }

    /// The heartbeat values of `who` (member, name in keys) whose keys
    /// exist: all or none unless `each`, which asks for the missing ones
    /// one by one (N requests more, only while some key is missing).
    ///
    /// The values are read without waiting (`try_multi_get`): a member that
    /// leaves deletes its heartbeat key, and one deleted between our CHECK
    /// and a MULTI_GET would hold our connection for the whole reply
    /// deadline, which is longer than [`super::SILENT_AFTER`]: our own
    /// heartbeat queues behind it, so the others would find *us* silent
    /// (a host in its teardown then left, taking the store from a member
    /// still reading the run's last decision).
    fn heartbeats(
        &self,
        who: &[(usize, String)],
        each: bool,
    ) -> Result<Vec<(Watched, Vec<u8>)>, crate::store::StoreError> {
        let key = |name: &str| self.roster.key(format_args!("alive/{name}"));
        let mut present: Vec<(usize, String)> = who.to_vec();
        let keys: Vec<String> = present.iter().map(|(_, n)| key(n)).collect();
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        if !self.store.check(&refs)? {
            if !each {
                return Ok(Vec::new());
            }
            let mut kept = Vec::new();
            for (m, k) in present.into_iter().zip(&refs) {
                if self.store.check(&[k])? {
                    kept.push(m);
                }
            }
            present = kept;
        }
        let keys: Vec<String> = present.iter().map(|(_, n)| key(n)).collect();
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        let values = self.store.try_multi_get(&refs)?;
        // A key deleted since the CHECK is a member that left.
        if !each && values.iter().any(Option::is_none) {
            return Ok(Vec::new());
        }
        Ok((present.into_iter().zip(values))
            .filter_map(|(m, v)| Some((m, v?)))
            .collect())
    }

    /// Makes the probe watch only `who` (member, name in keys: a member's
    /// heartbeat is `alive/<name>`), e.g. the current members of an elastic
    /// phase; an empty list watches nobody (silence is then the caller's to
    /// judge, [`Member::silent_among`]). A name that changed (a new process
    /// under the same member index) is judged afresh.
    pub fn watch_only(&self, who: &[(usize, String)]) {
        let mut w = self.watch.lock().unwrap_or_else(|p| p.into_inner());
        w.watched = Some(who.iter().filter(|(i, _)| *i != self.me).cloned().collect());
    }

    /// Which of `who` (member, name in keys) are silent now: a heartbeat
    /// that stood still for [`super::SILENT_AFTER`] and
    /// [`super::SILENT_BEATS`] of ours, the same judgement as the probe's,
    /// but reported, not fatal. A member whose heartbeat key does not exist
    /// yet is not judged. At most three requests plus one per missing key.
    /// Errors: the store is lost or silent.
    pub fn silent_among(
        &self,
        who: &[(usize, String)],
    ) -> anyhow::Result<std::collections::BTreeSet<usize>> {
        self.beat_if_due();
        let values = (self.heartbeats(who, true))
            .map_err(|e| anyhow::anyhow!("{}", self.roster.store_lost(self.me, &e)))?;
        let mut w = self.watch.lock().unwrap_or_else(|p| p.into_inner());
        Ok((values.iter())
            .filter(|((i, name), raw)| parse(raw).and_then(|v| w.judge(*i, name, v)).is_some())
            .map(|((i, _), _)| *i)
            .collect())
    }

    /// The heartbeat counters of `who` (member, name in keys) whose keys
    /// exist now, by member: compared later, they tell which members beat
    /// in between. Errors: the store is lost or silent.
    pub fn heartbeats_of(
        &self,
        who: &[(usize, String)],
    ) -> anyhow::Result<std::collections::BTreeMap<usize, i64>> {
        let values = (self.heartbeats(who, true))
            .map_err(|e| anyhow::anyhow!("{}", self.roster.store_lost(self.me, &e)))?;
        Ok((values.into_iter())
            .filter_map(|((i, _), raw)| parse(&raw).map(|v| (i, v)))
            .collect())
    }

    /// How many heartbeats we sent so far: a clock that slows down with
    /// the machine (a limit counted in our beats stretches under load).
    pub fn beats(&self) -> u64 {
        self.watch.lock().unwrap_or_else(|p| p.into_inner()).beats
    }

    /// Whether member `i` is gone: its heartbeat key is missing (it left)
    /// or stood still long enough (dead, frozen), or the store fails. Read
    /// without waiting (see [`Member::heartbeats`]).
    pub(super) fn gone(&self, i: usize) -> bool {
        let key = self.alive_key(i);
        let Ok(Some(raw)) = self.store.try_get(&key) else {
            return true;
        };
        let Some(value) = parse(&raw) else {
            return true;
        };
        let mut w = self.watch.lock().unwrap_or_else(|p| p.into_inner());
        w.judge(i, &self.roster.names[i], value).is_some()
    }

    /// The cause of `err`, a failure to reach member `i` (its process
    /// named `name` in keys). NIXL reports a peer that died while we
    /// loaded its metadata or connected to it only as a backend error
    /// ("UCX endpoint create failed"), so the heartbeat decides: once it
    /// stood still long enough (the probe's judgement), or another member
    /// aborted, that is the cause, with `err` after it; once it moved on
    /// by two beats, or the store is lost, or after the run's timeout,
    /// `err` stands alone. A member that left (its heartbeat key gone) is
    /// named as such. A dead peer takes about [`super::SILENT_AFTER`], a
    /// live one two [`BEAT`]s.
    pub fn blame(&self, i: usize, name: &str, err: anyhow::Error) -> anyhow::Error {
        let who = [(i, name.to_string())];
        let beat = |m: &Self| m.heartbeats_of(&who).ok().map(|b| b.get(&i).copied());
        let Some(Some(first)) = beat(self) else {
            return match beat(self) {
                Some(None) => err.context(format!("{} left the run", self.label(i))),
                _ => err,
            };
        };
        let until = Instant::now() + self.timeout();
        while Instant::now() < until {
            if let Some(why) = self.probe() {
                return err.context(why);
            }
            match self.silent_among(&who) {
                Ok(s) if s.contains(&i) => {
                    let w = self.watch.lock().unwrap_or_else(|p| p.into_inner());
                    return err.context(silent(self.label(i), w.quiet(i)));
                }
                Ok(_) => {}
                Err(_) => return err,
            }
            if beat(self).flatten().is_some_and(|now| now >= first + 2) {
                return err;
            }
            std::thread::sleep(PROBE_EVERY / 4);
        }
        err
    }

    /// [`Member::blame`] for member `i` under its roster name (a run
    /// whose members never change process).
    pub fn blame_member(&self, i: usize, err: anyhow::Error) -> anyhow::Error {
        let name = self.roster.names[i].clone();
        self.blame(i, &name, err)
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
