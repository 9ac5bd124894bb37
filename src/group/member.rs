//! One member's handle on the group: typed reads and writes, waits that
//! end early with the reason, barriers, leaving, and the skeleton every
//! member runs ([`Member::run`]).

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Result, anyhow, bail};

use super::entry::{Entry, Marker, Value};
use super::watch::Watch;
use super::{Host, Roster, SLICE};
use crate::cli::DataMismatch;
use crate::deadline::{Pace, poll};
use crate::store::{Store, StoreError};

/// One member of a [`Roster`], talking to the run's store.
pub struct Member<'a> {
    /// The store with [`Roster::reply_deadline`] on every request.
    pub(super) store: Box<dyn Store + 'a>,
    pub roster: Roster,
    /// Our index in the roster.
    pub me: usize,
    /// Every wait's limit, ns (a target learns the initiator's).
    timeout_ns: AtomicU64,
    pub(super) watch: Mutex<Watch>,
    /// Every key we wrote: deleted when our work ends.
    written: Mutex<BTreeSet<String>>,
    /// Keys every member reads to the end ([`Member::share`]): deleted
    /// with the group's shared keys, by the host or the last member out.
    shared: Mutex<BTreeSet<String>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl<'a> Member<'a> {
    /// Member `me` of `roster` on `store`; `timeout` bounds every wait for
    /// another member.
    pub fn new(store: &'a dyn Store, roster: Roster, me: usize, timeout: Duration) -> Self {
        let quick = store.with_deadline(roster.reply_deadline(timeout));
        let watch = Watch::new(roster.size());
        Self {
            store: quick,
            roster,
            me,
            timeout_ns: AtomicU64::new(timeout.as_nanos() as u64),
            watch: Mutex::new(watch),
            written: Mutex::new(BTreeSet::new()),
            shared: Mutex::new(BTreeSet::new()),
        }
    }

    /// How many members.
    pub fn size(&self) -> usize {
        self.roster.size()
    }

    /// Member `i` as named in messages.
    pub fn label(&self, i: usize) -> &str {
        &self.roster.labels[i]
    }

    /// Every wait's limit.
    pub fn timeout(&self) -> Duration {
        Duration::from_nanos(self.timeout_ns.load(Ordering::Relaxed))
    }

    /// Changes every later wait's limit (a target adopts the initiator's).
    pub fn set_timeout(&self, t: Duration) {
        self.timeout_ns
            .store(t.as_nanos() as u64, Ordering::Relaxed);
    }

    pub(super) fn note(&self, key: &str) {
        lock(&self.written).insert(key.to_string());
    }

    /// Writes `value` under `entry`; deleted when our work ends.
    pub fn put<T: Value>(&self, entry: &Entry<T>, value: &T) -> Result<()> {
        self.note(entry.key());
        self.store
            .set(entry.key(), &entry.encode(value))
            .map_err(|e| self.lost(e))
    }

    /// Writes a [`Marker`]; deleted when our work ends.
    pub fn mark(&self, entry: &Entry<Marker>) -> Result<()> {
        self.put(entry, &Marker)
    }

    /// Writes our last message, which its reader deletes (we may be gone
    /// before it reads it).
    pub fn put_final<T: Value>(&self, entry: &Entry<T>, value: &T) -> Result<()> {
        self.store
            .set(entry.key(), &entry.encode(value))
            .map_err(|e| self.lost(e))
    }

    /// A store error as a user needs it: a silent or lost store names the
    /// process that hosts it.
    fn lost(&self, e: StoreError) -> anyhow::Error {
        match e {
            e @ (StoreError::NoReply { .. } | StoreError::Io(_)) => {
                anyhow!("{}", self.roster.store_lost(self.me, &e))
            }
            e => e.into(),
        }
    }

    /// Waits for `entry`, which member `from` writes, and returns its value.
    /// Fails early with the reason when a member gave up, died or froze, or
    /// the store went silent; on timeout names `from` and the value (`what`).
    pub fn get<T: Value>(&self, entry: &Entry<T>, from: usize, what: &str) -> Result<T> {
        let key = entry.key();
        let timeout = self.timeout();
        poll(
            timeout,
            Pace::Every(Duration::ZERO),
            || {
                if self.wait_slice(&[key], &format!("{}'s {what}", self.label(from)))? {
                    // Without waiting: a key deleted since the WAIT found it
                    // (a report its writer deletes once the round is
                    // decided) reads as not there yet. A GET would wait for
                    // it, holding our connection, and so our heartbeat, for
                    // the whole reply deadline: longer than the others give
                    // a silent member.
                    return self.try_get(entry);
                }
                Ok(None)
            },
            |waited| {
                anyhow!(
                    "{} did not publish its {what} (key {key}) within {waited:.0?}: is it running, with the same {}? \
                     (raise --timeout if it is just slow)",
                    self.label(from),
                    self.roster.place
                )
            },
        )
    }

    /// One slice of a wait for `keys`: `Ok(true)` once they exist, `Ok(false)`
    /// when the slice passed and the probe found nothing; errors say why to
    /// stop (`what` names what we waited for).
    fn wait_slice(&self, keys: &[&str], what: &str) -> Result<bool> {
        match self.store.wait(keys, SLICE.min(self.timeout())) {
            Ok(()) => return Ok(true),
            Err(StoreError::Timeout { .. }) => {}
            Err(e @ (StoreError::NoReply { .. } | StoreError::Io(_))) => return Err(self.lost(e)),
            Err(e) => bail!("waiting for {what}: {e}"),
        }
        match self.probe() {
            Some(why) => bail!("{why}"),
            None => Ok(false),
        }
    }

    /// Deletes keys we wrote once no one reads them any more (so they are
    /// not deleted again when our work ends).
    pub fn delete_own<K: AsRef<str>>(&self, keys: impl IntoIterator<Item = K>) {
        let keys: Vec<K> = keys.into_iter().collect();
        let mut written = lock(&self.written);
        for k in &keys {
            written.remove(k.as_ref());
        }
        drop(written);
        self.delete(keys);
    }

    /// Hands `key` (ours or another member's) to the group: it is no longer
    /// deleted when our work ends but with the group's shared keys, once
    /// every member counted itself out (a member that leaves early must not
    /// take with it what a later one still reads). Every member that reads
    /// such a key shares it, so whoever deletes the shared keys knows it.
    pub fn share(&self, key: &str) {
        lock(&self.written).remove(key);
        lock(&self.shared).insert(key.to_string());
    }

    /// Waits at most `max` for `keys` (bounded by the timeout): `Ok(true)`
    /// once they all exist, `Ok(false)` when `max` passed; errors as
    /// [`Member::wait_a_slice`], whose probe it runs when it returns false.
    /// For waits that must also look at something else often.
    pub fn wait_for(&self, keys: &[&str], max: Duration, what: &str) -> Result<bool> {
        match self.store.wait(keys, max.min(self.timeout())) {
            Ok(()) => Ok(true),
            Err(StoreError::Timeout { .. }) => match self.probe() {
                Some(why) => bail!("{why}"),
                None => Ok(false),
            },
            Err(e @ (StoreError::NoReply { .. } | StoreError::Io(_))) => Err(self.lost(e)),
            Err(e) => bail!("waiting for {what}: {e}"),
        }
    }

    /// Adds `delta` to the shared counter `key` and returns the new value.
    /// Not noted as ours: whoever completes a count deletes its counter.
    pub fn add(&self, key: &str, delta: i64) -> Result<i64> {
        self.store.add(key, delta).map_err(|e| self.lost(e))
    }

    /// `entry`'s value if it exists now (no wait).
    pub fn try_get<T: Value>(&self, entry: &Entry<T>) -> Result<Option<T>> {
        // Never waits for the key: a report its writer deletes once the
        // round is decided must not hold this member's connection (and its
        // heartbeat) for the store's whole deadline.
        match self.store.try_get(entry.key()).map_err(|e| self.lost(e))? {
            Some(raw) => Ok(Some(entry.decode(&raw)?)),
            None => Ok(None),
        }
    }

    /// One slice (about 200 ms) of a wait for `keys`: `Ok(true)` once they
    /// all exist, `Ok(false)` when the slice passed and [`Member::probe`]
    /// found no reason to stop; errors say why to stop (`what` names what
    /// we waited for). For waits with their own rules (elastic agreement).
    pub fn wait_a_slice(&self, keys: &[&str], what: &str) -> Result<bool> {
        self.wait_slice(keys, what)
    }

    /// Claims `entry` with compare-and-set: `Ok(None)` when we got it (it is
    /// then ours to delete), `Ok(Some(holder))` when another holds it.
    pub fn claim<T: Value + PartialEq>(&self, entry: &Entry<T>, mine: &T) -> Result<Option<T>> {
        let ours = entry.encode(mine);
        let holder = (self.store.compare_set(entry.key(), b"", &ours)).map_err(|e| self.lost(e))?;
        if holder == ours {
            self.note(entry.key());
            return Ok(None);
        }
        Ok(Some(entry.decode(&holder)?))
    }

    /// Waits until every member reached barrier `name`; on timeout names
    /// those that did not.
    pub fn barrier(&self, name: &str) -> Result<()> {
        let keys: Vec<String> = (self.roster.names.iter())
            .map(|n| self.roster.key(format_args!("barrier/{name}/{n}")))
            .collect();
        self.mark(&Entry::new(keys[self.me].clone()))?;
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        let what = format!("the others at barrier '{name}'");
        poll(
            self.timeout(),
            Pace::Every(Duration::ZERO),
            || Ok(self.wait_slice(&refs, &what)?.then_some(())),
            |waited| {
                let missing: Vec<&str> = (0..self.size())
                    .filter(|&i| !self.store.check(&[&keys[i]]).unwrap_or(false))
                    .map(|i| self.label(i))
                    .collect();
                anyhow!(
                    "{} did not reach '{name}' within {waited:.0?}: slow, stuck, or never started",
                    missing.join(", ")
                )
            },
        )
    }

    /// The end of a successful run, inside the heartbeat: every member
    /// reached `finished` (a barrier, so one that never does is named), and
    /// every member has passed it, so no one still waits on a key that is
    /// about to be deleted.
    pub fn leave(&self) -> Result<()> {
        self.barrier("finished")?;
        let all = Entry::<Marker>::new(self.roster.key("left/all"));
        let left = self.store.add(&self.roster.key("left"), 1);
        if left.map_err(|e| self.lost(e))? >= self.size() as i64 {
            self.put_final(&all, &Marker)?;
        }
        self.get(&all, self.me, "end of the run")
            .map(drop)
            .map_err(|e| anyhow!("waiting for every member to finish: {e}"))
    }

    /// Runs `work` as this member, with the heartbeat going throughout;
    /// then on failure the abort (unless the error is wrong data that the
    /// roster publishes as a verdict, or [`super::Dismissed`]: the others
    /// already decided this member is gone), and on every path our keys deleted
    /// and us counted out (`count_out`); our heartbeat key goes
    /// last, once we no longer beat.
    pub fn run<T>(&self, work: impl FnOnce() -> Result<T>) -> Result<T> {
        let out = self.with_heartbeat(|| {
            let out = work();
            if let Err(e) = &out {
                let judged = e.downcast_ref::<DataMismatch>().is_some();
                let dismissed = e.downcast_ref::<super::Dismissed>().is_some();
                if !(dismissed || judged && self.roster.mismatch_is_published) {
                    self.abort(&format!("{e:#}"));
                }
            }
            // Not our heartbeat key yet: while it exists and ours is not
            // out, the host waits for us; deleted now, it would judge us
            // gone, delete the shared keys and leave before we are out.
            lock(&self.written).remove(&self.alive_key(self.me));
            self.delete_written();
            self.count_out();
            out
        });
        self.delete([self.alive_key(self.me)]);
        out
    }

    /// Says we are out. The host waits until every other member is out or
    /// silent (dead, frozen), so that no live one loses the store before it
    /// read the abort or finished its cleanup, then deletes the shared keys;
    /// with the store elsewhere, the member whose `ADD out` completes the
    /// count deletes them.
    fn count_out(&self) {
        let fixed = ["abort", "left", "left/all", "out"].map(|k| self.roster.key(k));
        let handed = std::mem::take(&mut *lock(&self.shared));
        let shared: Vec<String> = fixed.iter().cloned().chain(handed).collect();
        match &self.roster.host {
            Host::Member(h) if *h == self.me => {
                self.wait_for_the_others();
                self.delete(shared);
                let others = (0..self.size()).filter(|&i| i != self.me);
                self.delete(others.map(|i| self.out_key(i)));
            }
            Host::Member(_) => {
                let _ = self.store.set(&self.out_key(self.me), b"");
            }
            Host::Launcher(_) => {}
            Host::Elsewhere(_) => {
                if self
                    .store
                    .add(&fixed[3], 1)
                    .is_ok_and(|n| n >= self.size() as i64)
                {
                    self.delete(shared);
                }
            }
        }
    }

    fn out_key(&self, i: usize) -> String {
        self.roster
            .key(format_args!("out/{}", self.roster.names[i]))
    }

    /// The host's last wait: every other member out, or silent; bounded by
    /// the timeout.
    fn wait_for_the_others(&self) {
        let others: Vec<usize> = (0..self.size()).filter(|&i| i != self.me).collect();
        let keys: Vec<String> = others.iter().map(|&i| self.out_key(i)).collect();
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        let all_out = poll(
            self.timeout(),
            Pace::Every(Duration::from_millis(50)),
            || {
                if self.store.check(&refs)? {
                    return Ok(Some(()));
                }
                let waiting = (others.iter().zip(&refs))
                    .filter(|(_, k)| !self.store.check(&[k]).unwrap_or(true))
                    .any(|(&i, _)| !self.gone(i));
                Ok((!waiting).then_some(()))
            },
            |_| anyhow!("not every member counted itself out"),
        );
        if let Err(e) = all_out {
            tracing::warn!("leaving the store anyway: {e}");
        }
    }

    /// Deletes keys, ignoring errors (cleanup runs on every path, and the
    /// store may already be gone: after the first failure the connection
    /// fails the rest at once).
    pub fn delete<K: AsRef<str>>(&self, keys: impl IntoIterator<Item = K>) {
        let keys: Vec<K> = keys.into_iter().collect();
        let refs: Vec<&str> = keys.iter().map(AsRef::as_ref).collect();
        // Pipelined: a phase's thousands of step decisions in a few round trips.
        let _ = self.store.delete_keys(&refs);
    }

    /// Deletes every key we wrote (also called by [`Member::run`]).
    pub fn delete_written(&self) {
        let keys = std::mem::take(&mut *lock(&self.written));
        self.delete(keys);
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Host, Roster};
    use super::*;
    use crate::store::memory::MemoryStore;

    fn roster() -> Roster {
        Roster::ranks(
            "t/",
            2,
            Host::Elsewhere("the test".into()),
            "the test's store",
        )
    }

    fn entry(r: usize) -> Entry<Marker> {
        Entry::new(format!("t/rank/{r}/mine"))
    }

    /// Both members run `work(member)` on threads; returns their results.
    fn both(store: &MemoryStore, work: impl Fn(&Member) -> Result<()> + Sync) -> Vec<Result<()>> {
        std::thread::scope(|s| {
            let runs: Vec<_> = (0..2)
                .map(|me| {
                    let work = &work;
                    s.spawn(move || {
                        let m = Member::new(store, roster(), me, Duration::from_secs(30));
                        m.run(|| work(&m))
                    })
                })
                .collect();
            runs.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    /// A member frozen the moment its work starts must still be judged
    /// silent by the others, which needs its heartbeat key: the first beat
    /// is sent before the work, not left to a thread that may run late.
    #[test]
    fn the_heartbeat_key_exists_before_the_work_starts() {
        let store = MemoryStore::new(Duration::from_secs(30));
        let m = Member::new(&store, roster(), 0, Duration::from_secs(30));
        let key = m.alive_key(0);
        let seen = m.run(|| Ok(store.try_get(&key)?.is_some()));
        assert!(seen.unwrap(), "no {key} when the work started");
    }

    #[test]
    fn a_successful_run_leaves_no_key() {
        let store = MemoryStore::new(Duration::from_secs(30));
        let out = both(&store, |m| {
            m.mark(&entry(m.me))?;
            m.get(&entry(1 - m.me), 1 - m.me, "marker")?;
            m.barrier("middle")?;
            m.leave()
        });
        assert!(out.iter().all(Result::is_ok), "{out:?}");
        assert_eq!(store.num_keys().unwrap(), 0);
    }

    /// simple_write's ending: one member deletes its keys early and sends
    /// a last message, which the other deletes; the heartbeat goes on
    /// meanwhile and must not leave its key behind.
    #[test]
    fn a_last_message_and_a_late_beat_leave_no_key() {
        let store = MemoryStore::new(Duration::from_secs(30));
        let last = Entry::<Marker>::new("t/last");
        let out = both(&store, |m| {
            if m.me == 1 {
                m.mark(&entry(1))?;
                // The other has read our marker once it set its own.
                m.get(&entry(0), 0, "marker")?;
                m.delete_written();
                std::thread::sleep(super::super::BEAT * 2); // a beat or two
                return m.put_final(&last, &Marker);
            }
            m.get(&entry(1), 1, "marker")?;
            m.mark(&entry(0))?;
            m.get(&last, 1, "last message")?;
            m.delete([last.key()]);
            Ok(())
        });
        assert!(out.iter().all(Result::is_ok), "{out:?}");
        assert_eq!(store.num_keys().unwrap(), 0);
    }

    #[test]
    fn a_failure_is_named_to_the_others_and_leaves_no_key() {
        let store = MemoryStore::new(Duration::from_secs(30));
        let out = both(&store, |m| {
            m.mark(&entry(m.me))?;
            if m.me == 0 {
                bail!("boom");
            }
            // Never written: only the abort ends this wait.
            m.get(&Entry::<Marker>::new("t/never"), 0, "nothing")
                .map(drop)
        });
        assert_eq!(out[0].as_ref().unwrap_err().to_string(), "boom");
        let err = out[1].as_ref().unwrap_err().to_string();
        assert_eq!(err, "rank 0 gave up: boom");
        assert_eq!(store.num_keys().unwrap(), 0);
    }

    /// A failure to reach a member is blamed on its death only when its
    /// heartbeat stands still; a live member's failure stands as it is.
    #[test]
    fn blame_names_a_dead_member_and_not_a_live_one() {
        let store = MemoryStore::new(Duration::from_secs(30));
        let (a, b) = (
            Member::new(&store, roster(), 0, Duration::from_secs(30)),
            Member::new(&store, roster(), 1, Duration::from_secs(30)),
        );
        let (done, wait) = std::sync::mpsc::channel::<()>();
        let live = std::thread::scope(|s| {
            s.spawn(move || b.with_heartbeat(|| wait.recv()));
            while !store.check(&["t/alive/1"]).unwrap() {
                std::thread::sleep(Duration::from_millis(10));
            }
            let e = a.with_heartbeat(|| a.blame_member(1, anyhow!("boom")));
            drop(done);
            e
        });
        assert_eq!(format!("{live:#}"), "boom");
        // Member 1's heartbeat key stays at its last value: it died.
        let dead = a.with_heartbeat(|| a.blame_member(1, anyhow!("boom")));
        let said = format!("{dead:#}");
        assert!(said.starts_with("rank 1 stopped responding"), "{said}");
        assert!(said.ends_with(": boom"), "{said}");
    }

    #[test]
    fn the_first_abort_wins() {
        let store = MemoryStore::new(Duration::from_secs(30));
        let (a, b) = (
            Member::new(&store, roster(), 0, Duration::from_secs(30)),
            Member::new(&store, roster(), 1, Duration::from_secs(30)),
        );
        a.abort("first");
        b.abort("second");
        assert_eq!(b.probe().as_deref(), Some("rank 0 gave up: first"));
    }
}
