//! The phase driver: the one loop every N-rank program runs, written once.
//!
//! For each phase of the plan this process lives, the driver
//!
//! 1. **begins** it: publishes this process's card in its first phase and
//!    gets the cards of the peers to connect to ([`PhaseWork::connect`]),
//!    judges each peer the work could not reach (dead: the opening round
//!    agrees on it; alive: an error naming it), lets the work put its views
//!    and masks in place ([`PhaseWork::enter`]), and runs the round that
//!    opens the phase, the members' barrier;
//! 2. **steps** it: [`PhaseWork::step`] runs one unit of work and says which
//!    ranks its kernels masked; the driver adds the ranks proven dead
//!    meanwhile (the launcher's notice, a silent heartbeat), and every
//!    active rank agrees on who is gone. A decision that removes ranks goes
//!    to [`PhaseWork::apply`] before the next step, so no step waits on a
//!    rank already agreed gone; one that forgives a late rank goes to
//!    [`PhaseWork::resync`]. Between steps it connects ahead to the next
//!    phase's joiners ([`PhaseWork::ahead`]);
//! 3. **ends** it: [`PhaseWork::end`] publishes what the phase measured,
//!    then the round that ends the phase fixes its survivors.
//!
//! A program never queries the membership: it gets a [`PhaseView`] (the
//! phase's members as agreed so far) and the [`PhaseRecord`] of each phase
//! (deaths, detection, agreement, steps that waited on a rank already
//! gone). Upstream NIXL EP keeps its elastic choreography in one place the
//! same way (`csrc/nixl_ep.cpp`: connect, mask, disconnect), and NCCL's
//! `ncclCommShrink` gives the application the survivors; here the loop
//! itself is shared too.
//!
//! Every wait is bounded by the run's timeout and the stall watchdog
//! ([`crate::stall`]) names where a rank stands: the phase, the step and
//! what it waits on.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use anyhow::Result;
use serde::{Deserialize, Serialize};

use super::membership::{Decision, Membership, RESYNC, round_name, unix_ns};
pub use super::membership::{Peer, lowest};
use crate::group::Value;
use crate::say;

/// What a program does in each phase; the driver calls it in this order:
/// `connect`, `enter`, then `steps` × (`step`, and after a decision
/// `apply` or `resync`), `end`. `ahead` runs between steps and while a
/// joiner waits for its phase.
pub trait PhaseWork {
    /// What this process publishes in its first phase for its peers to
    /// connect to it (agent metadata, a window's descriptor).
    type Card: Value;

    /// Phase `view.phase` begins: drop the `view.departed` peers and connect
    /// to `peers` (every other member in this process's first phase, later
    /// the phase's joiners; some may be connected ahead already). Returns
    /// the peers it could not reach, with why; the driver judges each.
    fn connect(
        &mut self,
        view: &PhaseView,
        peers: &[Peer<Self::Card>],
    ) -> Result<Vec<(u32, anyhow::Error)>>;

    /// Connected: the phase's views and masks over `view.members` without
    /// `unreachable` (those that died meanwhile), before the opening round.
    fn enter(&mut self, view: &PhaseView, unreachable: &BTreeSet<u32>) -> Result<()>;

    /// Units of work (each followed by an agreement) in the phase.
    fn steps(&self, view: &PhaseView) -> u64;

    /// Runs unit `k` of the phase over `view.active`.
    fn step(&mut self, view: &PhaseView, k: u64) -> Result<StepOutcome>;

    /// A decision removed `change.new`: `view.active` is the survivors; the
    /// masks and views must say so before the next step.
    fn apply(&mut self, view: &PhaseView, change: &Change) -> Result<()>;

    /// A decision after unit `k` forgave `forgiven` (some survivor masked
    /// them, but they reported: alive, only late). Returns whether this
    /// rank put state back that every survivor must have put back before
    /// anyone writes again (the driver then runs one more round, a barrier).
    fn resync(&mut self, _view: &PhaseView, _k: u64, _forgiven: &BTreeSet<u32>) -> Result<bool> {
        Ok(false)
    }

    /// Peers of the next phase whose cards have appeared (`next.ready`):
    /// connect to them ahead of the phase. Default: at the phase's begin.
    fn ahead(&mut self, _next: &Ahead<Self::Card>) -> Result<()> {
        Ok(())
    }

    /// The phase's steps are done: publish what it measured (`record`),
    /// before the round that ends it.
    fn end(&mut self, view: &PhaseView, record: &PhaseRecord) -> Result<()>;
}

/// One phase as this process sees it now.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PhaseView {
    pub phase: usize,
    pub me: u32,
    /// This process's first phase (it connects to every member).
    pub first: bool,
    /// The plan's last phase.
    pub last: bool,
    /// The phase's members: the plan's, without processes agreed dead.
    pub members: BTreeSet<u32>,
    /// Members not gone in the phase so far (the same on every survivor).
    pub active: BTreeSet<u32>,
    /// The phase's joiners (ranks whose process starts in it).
    pub joiners: BTreeSet<u32>,
    /// The other members as (rank, NIXL agent name): a remote view's elements.
    pub agents: Vec<(u32, String)>,
    /// Processes of the phase before, as (rank, incarnation), that are not
    /// the same live process here (left, died, or their id was taken).
    pub departed: Vec<(u32, usize)>,
}

impl PhaseView {
    /// Whether this rank is the lowest active one: it logs progress.
    pub fn reporter(&self) -> bool {
        lowest(&self.active) == self.me
    }
}

/// The next phase's peers whose cards are in the store, handed to
/// [`PhaseWork::ahead`] once each.
pub struct Ahead<C> {
    pub phase: usize,
    pub ready: Vec<Peer<C>>,
    /// The next phase's other members as (rank, agent), as known now.
    pub agents: Vec<(u32, String)>,
    /// Whether every peer the phase brings has been handed over.
    pub complete: bool,
}

/// What one unit of work found beyond success.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StepOutcome {
    /// Ranks this unit's kernels masked: a wait on them passed the fault
    /// timeout.
    pub masked: BTreeSet<u32>,
    /// GPU time of the first masking wait, ns.
    pub waited_ns: Option<u64>,
    /// Calls or steps lost to a death inside the unit (not verified, never
    /// counted as right).
    pub lost: u32,
}

/// A decision that removed ranks, as [`PhaseWork::apply`] gets it.
#[derive(Clone, Debug)]
pub struct Change {
    /// The ranks it removed.
    pub new: BTreeSet<u32>,
    /// The unit after which it came (`None`: the round that opened the phase).
    pub after: Option<u64>,
    /// When this process adopted it.
    pub at: Instant,
}

/// How this process found one rank gone.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Detection {
    pub rank: u32,
    /// The unit whose agreement named it (none: the opening round).
    pub step: Option<u64>,
    /// GPU time this rank's kernels waited on it before masking it, ms
    /// (none when they did not: the agreement or a notice named it).
    pub wait_ms: Option<f64>,
    /// From the launcher's kill or notice to this process adopting the
    /// decision, ms (host clocks of one machine; none without our launcher).
    pub after_kill_ms: Option<f64>,
    /// From this process's report to its reading the decision, ms.
    pub agree_ms: f64,
}

/// What one phase was like on this process.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PhaseRecord {
    pub phase: usize,
    /// Units run.
    pub steps: u64,
    pub lost: u32,
    /// Every rank gone in the phase.
    pub gone: BTreeSet<u32>,
    pub detections: Vec<Detection>,
    /// Agreement time of each decision that removed ranks, ms.
    pub agree_ms: Vec<f64>,
    /// Ranks masked by some survivor but found alive (late), summed over rounds.
    pub forgiven: u32,
    /// Units after a decision whose kernels masked a rank that decision had
    /// already removed: they waited on it again (0 when masks are honoured).
    pub waits_on_gone: u64,
    /// Host time from the phase's begin to its opening decision, ms (a
    /// joiner's wait for the phase before left out).
    pub connect_ms: f64,
    /// Host time spent connecting ahead to the next phase's peers, ms.
    pub ahead_ms: f64,
    /// Host time of each unit with its agreement, ms: before the phase's
    /// first decision that removed ranks, and after it.
    pub step_ms_before: Vec<f64>,
    pub step_ms_after: Vec<f64>,
}

/// Runs every phase of this process's life over `work`; `card` is what it
/// publishes. Returns each phase's record.
pub fn drive<W: PhaseWork>(
    el: &Membership,
    work: &mut W,
    card: &W::Card,
) -> Result<Vec<PhaseRecord>> {
    let mut records = Vec::new();
    let mut ahead = Pacer::new(el.life().start);
    for i in el.life() {
        let mut rec = PhaseRecord {
            phase: i,
            ..Default::default()
        };
        let mut view = begin(el, work, card, i, &mut ahead, &mut rec)?;
        ahead = Pacer::new(i + 1);
        steps(el, work, &mut view, &mut ahead, &mut rec)?;
        work.end(&view, &rec)?;
        crate::stall::waiting_on(format!("the round that ends phase {i}"));
        let end = el.end_phase(i)?;
        if !end.new.is_empty() {
            say!("{}", decision_line(el.rank(), i, &end));
            rec.gone.extend(end.new);
        }
        say!("{}", phase_line(el.rank(), &rec));
        records.push(rec);
    }
    Ok(records)
}

/// Phase `i`'s view as this process knows it now.
fn view_of(el: &Membership, i: usize) -> PhaseView {
    PhaseView {
        phase: i,
        me: el.rank(),
        first: i == el.life().start,
        last: i + 1 == el.plan().len(),
        members: el.members(i),
        active: el.active(i),
        joiners: el.plan().joiners(i),
        agents: el.agents(i),
        departed: el.departed(i),
    }
}

/// Begins phase `i`: cards, connections, the work's views, the opening
/// round. Returns the phase's view after that round.
fn begin<W: PhaseWork>(
    el: &Membership,
    work: &mut W,
    card: &W::Card,
    i: usize,
    ahead: &mut Pacer,
    rec: &mut PhaseRecord,
) -> Result<PhaseView> {
    let t0 = Instant::now();
    crate::stall::at(i, "its begin");
    let new = el.begin_phase(i, card, || ahead.look(el, work))?;
    rec.ahead_ms = ahead.ms;
    let view = view_of(el, i);
    let failed = work.connect(&view, &new.peers)?;
    let mut unreachable = new.gone.clone();
    for (r, e) in failed {
        let p = (new.peers.iter()).find(|p| p.rank == r);
        let inc = p.map_or(i, |p| p.incarnation);
        // Died while we connected: the opening round agrees on it.
        match el.survives() && el.is_dead(r, inc)? {
            true => unreachable.insert(r),
            false => return Err(el.blame(r, inc, e)),
        };
    }
    work.enter(&view, &unreachable)?;
    crate::stall::waiting_on(format!("the round that opens phase {i}"));
    let d = el.opened(i, &unreachable)?;
    rec.connect_ms = (t0.elapsed() - new.waited).as_secs_f64() * 1e3;
    let view = view_of(el, i);
    if !d.gone.is_empty() {
        say!("{}", decision_line(el.rank(), i, &d));
        record_gone(el, rec, &d, None, &StepOutcome::default())?;
        let change = Change {
            new: d.gone.clone(),
            after: None,
            at: Instant::now(),
        };
        work.apply(&view, &change)?;
    }
    Ok(view)
}

/// Phase `view.phase`'s units, each followed by the agreement.
fn steps<W: PhaseWork>(
    el: &Membership,
    work: &mut W,
    view: &mut PhaseView,
    ahead: &mut Pacer,
    rec: &mut PhaseRecord,
) -> Result<()> {
    let (i, n) = (view.phase, work.steps(view));
    let mut masked: BTreeSet<u32> = BTreeSet::new();
    for k in 0..n {
        crate::stall::at(i, format!("step {k} of {n}"));
        crate::stall::waiting_on(format!("step {k}'s work"));
        let t0 = Instant::now();
        if el.survives() {
            el.steps_begin(i)?;
        }
        let out = work.step(view, k)?;
        rec.steps += 1;
        rec.lost += out.lost;
        if !el.survives() {
            // A death fails the run: the kernels' waits name it, no round.
            continue;
        }
        if !out.masked.is_disjoint(&rec.gone) {
            rec.waits_on_gone += 1;
        }
        let others: Vec<u32> = (view.active.iter().copied())
            .filter(|&r| r != view.me)
            .collect();
        masked.extend(&out.masked);
        masked.extend(el.found_dead(&others, i)?);
        crate::stall::waiting_on(format!("the agreement after step {k} of phase {i}"));
        let d = agree(el, work, view, k, &masked)?;
        masked.retain(|r| d.gone.contains(r));
        rec.forgiven += d.forgiven.len() as u32;
        let changed = decided(el, work, view, k, &d, &out, rec)?;
        let ms = t0.elapsed().as_secs_f64() * 1e3;
        match rec.gone.is_empty() && !changed {
            true => rec.step_ms_before.push(ms),
            false if !changed => rec.step_ms_after.push(ms),
            false => {}
        }
        ahead.look(el, work)?;
    }
    Ok(())
}

/// The agreement after unit `k`, with the resynchronisation round when the
/// decision forgave late ranks and the work put state back.
fn agree<W: PhaseWork>(
    el: &Membership,
    work: &mut W,
    view: &PhaseView,
    k: u64,
    masked: &BTreeSet<u32>,
) -> Result<Decision> {
    let i = view.phase;
    let mut d = el.agree(i, k, masked)?;
    if d.forgiven.is_empty() {
        return Ok(d);
    }
    say!("{}", decision_line(el.rank(), i, &d));
    if work.resync(&view_of(el, i), k, &d.forgiven)? {
        tracing::info!(
            "phase {i}: resynchronised with rank(s) {:?} after step {k}",
            d.forgiven
        );
        // A rank lost during the resynchronisation is gone from here on.
        let again = el.agree(i, RESYNC | k, &BTreeSet::new())?;
        d.new.extend(again.new);
        (d.gone, d.survivors) = (again.gone, again.survivors);
    }
    Ok(d)
}

/// After unit `k`'s decision `d`: a change goes to the work and the
/// record. Returns whether it removed ranks.
fn decided<W: PhaseWork>(
    el: &Membership,
    work: &mut W,
    view: &mut PhaseView,
    k: u64,
    d: &Decision,
    out: &StepOutcome,
    rec: &mut PhaseRecord,
) -> Result<bool> {
    if d.new.is_empty() {
        return Ok(false);
    }
    say!("{}", decision_line(el.rank(), view.phase, d));
    record_gone(el, rec, d, Some(k), out)?;
    *view = view_of(el, view.phase);
    let change = Change {
        new: d.new.clone(),
        after: Some(k),
        at: Instant::now(),
    };
    work.apply(view, &change)?;
    Ok(true)
}

/// Records decision `d` (after unit `after`) in `rec`: the ranks it
/// removed, each with how it was found.
fn record_gone(
    el: &Membership,
    rec: &mut PhaseRecord,
    d: &Decision,
    after: Option<u64>,
    out: &StepOutcome,
) -> Result<()> {
    let now = unix_ns();
    let agree_ms = d.waited_us as f64 / 1e3;
    rec.agree_ms.push(agree_ms);
    for &r in &d.new {
        let killed = el.died_at(rec.phase, r)?;
        rec.detections.push(Detection {
            rank: r,
            step: after,
            wait_ms: (out.masked.contains(&r)).then(|| out.waited_ns.unwrap_or(0) as f64 / 1e6),
            after_kill_ms: killed.map(|t| now.saturating_sub(t) as f64 / 1e6),
            agree_ms,
        });
    }
    rec.gone.extend(&d.new);
    Ok(())
}

/// Connecting ahead to the next phase's peers: their cards read at most
/// every [`Pacer::EVERY`], each handed to the work once.
struct Pacer {
    next: usize,
    last: Option<Instant>,
    handed: BTreeSet<(u32, usize)>,
    done: bool,
    ms: f64,
}

impl Pacer {
    const EVERY: Duration = Duration::from_millis(10);

    fn new(next: usize) -> Self {
        Self {
            next,
            last: None,
            handed: BTreeSet::new(),
            done: false,
            ms: 0.0,
        }
    }

    /// One look, unless the last was under [`Pacer::EVERY`] ago.
    fn look<W: PhaseWork>(&mut self, el: &Membership, work: &mut W) -> Result<()> {
        if self.done || self.last.is_some_and(|t| t.elapsed() < Self::EVERY) {
            return Ok(());
        }
        if !el.life().contains(&self.next) {
            self.done = true;
            return Ok(());
        }
        let t0 = Instant::now();
        let first = self.last.replace(t0).is_none();
        let handed = &self.handed;
        let ready = el.ready_peers::<W::Card>(self.next, |r, inc| handed.contains(&(r, inc)))?;
        self.done = ready.missing.is_empty();
        if first || !ready.peers.is_empty() {
            self.handed
                .extend(ready.peers.iter().map(|p| (p.rank, p.incarnation)));
            work.ahead(&Ahead {
                phase: self.next,
                ready: ready.peers,
                agents: el.agents(self.next),
                complete: self.done,
            })?;
        }
        self.ms += t0.elapsed().as_secs_f64() * 1e3;
        Ok(())
    }
}

/// `[rank 1] phase 2: ranks gone: [2] (agreed by 3 of 3 survivors, …)`,
/// and the ranks masked but found alive, if any.
pub fn decision_line(me: u32, i: usize, d: &Decision) -> String {
    let forgiven = match d.forgiven.is_empty() {
        true => String::new(),
        false => format!("; masked but alive, only late: {:?}", d.forgiven),
    };
    format!(
        "[rank {me}] phase {i}: ranks gone: {:?} (agreed by {} of {} survivors, decided by rank {} {} µs after my \
         report{forgiven})",
        d.gone.iter().collect::<Vec<_>>(),
        d.reports,
        d.survivors,
        d.leader,
        d.waited_us
    )
}

/// `[rank 1] phase 0 done: 400 steps, 0 lost; gone: [2] (after step 17);
/// steps that waited on a rank already gone: 0; step p50 2.1 ms before, 2.0
/// after`: what a survivor prints at each phase's end.
pub fn phase_line(me: u32, r: &PhaseRecord) -> String {
    let p50 = |v: &[f64]| crate::stats::Summary::of(v).p50_ns;
    let mut line = format!(
        "[rank {me}] phase {} done: {} steps, {} lost",
        r.phase, r.steps, r.lost
    );
    if !r.gone.is_empty() {
        let after: Vec<String> = (r.detections.iter())
            .map(|d| match d.step {
                Some(k) => format!("rank {} after step {}", d.rank, round_name(k)),
                None => format!("rank {} when the phase opened", d.rank),
            })
            .collect();
        line.push_str(&format!(
            "; gone: {:?} ({}); steps after a decision that waited on a rank already gone: {}",
            r.gone.iter().collect::<Vec<_>>(),
            after.join(", "),
            r.waits_on_gone
        ));
    }
    if !r.step_ms_before.is_empty() {
        line.push_str(&format!("; step p50 {:.2} ms", p50(&r.step_ms_before)));
        if !r.step_ms_after.is_empty() {
            line.push_str(&format!(" before, {:.2} ms after", p50(&r.step_ms_after)));
        }
    }
    line
}
