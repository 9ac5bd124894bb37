//! The agreement on who is gone, after every step and at each phase's open
//! and end: every active rank reports what it masked, the leader (the lowest
//! active rank not masked nor suspected) decides from the union of the
//! reports and the proofs of death, and publishes one decision with
//! compare-and-set; every survivor adopts it (the module docs of
//! [`super`] tell the whole round).

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::{Result, anyhow, bail};

use super::super::keys::{Report, Verdict};
use super::proof::{Fallback, Windows};
use super::{Clock, Decision, END, Membership, OPEN, Round, ranks_named, round_name};
use crate::deadline::{Pace, poll};
use crate::group::{Dismissed, PROBE_EVERY};

/// How often a wait inside the agreement looks again for the proof that a
/// rank it waits on is dead: the launcher's notice is one request.
const LOOK: Duration = Duration::from_millis(2);

impl Membership<'_> {
    /// After connecting in phase `i`: the round that opens it, in which
    /// this process reports `unreachable` (the newcomers that died before
    /// publishing) as masked. Its decision is the members' barrier: once it
    /// is out, every survivor connected.
    pub fn opened(&self, i: usize, unreachable: &BTreeSet<u32>) -> Result<Decision> {
        self.agree(i, OPEN, unreachable)
    }

    /// After step `step` (the global number every rank computes alike) of
    /// phase `i`: agrees with the other active ranks on who is gone (module
    /// docs). `masked` = the ranks this process masked so far in the phase.
    /// Returns the decision, the same on every survivor. Errors: this rank
    /// is in the decision (the others gave up on it; a [`Dismissed`] error,
    /// for which the group publishes no abort), a rank is gone and deaths
    /// fail the run ([`super::OnDeath::Fail`]), no decision within the run's
    /// timeout, the store or an abort.
    pub fn agree(&self, i: usize, step: u64, masked: &BTreeSet<u32>) -> Result<Decision> {
        let g = self.group;
        let gone = self.phase_gone(i)?;
        let active: BTreeSet<u32> = &self.members(i) - &gone;
        let mine: BTreeSet<u32> = masked.intersection(&active).copied().collect();
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
                "the other ranks agreed that this rank (rank {}) is gone after round {} of phase {i} (decided by \
                 rank {}): it answered too late (raise --fault-timeout) or lost contact with them; they go on \
                 without it",
                self.me,
                round_name(step),
                verdict.leader
            ))
            .into());
        }
        self.adopt(i, step, verdict, waited_us)
    }

    /// Takes `verdict`, the decision of round `step` of phase `i`, as ours.
    pub(super) fn adopt(
        &self,
        i: usize,
        step: u64,
        verdict: Verdict,
        waited_us: u64,
    ) -> Result<Decision> {
        let mut st = self.state();
        let new: BTreeSet<u32> = &verdict.gone - &st.gone;
        st.gone.extend(verdict.gone.iter().copied());
        st.dead.extend(verdict.dead.iter().copied());
        drop(st);
        let still = self.active(i);
        if !new.is_empty() && !self.survives() {
            bail!(
                "{} stopped responding in phase {i} (round {}; agreed by {} survivor(s), decided by rank {}): it \
                 died, froze or fell too far behind; --on-death survive (or --elastic) goes on without it",
                ranks_named(&new),
                round_name(step),
                verdict.reports,
                verdict.leader
            );
        }
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

    /// Waits for the decision of (`i`, `step`), leading when this process
    /// is the lowest active rank it neither masked nor suspects.
    pub(super) fn await_verdict(&self, round: &Round) -> Result<Verdict> {
        let g = self.group;
        let (i, step) = (round.i, round.step);
        let entry = g.keys.decision(i, step);
        let what = format!("the decision after round {} of phase {i}", round_name(step));
        let mut suspects: BTreeSet<u32> = round.mine.clone();
        let mut watch = Fallback::new(PROBE_EVERY);
        let led_by = std::cell::Cell::new(None);
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
                if led_by.replace(Some(leader)) != Some(leader) {
                    crate::stall::waiting_on(format!("{what}, led by rank {leader}"));
                }
                if self.passed_over(round, leader, &mut watch)? {
                    tracing::info!(
                        "phase {i} round {}: rank {leader} does not lead (dead); the next rank takes over",
                        round_name(step)
                    );
                    suspects.insert(leader);
                    return Ok(None);
                }
                // Short: a dead leader is told by the launcher's notice,
                // which this wait does not see.
                g.wait_for(&[entry.key()], LOOK, &what)?;
                Ok(None)
            },
            |waited| {
                let leader = led_by.get().map_or(String::new(), |l| {
                    format!(": rank {l} leads it and its heartbeat goes on (alive but stuck?)")
                });
                anyhow!(
                    "no decision on who is gone after round {} of phase {i} within {waited:.0?}{leader}",
                    round_name(step)
                )
            },
        )
    }

    /// Whether `leader` will not decide: the launcher's notice says it
    /// died; or (at most every [`PROBE_EVERY`]) its heartbeat is silent, or
    /// it has not even reported within the fault timeout and its heartbeat
    /// stood still since this wait's first look (dead between steps; a live
    /// but slow leader keeps beating and is waited for).
    pub(super) fn passed_over(
        &self,
        round: &Round,
        leader: u32,
        watch: &mut Fallback,
    ) -> Result<bool> {
        let g = self.group;
        let (i, step) = (round.i, round.step);
        if self.noticed_among(&[leader], i)?.contains(&leader) {
            return Ok(true);
        }
        if !watch.due() {
            return Ok(false);
        }
        let name = self.names([leader], i);
        if !g
            .silent_among(&self.judged_by_silence([leader], i, step))?
            .is_empty()
        {
            return Ok(true);
        }
        let before = match &watch.before {
            Some(b) => b.clone(),
            None => {
                watch.before = Some(g.heartbeats_of(&self.names(round.active.iter().copied(), i))?);
                return Ok(false);
            }
        };
        if !round.clock.passed(g, self.fault_timeout)
            || g.try_get(&g.keys.report(i, step, leader))?.is_some()
        {
            return Ok(false);
        }
        let now = g.heartbeats_of(&name)?;
        Ok(now.get(&(leader as usize)) == before.get(&(leader as usize)))
    }

    /// Leads the agreement of (`i`, `step`): the union of the reports,
    /// waiting for every active rank not in it. One the launcher noticed
    /// dead joins the union at once; where no launcher watches, one whose
    /// heartbeat falls silent, or whose report does not come within the
    /// fault timeout while its heartbeat stands still. Then the masked
    /// ranks are heard (`hear_the_masked`). Publishes the decision
    /// (compare-and-set) and returns the one that won. Errors: a rank that
    /// keeps beating but never reports, past the run's timeout (stuck).
    pub(super) fn lead(&self, round: &Round) -> Result<Verdict> {
        let g = self.group;
        let (i, step) = (round.i, round.step);
        let mut union: BTreeSet<u32> = &self.phase_gone(i)? | &round.mine;
        let mut heard = BTreeSet::from([self.me]);
        let mut watch = Fallback::new(Duration::ZERO);
        let mut said = Vec::new();
        loop {
            let missing = self.collect_reports(round, &mut union, &mut heard)?;
            if missing.is_empty() {
                break;
            }
            if said != missing {
                crate::stall::waiting_on(format!(
                    "the reports of rank(s) {missing:?} after round {} of phase {i} (this rank leads)",
                    round_name(step)
                ));
                said.clone_from(&missing);
            }
            union.extend(self.proven_gone(round, &missing, &mut watch)?);
            if round.clock.at.elapsed() > g.timeout() {
                bail!(
                    "rank(s) {missing:?} did not report after round {} of phase {i} within {:?}, their heartbeat going \
                     on: stuck between steps",
                    round_name(step),
                    g.timeout()
                );
            }
            let keys: Vec<String> = (missing.iter())
                .filter(|r| !union.contains(r))
                .map(|&r| g.keys.report(i, step, r).key().to_string())
                .collect();
            let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
            if !refs.is_empty() {
                let what = format!("the reports after round {} of phase {i}", round_name(step));
                g.wait_for(&refs, LOOK, &what)?;
            }
        }
        self.hear_the_masked(round, &union, &mut heard)?;
        // A rank that reported and died since is gone all the same: the
        // notice is proof, and no later round may come to find it (this
        // one may end the run).
        let active: Vec<u32> = round.active.iter().copied().collect();
        let died = self.noticed_among(&active, i)?;
        union.extend(&died);
        heard.retain(|r| !died.contains(r));
        self.decide(round, &union, &heard)
    }

    /// Of the `missing` reporters, those proven dead: the launcher's
    /// notice at every look; where no launcher watches, at most every
    /// [`PROBE_EVERY`], a silent heartbeat, or one that stood still since
    /// the first look while the fault timeout passed.
    pub(super) fn proven_gone(
        &self,
        round: &Round,
        missing: &[u32],
        watch: &mut Fallback,
    ) -> Result<BTreeSet<u32>> {
        let g = self.group;
        let mut gone = self.noticed_among(missing, round.i)?;
        if g.launcher && gone.len() == missing.len() || !watch.due() {
            return Ok(gone);
        }
        let names = self.names(missing.iter().copied(), round.i);
        let before = match &watch.before {
            Some(b) => b.clone(),
            None => {
                let all = self.names(round.active.iter().copied(), round.i);
                watch.before.insert(g.heartbeats_of(&all)?).clone()
            }
        };
        let judged = self.judged_by_silence(missing.iter().copied(), round.i, round.step);
        gone.extend(g.silent_among(&judged)?.into_iter().map(|r| r as u32));
        if !g.launcher && round.clock.passed(g, self.fault_timeout) {
            let now = g.heartbeats_of(&names)?;
            let still = |r: &u32| now.get(&(*r as usize)) == before.get(&(*r as usize));
            gone.extend(missing.iter().copied().filter(still));
        }
        Ok(gone)
    }

    /// The leader's decision from the `union` of the masks and the ranks
    /// `heard` from, published with compare-and-set; the one that won.
    pub(super) fn decide(
        &self,
        round: &Round,
        union: &BTreeSet<u32>,
        heard: &BTreeSet<u32>,
    ) -> Result<Verdict> {
        let g = self.group;
        let (i, step) = (round.i, round.step);
        let phase_gone = self.phase_gone(i)?;
        let gone: BTreeSet<u32> = union - heard;
        let mut dead = self.state().dead.clone();
        dead.extend(gone.iter().map(|&r| (r, self.inc(r, i))));
        let verdict = Verdict {
            reports: heard.len() as u32,
            forgiven: &(union & heard) - &phase_gone,
            gone,
            leader: self.me,
            dead,
        };
        let entry = g.keys.decision(i, step);
        match g.claim(&entry, &verdict)? {
            None => {
                if step < END {
                    self.state().decided.push(entry.key().to_string());
                    if g.launcher {
                        g.add(&g.keys.rounds(i), 1)?;
                    }
                }
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
    /// comes (added to `heard`), or the rank is proven dead (the launcher's
    /// notice; its heartbeat silent for the probe's limit), or another
    /// leader has decided. Where no launcher watches, a heartbeat that
    /// stands still for a window of two beats is the proof; the first
    /// window began with the steps when this rank read the heartbeats then
    /// ([`Membership::steps_begin`]).
    pub(super) fn hear_the_masked(
        &self,
        round: &Round,
        union: &BTreeSet<u32>,
        heard: &mut BTreeSet<u32>,
    ) -> Result<()> {
        let g = self.group;
        let (i, step) = (round.i, round.step);
        let mut open: BTreeSet<u32> = &(union - &self.phase_gone(i)?) - heard;
        let mut windows = Windows::start(self, round, &open)?;
        let mut watch = Fallback::new(PROBE_EVERY);
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
            let ranks: Vec<u32> = open.iter().copied().collect();
            open = &open - &self.noticed_among(&ranks, i)?;
            if watch.due() {
                let judged = self.judged_by_silence(open.iter().copied(), i, step);
                let silent = g.silent_among(&judged)?;
                open.retain(|r| !silent.contains(&(*r as usize)));
            }
            // The backstop where the notice is late or missing.
            windows.judge(self, &mut open)?;
            if round.clock.at.elapsed() > g.timeout() {
                bail!(
                    "rank(s) {open:?} were masked after round {} of phase {i} and keep beating, but did not report \
                     within {:?}: stuck between steps",
                    round_name(step),
                    g.timeout()
                );
            }
            // A short pause, not a WAIT: a report, a notice or another
            // leader's decision may end this, and a WAIT sees only one.
            if !open.is_empty() {
                if let Some(why) = g.probe() {
                    bail!("{why}");
                }
                std::thread::sleep(LOOK);
            }
        }
        Ok(())
    }

    /// Reads the reports of the active ranks not yet heard from nor in the
    /// union, adding what they masked; returns those still missing.
    pub(super) fn collect_reports(
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
}
