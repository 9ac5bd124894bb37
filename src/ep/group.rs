//! The store as seen by one rank of N: waits that notice a rank that gave
//! up, died or went silent, named barriers, and a teardown after which no
//! key is left.
//!
//! A wait ends early, with a message naming the rank, when:
//! - some rank published the `abort` key (`rank r: why`);
//! - a rank's heartbeat (a counter it bumps every [`BEAT`]) stood still for
//!   [`DEAD_AFTER`]: it was killed or hangs;
//! - the store went away (rank 0, which hosts it, exited);
//! - this process got SIGINT/SIGTERM.
//!
//! Teardown: every rank counts itself into `left` once its work is done and
//! waits until all have (so nobody still waits on a key that is about to go);
//! then each deletes every key it set and counts itself into `gone`; rank 0
//! waits for all the others' `gone`, deletes the two counters and leaves
//! last — it may host the store.

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::env::RankEnv;
use super::keys::Keys;
use crate::cli::UsageError;
use crate::store::native::TcpStore;
use crate::store::{Store, StoreError, StoreOptions};

/// How often each rank bumps its heartbeat.
pub const BEAT: Duration = Duration::from_millis(250);
/// A heartbeat that has not moved for this long means the rank is gone.
pub const DEAD_AFTER: Duration = Duration::from_secs(3);
/// How long a single store wait blocks before the probes run again.
const SLICE: Duration = Duration::from_millis(100);

/// One rank's handle on the run's store.
pub struct Group<'a> {
    pub store: &'a dyn Store,
    pub keys: Keys,
    pub rank: u32,
    pub world: u32,
    pub timeout: Duration,
    /// Each rank's heartbeat as last read, and when it last moved.
    seen: Mutex<Vec<Option<(i64, Instant)>>>,
    /// Every key this rank set: deleted at the end.
    written: Mutex<BTreeSet<String>>,
}

impl<'a> Group<'a> {
    pub fn new(store: &'a dyn Store, keys: Keys, rank: u32, world: u32, timeout: Duration) -> Self {
        Self {
            store,
            keys,
            rank,
            world,
            timeout,
            seen: Mutex::new(vec![None; world as usize]),
            written: Mutex::new(BTreeSet::new()),
        }
    }

    fn note(&self, key: &str) {
        self.written.lock().unwrap().insert(key.to_string());
    }

    /// Runs `work` while a scoped thread bumps this rank's heartbeat.
    pub fn with_heartbeat<T>(&self, work: impl FnOnce() -> T) -> T {
        let stop = AtomicBool::new(false);
        let key = self.keys.alive(self.rank);
        self.note(&key);
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

    pub fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        self.note(key);
        Ok(self.store.set(key, value)?)
    }

    pub fn set_json<T: Serialize>(&self, key: &str, value: &T) -> Result<()> {
        self.set(key, &serde_json::to_vec(value)?)
    }

    /// Waits for `key`, which rank `from` sets, and returns its value.
    /// Fails early with the reason when a rank gave up or died; on timeout
    /// names rank `from`.
    pub fn get(&self, key: &str, from: u32, what: &str) -> Result<Vec<u8>> {
        let start = Instant::now();
        loop {
            match self.store.wait(&[key], SLICE.min(self.timeout)) {
                Ok(()) => return Ok(self.store.get(key)?),
                Err(StoreError::Timeout { .. }) => {}
                Err(e) => bail!("waiting for rank {from}'s {what}: {e}"),
            }
            if let Some(why) = self.probe() {
                bail!("{why}");
            }
            if start.elapsed() >= self.timeout {
                bail!(
                    "rank {from} did not publish its {what} (key {key}) within {:?}: is it running, against the same \
                     MASTER_ADDR:MASTER_PORT? (raise --timeout if it is just slow)",
                    self.timeout
                );
            }
        }
    }

    pub fn get_json<T: DeserializeOwned>(&self, key: &str, from: u32, what: &str) -> Result<T> {
        let raw = self.get(key, from, what)?;
        serde_json::from_slice(&raw)
            .map_err(|e| anyhow::anyhow!("rank {from}'s {what} is not valid JSON: {e}"))
    }

    /// Waits until every rank reached barrier `name`. On timeout names the
    /// ranks that did not.
    pub fn barrier(&self, name: &str) -> Result<()> {
        self.set(&self.keys.barrier(name, self.rank), b"")?;
        let all: Vec<String> = (0..self.world)
            .map(|r| self.keys.barrier(name, r))
            .collect();
        let refs: Vec<&str> = all.iter().map(String::as_str).collect();
        let start = Instant::now();
        loop {
            match self.store.wait(&refs, SLICE.min(self.timeout)) {
                Ok(()) => return Ok(()),
                Err(StoreError::Timeout { .. }) => {}
                Err(e) => bail!("waiting at barrier '{name}': {e}"),
            }
            if let Some(why) = self.probe() {
                bail!("{why}");
            }
            if start.elapsed() >= self.timeout {
                let missing: Vec<u32> = (0..self.world)
                    .filter(|&r| !self.store.check(&[&all[r as usize]]).unwrap_or(false))
                    .collect();
                bail!(
                    "rank(s) {missing:?} did not reach '{name}' within {:?}: they are slow, stuck or were never started",
                    self.timeout
                );
            }
        }
    }

    /// A reason to stop waiting now, if any: interrupted, a rank aborted, a
    /// rank's heartbeat stopped, or the store is gone.
    pub fn probe(&self) -> Option<String> {
        if let Some(sig) = crate::interrupt::received() {
            return Some(sig.to_string());
        }
        let abort = self.keys.abort();
        match self.store.check(&[&abort]) {
            Ok(false) => {}
            Ok(true) => {
                let why = self.store.get(&abort).unwrap_or_default();
                return Some(format!("gave up because {}", String::from_utf8_lossy(&why)));
            }
            Err(e) => {
                return Some(format!(
                    "lost the store ({e}): the rank hosting it (rank 0, or torchrun's agent) exited"
                ));
            }
        }
        self.silent_rank()
    }

    /// `Some(message)` naming the first rank whose heartbeat has not moved
    /// for [`DEAD_AFTER`] (after having been seen at least once).
    fn silent_rank(&self) -> Option<String> {
        let mut seen = self.seen.lock().unwrap();
        for r in (0..self.world).filter(|&r| r != self.rank) {
            let Ok(beat) = self.store.add(&self.keys.alive(r), 0) else {
                continue;
            };
            let slot = &mut seen[r as usize];
            match *slot {
                Some((v, _)) if v != beat => *slot = Some((beat, Instant::now())),
                None if beat > 0 => *slot = Some((beat, Instant::now())),
                Some((_, t)) if t.elapsed() > DEAD_AFTER => {
                    return Some(format!(
                        "rank {r} stopped responding (no heartbeat for {:.0?}): it was killed or hangs",
                        t.elapsed()
                    ));
                }
                _ => {}
            }
        }
        None
    }

    /// Tells every rank this one failed, best effort; the first abort wins.
    /// The key stays behind (the others must read it); a run that fails
    /// leaves it in torchrun's store.
    pub fn abort(&self, why: &str) {
        let msg = format!("rank {}: {why}", self.rank);
        let _ = self
            .store
            .compare_set(&self.keys.abort(), b"", msg.as_bytes());
    }

    /// Polls the counter `key` until it reaches `target`, for at most the
    /// timeout; `probe` decides whether ranks' health is watched meanwhile.
    fn wait_count(&self, key: &str, target: i64, what: &str, probe: bool) -> Result<()> {
        let start = Instant::now();
        loop {
            let n = self.store.add(key, 0)?;
            if n >= target {
                return Ok(());
            }
            if probe {
                if let Some(why) = self.probe() {
                    bail!("{why}");
                }
            }
            if start.elapsed() >= self.timeout {
                bail!(
                    "only {n} of {target} ranks {what} within {:?}",
                    self.timeout
                );
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// First half of the teardown, inside the heartbeat: waits until every
    /// rank finished its work (a barrier, so a rank that never gets there is
    /// named), then until every rank has passed that barrier (so nobody
    /// still polls a key about to be deleted).
    pub fn leave(&self) -> Result<()> {
        self.barrier("finished")?;
        self.store.add(&self.keys.left(), 1)?;
        self.wait_count(&self.keys.left(), i64::from(self.world), "finished", true)
    }

    /// Second half, after the heartbeat stopped: deletes this rank's keys;
    /// rank 0 waits for the others to have done so and removes the counters.
    pub fn finish(&self) -> Result<()> {
        self.delete_written();
        if self.rank != 0 {
            self.store.add(&self.keys.gone(), 1)?;
            return Ok(());
        }
        self.wait_count(
            &self.keys.gone(),
            i64::from(self.world) - 1,
            "cleaned up",
            false,
        )?;
        let _ = self.store.delete_key(&self.keys.left());
        let _ = self.store.delete_key(&self.keys.gone());
        Ok(())
    }

    /// Deletes every key this rank set (cleanup on every path).
    pub fn delete_written(&self) {
        let keys: Vec<String> = std::mem::take(&mut *self.written.lock().unwrap())
            .into_iter()
            .collect();
        for k in keys {
            let _ = self.store.delete_key(&k);
        }
    }
}

/// Opens the run's store: joins torchrun's (`TORCHELASTIC_USE_AGENT_STORE=True`),
/// or rank 0 hosts ours on `MASTER_PORT` (all interfaces) and the others
/// join it; rank 0 then waits until all `WORLD_SIZE` ranks have.
pub fn open_store(env: &RankEnv, timeout: Duration) -> Result<Box<dyn Store>> {
    let hosting = !env.agent_store && env.rank == 0;
    let opts = StoreOptions {
        host: env.master_addr.clone(),
        port: env.master_port,
        is_server: hosting,
        num_workers: (!env.agent_store).then_some(env.world),
        wait_workers: !env.agent_store,
        timeout,
    };
    let addr = format!("{}:{}", env.master_addr, env.master_port);
    if env.rank == 0 {
        match hosting {
            true => tracing::info!(
                "hosting the store on port {} (keys under {})",
                env.master_port,
                env.key_prefix()
            ),
            false => tracing::info!(
                "joining torchrun's agent store at {addr} (keys under {})",
                env.key_prefix()
            ),
        }
    }
    TcpStore::open(&opts).map(|s| Box::new(s) as Box<dyn Store>).map_err(|e| match e {
        e @ StoreError::Bind { .. } => anyhow::Error::new(UsageError(e.to_string())),
        StoreError::Unreachable { .. } if env.agent_store => anyhow::anyhow!(
            "no store at {addr} after {timeout:?}: TORCHELASTIC_USE_AGENT_STORE=True says torchrun's agent hosts one \
             there; start the ranks with torchrun, or unset it so that rank 0 hosts the store"
        ),
        StoreError::Unreachable { .. } => anyhow::anyhow!(
            "no store at {addr} after {timeout:?}: rank 0 hosts it; start rank 0 (same MASTER_ADDR/MASTER_PORT), or use \
             `ep --ranks N`, which starts every rank"
        ),
        StoreError::WorkersTimeout { joined, .. } => anyhow::anyhow!(
            "only {joined} of {} ranks joined the store on port {} within {timeout:?}: start the missing ranks (same \
             MASTER_PORT and WORLD_SIZE), or raise --timeout",
            env.world,
            env.master_port
        ),
        e => anyhow::Error::new(e).context(format!("opening the store at {addr}")),
    })
}
