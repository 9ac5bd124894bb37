//! How a phase begins and ends for this process: its peers' payloads (all of
//! them in its first phase, the joiners' later, ahead of time where they are
//! ready), a joiner's wait for the phase before, and the round that ends it.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow, bail};

use super::{Decision, END, Membership, Newcomers, Peer, Ready, Verdict, WAIT};
use crate::deadline::{Pace, poll};
use crate::group::{PROBE_EVERY, Value};

impl Membership<'_> {
    /// The processes to disconnect when phase `i` begins (not this
    /// process's first): members of phase `i−1`, as (rank, incarnation),
    /// that are not the same live process in phase `i` (they left, died, or
    /// their id was taken by a new process). May name a process dropped
    /// already (dead earlier): dropping it again does nothing.
    pub fn departed(&self, i: usize) -> Vec<(u32, usize)> {
        if i == 0 || i == self.life().start {
            return Vec::new();
        }
        let dead = self.state().dead.clone();
        (self.plan.members(i - 1).into_iter())
            .filter(|&r| r != self.me)
            .map(|r| (r, self.inc(r, i - 1)))
            .filter(|p| self.plan.incarnation(p.0, i) != Some(p.1) || dead.contains(p))
            .collect()
    }

    /// Phase `i` begins: publishes `mine` if `i` is this process's first
    /// phase; returns the payloads of the processes it must connect to now
    /// (its first phase: every other member; later: the phase's joiners),
    /// and those that died before publishing theirs. Waits for each within
    /// the run's timeout. A joiner first waits for the phase before to end,
    /// calling `meanwhile` between looks (to connect ahead,
    /// [`Membership::ready_peers`]).
    pub fn begin_phase<P: Value>(
        &self,
        i: usize,
        mine: &P,
        meanwhile: impl FnMut() -> Result<()>,
    ) -> Result<Newcomers<P>> {
        let life = self.life();
        if !life.contains(&i) {
            bail!("phase {i} is not in this process's life (phases {life:?})");
        }
        let g = self.group;
        let first = i == life.start;
        if first {
            // Published at once: a joiner started while the phase before
            // steps, and the members find its card ready at their phase's
            // begin (or connect to it ahead, between their steps).
            g.put(&g.keys.peer(self.me, self.incarnation), mine)?;
        }
        let t0 = Instant::now();
        if first && i > 0 {
            // A joiner: who died before it came, from the last phase's end.
            let v = self.await_phase_end(i - 1, meanwhile)?;
            g.share(g.keys.decision(i - 1, END).key());
            self.state().dead = v.dead;
        }
        let waited = t0.elapsed();
        {
            let mut st = self.state();
            st.phase = Some(i);
            st.gone.clear();
        }
        self.watch(&self.members(i), i);
        let mut out = Newcomers {
            peers: Vec::new(),
            gone: BTreeSet::new(),
            waited,
        };
        for r in self.to_connect(i) {
            let incarnation = self.inc(r, i);
            let card = g.keys.peer(r, incarnation);
            match self.await_entry(&card, r, i, "connection details")? {
                Some(payload) => out.peers.push(Peer {
                    rank: r,
                    incarnation,
                    payload,
                }),
                None => {
                    out.gone.insert(r);
                }
            }
        }
        Ok(out)
    }

    /// Whom this process connects to when phase `i` begins: in its first
    /// phase every other member, later the phase's joiners (members only,
    /// as far as it knows now).
    pub(super) fn to_connect(&self, i: usize) -> BTreeSet<u32> {
        let mut to = match i == self.life().start {
            true => self.members(i),
            false => &self.plan.joiners(i) & &self.members(i),
        };
        to.remove(&self.me);
        to
    }

    /// The peers phase `i` (of this process's life) will bring
    /// ([`Membership::begin_phase`]) whose payloads are in the store now,
    /// one non-blocking read each, skipping those `connected(rank,
    /// incarnation)` says this process has already. For connecting ahead of
    /// the phase's begin: between the steps of the phase before (a member)
    /// or while waiting for it to end (a joiner). Proves nobody dead: the
    /// phase's begin does.
    pub fn ready_peers<P: Value>(
        &self,
        i: usize,
        connected: impl Fn(u32, usize) -> bool,
    ) -> Result<Ready<P>> {
        let g = self.group;
        let mut out = Ready {
            peers: Vec::new(),
            missing: BTreeSet::new(),
        };
        if !self.life().contains(&i) {
            return Ok(out);
        }
        for r in self.to_connect(i) {
            let incarnation = self.inc(r, i);
            if connected(r, incarnation) {
                continue;
            }
            match g.try_get(&g.keys.peer(r, incarnation))? {
                Some(payload) => out.peers.push(Peer {
                    rank: r,
                    incarnation,
                    payload,
                }),
                None => {
                    out.missing.insert(r);
                }
            }
        }
        Ok(out)
    }

    /// A joiner's wait for the decision that ends phase `i`, which it
    /// entered during: as long as the phase's agreement rounds go on (the
    /// counter its leaders bump), however long the phase; a phase whose
    /// rounds stand still for the run's timeout is an error naming it.
    /// Calls `meanwhile` between looks.
    pub(super) fn await_phase_end(
        &self,
        i: usize,
        mut meanwhile: impl FnMut() -> Result<()>,
    ) -> Result<Verdict> {
        let g = self.group;
        let ended = g.keys.decision(i, END);
        let what = format!("the end of phase {i}");
        crate::stall::waiting_on(format!("{what}, to join after it"));
        let (mut rounds, mut moved) = (-1, Instant::now());
        loop {
            if let Some(v) = g.try_get(&ended)? {
                return Ok(v);
            }
            meanwhile()?;
            let now = g.add(&g.keys.rounds(i), 0)?;
            if now != rounds {
                (rounds, moved) = (now, Instant::now());
                // The phase this joiner waits for goes on: progress.
                crate::stall::progressed();
            } else if moved.elapsed() > g.timeout() {
                bail!(
                    "phase {i} made no progress for {:?} (its agreement rounds stood still at {rounds}) while this \
                     rank waited to join after it: are its ranks running? (raise --timeout if they are just slow)",
                    g.timeout()
                );
            }
            g.wait_for(&[ended.key()], Duration::from_millis(200), &what)?;
        }
    }

    /// Waits for `entry`, which rank `r`'s process of phase `i` writes;
    /// `None` once that process is proven dead without writing it
    /// (surviving runs; otherwise the probe names it). Errors: not written
    /// within the run's timeout (naming `what`), the store, an abort.
    pub fn await_entry<T: Value>(
        &self,
        entry: &crate::group::Entry<T>,
        r: u32,
        i: usize,
        what: &str,
    ) -> Result<Option<T>> {
        let g = self.group;
        let inc = self.inc(r, i);
        let what = format!("rank {r}'s {what}");
        let mut next_look = Instant::now() + PROBE_EVERY;
        crate::stall::waiting_on(format!("{what} (key {})", entry.key()));
        poll(
            g.timeout(),
            Pace::Every(Duration::ZERO),
            || {
                if let Some(p) = g.try_get(entry)? {
                    crate::stall::progressed();
                    return Ok(Some(Some(p)));
                }
                if self.survives() && self.proven_dead(r, inc, &mut next_look)? {
                    return Ok(Some(None));
                }
                g.wait_for(&[entry.key()], WAIT, &what)?;
                Ok(None)
            },
            |waited| {
                anyhow!(
                    "{what} (key {}) did not come within {waited:.0?}: is it running, with the same \
                     MASTER_ADDR:MASTER_PORT? (raise --timeout if it is just slow)",
                    entry.key()
                )
            },
        )
    }

    /// End of phase `i`: the phase's last round, over nothing. Its decision
    /// fixes who finished the phase; the launcher reads it to start the
    /// next phase's joiners, and they read it to learn who is dead, so it
    /// is shared (deleted with the group's shared keys). A leaver then
    /// returns and ends.
    pub fn end_phase(&self, i: usize) -> Result<Decision> {
        let d = self.agree(i, END, &BTreeSet::new())?;
        let g = self.group;
        g.share(g.keys.decision(i, END).key());
        let mut st = self.state();
        let this_phase = std::mem::take(&mut st.decided);
        let stale = std::mem::replace(&mut st.stale, this_phase);
        st.phase = None;
        drop(st);
        g.delete_own(stale);
        Ok(d)
    }
}
