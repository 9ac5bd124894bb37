//! Elastic membership over the store: the phases of a [`Plan`] as one
//! rank's process lives them — who to connect to when a phase begins, the
//! per-step agreement on who is gone, and a phase's end — on top of the
//! run's [`Group`] (heartbeats, probes, aborts, cleanup).
//!
//! A process of rank `me` started in phase `inc` (its *incarnation*) lives
//! the phases [`Elastic::life`]. For each phase `i`:
//!
//! 1. [`Elastic::begin_phase`]: in its first phase the process publishes its
//!    payload (what the others need to connect to it: agent metadata, a
//!    window descriptor) under `rank/<me>.<inc>/peer` and gets every other
//!    member's; later it gets only the phase's joiners'. The caller drops
//!    [`Elastic::departed`]'s incarnations and connects to the peers.
//! 2. [`Elastic::connected`]: a barrier of the phase's members.
//! 3. Steps; after each, [`Elastic::agree`]: every active rank reports the
//!    ranks it masked (cumulative within the phase); the **leader** — the
//!    lowest active rank that this process neither masked nor suspects —
//!    waits for the report of every active rank not yet in the union; a
//!    rank whose report does not come within the fault timeout after the
//!    leader's own (counted in wall time *and* in the leader's heartbeats,
//!    so the limit stretches on a loaded machine), or whose heartbeat falls
//!    silent, joins the union. A rank in the union that reports all the
//!    same is alive, only late (it waited on the dead one itself), and is
//!    *forgiven*: the leader waits for the report of every masked rank
//!    until it comes or the rank's heartbeat stands still for two beats
//!    (`hear_the_masked`; the window starts when the steps
//!    began, [`Elastic::steps_begin`]). The leader publishes the gone set
//!    and the forgiven one with compare-and-set (one decision however many
//!    believe they lead), and every rank adopts it; after a decision that
//!    forgave, the caller resynchronises with the forgiven ranks. A rank that finds itself in the decision stops
//!    (exit 1). A leader that publishes nothing — silent, or without its
//!    own report after the fault timeout — is passed over: the next lowest
//!    takes over and counts it gone.
//! 4. After the phase's middle step, [`Elastic::halfway`]: the lowest
//!    survivor tells the launcher (`phase/<i>/halfway`), which kills the
//!    phase's `-r` ranks; those wait there to be killed.
//! 5. [`Elastic::end_phase`]: every survivor counts itself done; once all
//!    have, the launcher starts the next phase's joiners; leavers then
//!    return and end. A rank lost without the plan killing it fails the
//!    phase's end on every survivor (exit 1), naming it.
//!
//! Keys: `super::keys`' table. While a phase's steps run, silence is the
//! agreement's to judge (it is reported, not fatal); in the other waits the
//! group's probe watches the phase's current members, and a silent one
//! ends the wait with its name.

use std::collections::BTreeSet;
use std::ops::Range;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow, bail};

use super::group::{Group, process_name};
pub use super::keys::{Report, Verdict};
use super::plan::Plan;
use crate::deadline::{Pace, poll};
use crate::group::{BEAT, Dismissed, Marker, PROBE_EVERY, Value};

/// A peer to connect to: its rank, its incarnation and what it published.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Peer<P> {
    pub rank: u32,
    pub incarnation: usize,
    pub payload: P,
}

/// The decision after a step, as this process adopted it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    /// Every rank gone in this phase so far (the same on every survivor).
    pub gone: BTreeSet<u32>,
    /// The ranks this decision added.
    pub new: BTreeSet<u32>,
    /// The rank that decided.
    pub leader: u32,
    /// How many survivors' reports the decision was made from (the
    /// leader's included).
    pub reports: u32,
    /// Members of the phase still active after it.
    pub survivors: u32,
    /// Ranks masked in this step by some survivor that reported all the
    /// same ([`Verdict::forgiven`]): every survivor must resynchronise
    /// with them before the next step.
    pub forgiven: BTreeSet<u32>,
    /// µs from this process's report to its reading the decision.
    pub waited_us: u64,
}

/// What a process remembers of its current phase.
#[derive(Default)]
struct PhaseState {
    phase: Option<usize>,
    gone: BTreeSet<u32>,
    /// Keys of this phase this process wrote and others read (decisions,
    /// its barrier marker): deleted at the end of the next phase, as a
    /// rank that lags behind (and is about to learn it is gone) may still
    /// wait for them when this one ends.
    decided: Vec<String>,
    /// Those of the phase before.
    stale: Vec<String>,
    /// The phase's heartbeats as the lowest active rank (the likely
    /// leader) read them when the last steps began ([`Elastic::steps_begin`]).
    steps_began: Option<(Clock, Beats)>,
}

/// One process's side of the elastic membership (see the module docs).
pub struct Elastic<'a> {
    group: &'a Group<'a>,
    plan: &'a Plan,
    me: u32,
    incarnation: usize,
    fault_timeout: Duration,
    state: Mutex<PhaseState>,
}

impl<'a> Elastic<'a> {
    /// Rank `group.rank`'s process started in phase `incarnation` of
    /// `plan`; `fault_timeout` bounds the wait for a missing report.
    /// Errors when the plan does not start this rank in that phase.
    pub fn new(
        group: &'a Group<'a>,
        plan: &'a Plan,
        incarnation: usize,
        fault_timeout: Duration,
    ) -> Result<Self> {
        let me = group.rank;
        if plan.life(me, incarnation).is_empty() {
            bail!(
                "the plan does not start rank {me} in phase {incarnation} (NIXL_EP_INCARNATION): start the ranks \
                 with `ep --plan FILE`, which starts each as the plan says"
            );
        }
        Ok(Self {
            group,
            plan,
            me,
            incarnation,
            fault_timeout,
            state: Mutex::new(PhaseState::default()),
        })
    }

    /// Phases this process takes part in (by index).
    pub fn life(&self) -> Range<usize> {
        self.plan.life(self.me, self.incarnation)
    }

    /// The plan.
    pub fn plan(&self) -> &Plan {
        self.plan
    }

    /// This process's rank.
    pub fn rank(&self) -> u32 {
        self.me
    }

    /// The phase that started this process.
    pub fn incarnation(&self) -> usize {
        self.incarnation
    }

    /// Steps of phase `i` are about to run: the lowest active rank, which
    /// will most likely lead the agreement after them, reads the phase's
    /// heartbeats now (one request). A rank masked in those steps was
    /// waited on for the fault timeout, so by the agreement its heartbeat
    /// has had the time to show whether it still beats: the leader then
    /// decides at once instead of watching for two more beats
    /// (`hear_the_masked`).
    pub fn steps_begin(&self, i: usize) -> Result<()> {
        let active = &self.plan.members(i) - &self.phase_gone(i)?;
        let snapshot = match active.iter().next() == Some(&self.me) {
            true => Some((
                Clock::start(self.group),
                self.group.heartbeats_of(&self.names(active, i))?,
            )),
            false => None,
        };
        self.state().steps_began = snapshot;
        Ok(())
    }

    fn state(&self) -> MutexGuard<'_, PhaseState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The incarnation of member `r` of phase `i`.
    fn inc(&self, r: u32, i: usize) -> usize {
        self.plan.incarnation(r, i).expect("a member of the phase")
    }

    /// Makes the group's probe watch `ranks` of phase `i` (by their
    /// processes' names); an empty set watches nobody.
    fn watch(&self, ranks: &BTreeSet<u32>, i: usize) {
        let who: Vec<(usize, String)> = (ranks.iter())
            .map(|&r| (r as usize, process_name(r, self.inc(r, i))))
            .collect();
        self.group.watch_only(&who);
    }

    /// The processes to disconnect when phase `i` begins (not this
    /// process's first): members of phase `i−1`, as (rank, incarnation),
    /// that are not the same process in phase `i` (they left, were killed,
    /// or their id was taken by a new process).
    pub fn departed(&self, i: usize) -> Vec<(u32, usize)> {
        if i == 0 || i == self.life().start {
            return Vec::new();
        }
        (self.plan.members(i - 1).into_iter())
            .filter(|&r| r != self.me)
            .map(|r| (r, self.inc(r, i - 1)))
            .filter(|&(r, inc)| self.plan.incarnation(r, i) != Some(inc))
            .collect()
    }

    /// Phase `i` begins: publishes `mine` if `i` is this process's first
    /// phase; returns the payloads of the ranks this process must connect
    /// to now (its first phase: every other member; later: the phase's
    /// joiners), by rank. Waits for each within the run's timeout; a member
    /// that dies meanwhile is named.
    pub fn begin_phase<P: Value>(&self, i: usize, mine: &P) -> Result<Vec<Peer<P>>> {
        let life = self.life();
        if !life.contains(&i) {
            bail!("phase {i} is not in this process's life (phases {life:?})");
        }
        {
            let mut st = self.state();
            st.phase = Some(i);
            st.gone.clear();
        }
        let g = self.group;
        self.watch(&self.plan.members(i), i);
        let first = i == life.start;
        if first {
            g.put(&g.keys.peer(self.me, self.incarnation), mine)?;
        }
        let to_connect = match first {
            true => self.plan.members(i),
            false => self.plan.joiners(i),
        };
        (to_connect.into_iter().filter(|&r| r != self.me))
            .map(|r| {
                let incarnation = self.inc(r, i);
                let payload = g.get(&g.keys.peer(r, incarnation), r, "connection details")?;
                Ok(Peer {
                    rank: r,
                    incarnation,
                    payload,
                })
            })
            .collect()
    }

    /// After connecting: a barrier of phase `i`'s members. On timeout names
    /// those that never arrived.
    pub fn connected(&self, i: usize) -> Result<()> {
        let g = self.group;
        let mine = g.keys.connected(i, self.me);
        g.mark(&mine)?;
        self.state().decided.push(mine.key().to_string());
        let members = self.plan.members(i);
        let keys: Vec<String> = (members.iter())
            .map(|&r| g.keys.connected(i, r).key().to_string())
            .collect();
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        let what = format!("the members of phase {i} to connect");
        poll(
            g.timeout(),
            Pace::Every(Duration::ZERO),
            || Ok(g.wait_a_slice(&refs, &what)?.then_some(())),
            |waited| {
                let arrived = |r: u32| {
                    g.try_get(&g.keys.connected(i, r))
                        .is_ok_and(|v| v.is_some())
                };
                let missing: Vec<String> = (members.iter())
                    .filter(|&&r| !arrived(r))
                    .map(|r| format!("rank {r}"))
                    .collect();
                anyhow!(
                    "{} did not connect in phase {i} within {waited:.0?}: slow, stuck, or never started",
                    missing.join(", ")
                )
            },
        )
    }

    /// After step `step` (the global number every rank computes alike) of
    /// phase `i`: agrees with the other active ranks on who is gone (module
    /// docs). `masked` = the ranks this process masked so far in the phase.
    /// Returns the decision, the same on every survivor. Errors: this rank
    /// is in the decision (the others gave up on it), no decision within
    /// the run's timeout, the store or an abort. This rank's own dismissal
    /// is a [`Dismissed`] error: the group publishes no abort for it.
    pub fn agree(&self, i: usize, step: u64, masked: &BTreeSet<u32>) -> Result<Decision> {
        let g = self.group;
        let gone = self.phase_gone(i)?;
        let active: BTreeSet<u32> = &self.plan.members(i) - &gone;
        let mine: BTreeSet<u32> = masked.intersection(&active).copied().collect();
        // Silence is judged here, not by the probe: it names, it does not stop.
        g.watch_only(&[]);
        let report = g.keys.report(i, step, self.me);
        g.put(
            &report,
            &Report {
                masked: mine.clone(),
            },
        )?;
        let round = Round {
            i,
            step,
            active,
            mine,
            clock: Clock::start(g),
        };
        let verdict = self.await_verdict(&round)?;
        g.delete_own([report.key()]);
        let waited_us = round.clock.at.elapsed().as_micros() as u64;
        if verdict.gone.contains(&self.me) {
            return Err(Dismissed(format!(
                "the other ranks agreed that this rank (rank {}) is gone after step {step} of phase {i} (decided by \
                 rank {}): it answered too late (raise --fault-timeout) or lost contact with them; they go on \
                 without it",
                self.me, verdict.leader
            ))
            .into());
        }
        let mut st = self.state();
        let new: BTreeSet<u32> = &verdict.gone - &st.gone;
        st.gone.extend(verdict.gone.iter().copied());
        let still: BTreeSet<u32> = &self.plan.members(i) - &st.gone;
        drop(st);
        self.watch(&still, i);
        Ok(Decision {
            gone: verdict.gone,
            new,
            leader: verdict.leader,
            reports: verdict.reports,
            survivors: still.len() as u32,
            waited_us,
            forgiven: verdict.forgiven,
        })
    }

    /// Every rank gone so far in phase `i`, which must be the current one.
    fn phase_gone(&self, i: usize) -> Result<BTreeSet<u32>> {
        let st = self.state();
        match st.phase {
            Some(p) if p == i => Ok(st.gone.clone()),
            p => Err(anyhow!(
                "phase {i} is not under way (current: {p:?}): call begin_phase first"
            )),
        }
    }

    /// Waits for the decision of (`i`, `step`), leading when this process
    /// is the lowest active rank it neither masked nor suspects.
    fn await_verdict(&self, round: &Round) -> Result<Verdict> {
        let g = self.group;
        let (i, step) = (round.i, round.step);
        let entry = g.keys.decision(i, step);
        let mut suspects: BTreeSet<u32> = round.mine.clone();
        // Most decisions come within a probe interval: look at the leader
        // only after one, and snapshot the heartbeats then.
        let mut next_look = Instant::now() + PROBE_EVERY;
        let mut before: Option<Beats> = None;
        poll(
            g.timeout(),
            Pace::Every(Duration::ZERO),
            || {
                if let Some(v) = g.try_get(&entry)? {
                    return Ok(Some(v));
                }
                let leader = (round.active.iter().copied())
                    .find(|r| !suspects.contains(r))
                    .expect("this rank is active and not suspected");
                if leader == self.me {
                    return self.lead(round).map(Some);
                }
                if Instant::now() >= next_look {
                    next_look = Instant::now() + PROBE_EVERY;
                    let before = match &mut before {
                        Some(b) => b,
                        none => none
                            .insert(g.heartbeats_of(&self.names(round.active.iter().copied(), i))?),
                    };
                    if self.passed_over(round, leader, before)? {
                        tracing::info!(
                            "phase {i} step {step}: rank {leader} does not lead; the next rank takes over"
                        );
                        suspects.insert(leader);
                    }
                }
                g.wait_a_slice(
                    &[entry.key()],
                    &format!("the decision after step {step} of phase {i}"),
                )?;
                Ok(None)
            },
            |waited| {
                anyhow!(
                    "no decision on who is gone after step {step} of phase {i} within {waited:.0?}"
                )
            },
        )
    }

    /// Whether `leader` will not decide: its heartbeat is silent, or it
    /// has not even reported within the fault timeout and its heartbeat
    /// stood still since `before` (dead between steps; a live but slow
    /// leader keeps beating and is waited for).
    fn passed_over(&self, round: &Round, leader: u32, before: &Beats) -> Result<bool> {
        let g = self.group;
        let (i, step) = (round.i, round.step);
        let name = [(leader as usize, process_name(leader, self.inc(leader, i)))];
        if !g.silent_among(&name)?.is_empty() {
            return Ok(true);
        }
        if !round.clock.passed(g, self.fault_timeout)
            || g.try_get(&g.keys.report(i, step, leader))?.is_some()
        {
            return Ok(false);
        }
        let now = g.heartbeats_of(&name)?;
        Ok(now.get(&(leader as usize)) == before.get(&(leader as usize)))
    }

    /// The cause of `err`, a failure to reach rank `r`'s process started
    /// in phase `inc`: its death if its heartbeat says so (see
    /// [`crate::group::Member::blame`]).
    pub fn blame(&self, r: u32, inc: usize, err: anyhow::Error) -> anyhow::Error {
        self.group.blame(r as usize, &process_name(r, inc), err)
    }

    /// The processes of `ranks` in phase `i`, as the group names them.
    fn names(&self, ranks: impl IntoIterator<Item = u32>, i: usize) -> Vec<(usize, String)> {
        (ranks.into_iter())
            .map(|r| (r as usize, process_name(r, self.inc(r, i))))
            .collect()
    }

    /// Leads the agreement of (`i`, `step`): the union of the reports,
    /// waiting for every active rank not in it. One whose heartbeat falls
    /// silent joins the union, and so does one whose report does not come
    /// within the fault timeout while its heartbeat stands still (it died
    /// between steps). Publishes the decision (compare-and-set) and returns
    /// the one that won. Errors: a rank that keeps beating but never
    /// reports, past the run's timeout (stuck).
    fn lead(&self, round: &Round) -> Result<Verdict> {
        let g = self.group;
        let (i, step) = (round.i, round.step);
        let mut union: BTreeSet<u32> = &self.phase_gone(i)? | &round.mine;
        let mut heard = BTreeSet::from([self.me]);
        let before = g.heartbeats_of(&self.names(round.active.iter().copied(), i))?;
        let mut next_look = Instant::now();
        loop {
            let missing = self.collect_reports(round, &mut union, &mut heard)?;
            if missing.is_empty() {
                break;
            }
            if Instant::now() >= next_look {
                next_look = Instant::now() + PROBE_EVERY;
                let names = self.names(missing.iter().copied(), i);
                union.extend(g.silent_among(&names)?.into_iter().map(|r| r as u32));
                if round.clock.passed(g, self.fault_timeout) {
                    let now = g.heartbeats_of(&names)?;
                    let still = |r: &u32| now.get(&(*r as usize)) == before.get(&(*r as usize));
                    union.extend(missing.iter().copied().filter(still));
                }
            }
            if round.clock.at.elapsed() > g.timeout() {
                bail!(
                    "rank(s) {missing:?} did not report after step {step} of phase {i} within {:?}, their heartbeat going \
                     on: stuck between steps",
                    g.timeout()
                );
            }
            let keys: Vec<String> = (missing.iter())
                .map(|&r| g.keys.report(i, step, r).key().to_string())
                .collect();
            let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
            g.wait_a_slice(
                &refs,
                &format!("the reports after step {step} of phase {i}"),
            )?;
        }
        self.hear_the_masked(round, &union, &mut heard)?;
        let verdict = Verdict {
            reports: heard.len() as u32,
            gone: &union - &heard,
            forgiven: &(&union & &heard) - &self.phase_gone(i)?,
            leader: self.me,
        };
        let entry = g.keys.decision(i, step);
        match g.claim(&entry, &verdict)? {
            None => {
                self.state().decided.push(entry.key().to_string());
                Ok(verdict)
            }
            Some(theirs) => Ok(theirs),
        }
    }

    /// A rank masked in this step that still reports is alive: it was only
    /// late, because it waited out the fault timeout on the dead rank
    /// itself (a death in the middle of a dispatch: the ranks it reached go
    /// on, the one it did not waits, and its lateness looks like a second
    /// death to the others). So before deciding, the leader waits for the
    /// report of every rank in the `union` not heard from yet, until it
    /// comes (added to `heard`), or the rank's heartbeat stands still for
    /// a window of two beats (dead or frozen: no longer waited for), or
    /// another leader has decided. The first window began with the steps
    /// when this rank read the heartbeats then ([`Elastic::steps_begin`]).
    fn hear_the_masked(
        &self,
        round: &Round,
        union: &BTreeSet<u32>,
        heard: &mut BTreeSet<u32>,
    ) -> Result<()> {
        let g = self.group;
        let (i, step) = (round.i, round.step);
        let mut open: BTreeSet<u32> = &(union - &self.phase_gone(i)?) - heard;
        let beats = |open: &BTreeSet<u32>| g.heartbeats_of(&self.names(open.iter().copied(), i));
        let began = self.state().steps_began.take();
        let (mut base, mut window) = match began {
            Some(b) => (b.1, b.0),
            None => (beats(&open)?, Clock::start(g)),
        };
        while !open.is_empty() {
            // Another leader decided (and the ranks may have deleted their
            // reports since): our claim will lose to theirs.
            if g.try_get(&g.keys.decision(i, step))?.is_some() {
                return Ok(());
            }
            for r in open.clone() {
                if g.try_get(&g.keys.report(i, step, r))?.is_some() {
                    heard.insert(r);
                    open.remove(&r);
                }
            }
            if window.passed(g, 2 * BEAT) {
                // Moved on within the window: alive, waited for. Still, or
                // its key gone (it left): not waited for.
                let now = beats(&open)?;
                open.retain(|r| {
                    let at = now.get(&(*r as usize));
                    at.is_some() && at != base.get(&(*r as usize))
                });
                (base, window) = (now, Clock::start(g));
            }
            if round.clock.at.elapsed() > g.timeout() {
                bail!(
                    "rank(s) {open:?} were masked after step {step} of phase {i} and keep beating, but did not report \
                     within {:?}: stuck between steps",
                    g.timeout()
                );
            }
            // A short pause, not a WAIT: either a report or another
            // leader's decision may end this, and a WAIT sees only one.
            if !open.is_empty() {
                if let Some(why) = g.probe() {
                    bail!("{why}");
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        Ok(())
    }

    /// Reads the reports of the active ranks not yet heard from nor in the
    /// union, adding what they masked; returns those still missing.
    fn collect_reports(
        &self,
        round: &Round,
        union: &mut BTreeSet<u32>,
        heard: &mut BTreeSet<u32>,
    ) -> Result<Vec<u32>> {
        let g = self.group;
        let (i, step) = (round.i, round.step);
        let awaited = |union: &BTreeSet<u32>, heard: &BTreeSet<u32>| -> Vec<u32> {
            (round.active.iter().copied())
                .filter(|r| !union.contains(r) && !heard.contains(r))
                .collect()
        };
        for r in awaited(union, heard) {
            if let Some(rep) = g.try_get(&g.keys.report(i, step, r))? {
                heard.insert(r);
                union.extend(rep.masked.intersection(&round.active).copied());
            }
        }
        Ok(awaited(union, heard))
    }

    /// After the agreement of phase `i`'s middle step (decision `d`): the
    /// lowest survivor tells the launcher (`phase/<i>/halfway`), which then
    /// kills the phase's `-r` ranks; a rank the plan kills in this phase
    /// waits here until it is killed (an error if nothing kills it within
    /// the run's timeout). Phases without kills: nothing.
    pub fn halfway(&self, i: usize, d: &Decision) -> Result<()> {
        let killed = self.plan.killed(i);
        if killed.is_empty() {
            return Ok(());
        }
        let alive = &self.plan.members(i) - &d.gone;
        if alive.iter().next() == Some(&self.me) {
            let g = self.group;
            g.put_final(&g.keys.halfway(i), &Marker)?;
        }
        if killed.contains(&self.me) {
            return self.await_kill(i);
        }
        Ok(())
    }

    /// A rank the plan kills in phase `i` waits to be killed, its heartbeat
    /// going, so that only the kill ends it.
    fn await_kill(&self, i: usize) -> Result<()> {
        crate::say!(
            "[rank {}] phase {i}: waiting to be killed, as the plan says (-{})",
            self.me,
            self.me
        );
        let timeout = self.group.timeout();
        poll(
            timeout,
            Pace::Every(Duration::from_millis(20)),
            || match crate::interrupt::received() {
                Some(sig) => Err(anyhow!("{sig}")),
                None => Ok(None::<()>),
            },
            |_| {
                anyhow!(
                    "the plan kills rank {} in phase {i}, but nothing killed it within {timeout:?}: run the plan under \
                     `ep --plan FILE`, whose launcher kills the ranks marked -r",
                    self.me
                )
            },
        )
    }

    /// End of phase `i`: counts this process done; once every survivor is,
    /// the launcher may start the next phase's joiners (`phase/<i>/ended`).
    /// Returns when all survivors finished the phase; a leaver then ends.
    /// Errors: a rank was lost during the phase without the plan killing
    /// it (every survivor fails alike, naming it).
    pub fn end_phase(&self, i: usize) -> Result<()> {
        if self.plan.killed(i).contains(&self.me) {
            return self.await_kill(i);
        }
        let gone = self.phase_gone(i)?;
        let unplanned: Vec<String> = (gone.difference(&self.plan.killed(i)))
            .map(|r| format!("rank {r}"))
            .collect();
        if !unplanned.is_empty() {
            bail!(
                "{} stopped responding during phase {i} (every survivor agreed), but the plan does not kill it: it \
                 died, froze or fell too far behind (raise --fault-timeout if the machine is only busy)",
                unplanned.join(", ")
            );
        }
        let missed = &self.plan.killed(i) - &gone;
        if !missed.is_empty() {
            tracing::warn!(
                "phase {i} ended before the planned kill of {missed:?} was noticed: give it steps after its middle one"
            );
        }
        let finishing = &self.plan.survivors(i) - &gone;
        self.watch(&finishing, i);
        self.count_done(i, finishing.len() as i64)?;
        let mut st = self.state();
        let this_phase = std::mem::take(&mut st.decided);
        let stale = std::mem::replace(&mut st.stale, this_phase);
        st.phase = None;
        drop(st);
        self.group.delete_own(stale);
        Ok(())
    }

    /// The phase's end among its `n` finishing survivors: `done` counts
    /// them; the one completing it writes `done/all` (and `ended` for the
    /// launcher when a phase follows); once all have seen `done/all`, the
    /// one completing `out` deletes the three.
    fn count_done(&self, i: usize, n: i64) -> Result<()> {
        let g = self.group;
        let all = g.keys.all_done(i);
        if g.add(&g.keys.done(i), 1)? >= n {
            g.put_final(&all, &Marker)?;
            if i + 1 < self.plan.len() {
                g.put_final(&g.keys.ended(i), &Marker)?;
            }
        }
        let what = format!("every survivor of phase {i} to finish it");
        poll(
            g.timeout(),
            Pace::Every(Duration::ZERO),
            || Ok(g.wait_a_slice(&[all.key()], &what)?.then_some(())),
            |waited| anyhow!("not every survivor of phase {i} finished it within {waited:.0?}"),
        )?;
        if g.add(&g.keys.out(i), 1)? >= n {
            g.delete([g.keys.done(i), all.key().to_string(), g.keys.out(i)]);
        }
        Ok(())
    }

    /// When the launcher killed rank `r` during phase `i` (unix ns), if it
    /// did and said so.
    pub fn killed_at(&self, i: usize, r: u32) -> Result<Option<u64>> {
        self.group.try_get(&self.group.keys.killed(i, r))
    }
}

/// Heartbeat counters by member, as read at one moment.
type Beats = std::collections::BTreeMap<usize, i64>;

/// One round of agreement: after step `step` of phase `i`, among the
/// `active` ranks (the phase's members not yet gone), this process having
/// masked `mine`; `clock` started when it reported.
struct Round {
    i: usize,
    step: u64,
    active: BTreeSet<u32>,
    mine: BTreeSet<u32>,
    clock: Clock,
}

/// A limit counted from a moment both in wall time and in our own
/// heartbeats, so that it stretches when the machine is too busy to run us.
struct Clock {
    at: Instant,
    beats: u64,
}

impl Clock {
    fn start(g: &Group) -> Self {
        Self {
            at: Instant::now(),
            beats: g.beats(),
        }
    }

    /// Whether `limit` passed, in wall time and in our beats.
    fn passed(&self, g: &Group, limit: Duration) -> bool {
        let beats = (limit.as_nanos() / BEAT.as_nanos()).max(1) as u64;
        self.at.elapsed() >= limit && g.beats().saturating_sub(self.beats) >= beats
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ep::env::RankEnv;
    use crate::group::Bytes;
    use crate::store::Store;
    use crate::store::memory::MemoryStore;

    /// Rank `r` of `world`, started by our launcher in phase 0.
    fn env(r: u32, world: u32) -> RankEnv {
        let vars = [
            ("RANK", r.to_string()),
            ("WORLD_SIZE", world.to_string()),
            ("MASTER_PORT", "1".to_string()),
            ("NIXL_EP_INCARNATION", "0".to_string()),
        ];
        RankEnv::from_vars(|k| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone()))
            .unwrap()
            .unwrap()
    }

    /// Every rank of phase 0 of `plan` on a thread: begin, connected, one
    /// agreement with `masked(r)`, then — once every rank has its decision
    /// or its dismissal, so that no survivor's cleanup runs ahead of a rank
    /// still reading — `rest`; their results in rank order. Rank `absent`
    /// dies once connected, before agreeing: it never beats (it runs
    /// outside [`Member::run`](crate::group::Member::run)) and leaves its
    /// keys behind.
    fn phase0<T: Send>(
        store: &MemoryStore,
        plan: &Plan,
        absent: Option<u32>,
        masked: impl Fn(u32) -> BTreeSet<u32> + Sync,
        rest: impl Fn(&Elastic, Decision) -> Result<T> + Sync,
    ) -> Vec<Result<T>> {
        let world = plan.default_capacity();
        let agreed = std::sync::atomic::AtomicUsize::new(0);
        let n = plan.members(0).len();
        std::thread::scope(|s| {
            let runs: Vec<_> = (plan.members(0).into_iter())
                .map(|r| {
                    let (masked, rest, agreed) = (&masked, &rest, &agreed);
                    s.spawn(move || {
                        let g = Group::new(store, &env(r, world), Duration::from_secs(30));
                        let live = || {
                            let e = Elastic::new(&g, plan, 0, Duration::from_secs(30))?;
                            let peers = e.begin_phase(0, &Bytes(vec![r as u8]))?;
                            assert_eq!(peers.len(), plan.members(0).len() - 1);
                            assert!(peers.iter().all(|p| p.payload.0 == [p.rank as u8]));
                            e.connected(0)?;
                            if absent == Some(r) {
                                agreed.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                                bail!("absent");
                            }
                            let d = e.agree(0, 0, &masked(r));
                            agreed.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                            let d = d?;
                            while agreed.load(std::sync::atomic::Ordering::SeqCst) < n {
                                std::thread::sleep(Duration::from_millis(1));
                            }
                            rest(&e, d)
                        };
                        // The absent rank dies: no heartbeat, no cleanup.
                        match absent == Some(r) {
                            true => live(),
                            false => g.run(live),
                        }
                    })
                })
                .collect();
            runs.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    /// Ends phase 0 and returns the decision (`phase0`'s `rest`).
    fn end_phase(e: &Elastic, d: Decision) -> Result<Decision> {
        e.end_phase(0)?;
        Ok(d)
    }

    /// Rank `who` masked rank `whom`; the others masked nobody.
    fn masks(who: u32, whom: u32) -> impl Fn(u32) -> BTreeSet<u32> + Sync {
        move |r| match r == who {
            true => BTreeSet::from([whom]),
            false => BTreeSet::new(),
        }
    }

    #[test]
    fn a_quiet_phase_agrees_on_nobody_and_leaves_no_key() {
        let store = MemoryStore::new(Duration::from_secs(30));
        let plan = Plan::fixed(3);
        let out = phase0(&store, &plan, None, |_| BTreeSet::new(), end_phase);
        for d in &out {
            let d = d.as_ref().unwrap();
            assert!(d.gone.is_empty() && d.new.is_empty());
            assert_eq!((d.leader, d.reports, d.survivors), (0, 3, 3));
        }
        assert_eq!(store.num_keys().unwrap(), 0, "keys left behind");
    }

    /// Rank 2 (killed by the plan) ends after connecting; rank 1 masked
    /// it, so the union has it, and no report comes: it is gone.
    #[test]
    fn a_masked_rank_that_never_reports_is_in_every_survivors_decision() {
        let store = MemoryStore::new(Duration::from_secs(30));
        let plan = Plan::parse("[[0,1,-2]]").unwrap();
        let out = phase0(&store, &plan, Some(2), masks(1, 2), end_phase);
        for d in &out[..2] {
            let d = d.as_ref().unwrap();
            assert_eq!(d.gone, BTreeSet::from([2]));
            assert!(d.forgiven.is_empty());
            assert_eq!((d.leader, d.reports, d.survivors), (0, 2, 2));
        }
    }

    /// Rank 0 masked rank 1 (it was late, say, having waited on a dead
    /// rank itself), but rank 1 reports: alive, so not gone; every rank
    /// learns it was forgiven, and the phase ends normally.
    #[test]
    fn a_masked_rank_that_reports_is_forgiven() {
        let store = MemoryStore::new(Duration::from_secs(30));
        let plan = Plan::fixed(3);
        let out = phase0(&store, &plan, None, masks(0, 1), end_phase);
        for d in &out {
            let d = d.as_ref().unwrap();
            assert!(d.gone.is_empty(), "{d:?}");
            assert_eq!(d.forgiven, BTreeSet::from([1]));
            assert_eq!((d.reports, d.survivors), (3, 3));
        }
        assert_eq!(store.num_keys().unwrap(), 0, "keys left behind");
    }

    /// A member that leaves unplanned is agreed gone; the survivors fail
    /// the phase's end, naming it, as the plan does not kill it.
    #[test]
    fn an_unplanned_loss_fails_the_phase() {
        let store = MemoryStore::new(Duration::from_secs(30));
        let plan = Plan::fixed(3);
        let out = phase0(&store, &plan, Some(1), masks(0, 1), |e, d| {
            assert_eq!(d.gone, BTreeSet::from([1]));
            e.end_phase(0)
        });
        let err = |r: usize| format!("{:#}", out[r].as_ref().unwrap_err());
        for r in [0, 2] {
            assert!(
                err(r).contains("rank 1 stopped responding during phase 0"),
                "{}",
                err(r)
            );
        }
    }
}
