//! The membership of an N-rank run over the store: which processes are
//! members of each phase, the agreement on who is gone, and how a phase
//! opens and ends — on top of the run's [`Group`] (heartbeats, probes,
//! aborts, cleanup). It knows no plan of deaths: any member may die or
//! freeze at any moment (inside a kernel, during an agreement round, while
//! the others connect to it, during its own join), and the survivors find
//! it, agree on it and go on ([`OnDeath::Survive`]), or stop naming it
//! ([`OnDeath::Fail`]). The [`Plan`] only says who is started when, and who
//! leaves cleanly; the launcher alone knows whom it will kill.
//!
//! A process of rank `me` started in phase `inc` (its *incarnation*) lives
//! the phases [`Membership::life`]. For each phase `i`:
//!
//! 1. [`Membership::begin_phase`]: in its first phase the process publishes its
//!    payload (what the others need to connect to it: agent metadata, a
//!    window descriptor) under `rank/<me>.<inc>/peer` and gets every other
//!    member's; later it gets only the phase's joiners'. A joiner first
//!    learns from the decision that ended the phase before which processes
//!    are dead. A peer that dies before its payload appears is returned as
//!    gone. The caller drops [`Membership::departed`]'s processes and connects
//!    to the peers.
//! 2. [`Membership::opened`]: the first round of agreement, over the peers
//!    this process could not reach: the barrier of the phase's members.
//! 3. Steps; after each, [`Membership::agree`]: every active rank reports the
//!    ranks it masked (cumulative within the phase); the **leader** — the
//!    lowest active rank that this process neither masked nor suspects —
//!    waits for the report of every active rank not yet in the union. A
//!    rank joins the union when its report does not come and there is
//!    proof that it is dead: the launcher's notice (`dead/<r>.<inc>`, a
//!    process it saw die or stop, read at once), or, where no launcher
//!    watches (torchrun), a heartbeat that stands still (see `lead`). A rank
//!    in the union that reports all the same is alive, only late (it
//!    waited on the dead one itself), and is *forgiven*. The leader
//!    publishes the gone set and the forgiven one with compare-and-set (one
//!    decision however many believe they lead), and every rank adopts it. A
//!    rank that finds itself in the decision stops (exit 1). A leader that
//!    dies is passed over: the next lowest takes over and counts it gone.
//! 4. [`Membership::end_phase`]: the last round of the phase, over nothing:
//!    its decision fixes the phase's survivors, and tells the launcher and
//!    the next phase's joiners who is dead.
//!
//! Every round, those that open and end a phase included, is the same
//! agreement, so a death at any moment is found by the next one. Keys:
//! `super::keys`' table. Silence is the agreement's to judge: in a
//! surviving run the group's probe watches nobody's heartbeat; under
//! [`OnDeath::Fail`] it watches the phase's members, and a silent one ends
//! any wait with its name. Under our launcher a process that is still
//! starting (its first phase, up to and including that phase's opening
//! round) is proven dead by the launcher's notice alone, never by its
//! silence: a live process's start can hold its heartbeat still for longer
//! than the probe's limit (`Membership::silence_proves`).
//!
//! The files, by concern: this one holds the state and what a process
//! knows of each phase's members; `phase` how a phase begins and ends;
//! `agree` the rounds of agreement; `proof` what proves a member dead.

mod agree;
mod phase;
mod proof;
#[cfg(test)]
mod tests;

use std::collections::BTreeSet;
use std::ops::Range;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow, bail};

use super::group::{Group, process_name};
pub use super::keys::{Death, Report, Verdict};
use super::plan::Plan;
use crate::group::BEAT;

/// The lowest of `ranks`: the member that logs, shows progress and writes
/// the report (rank 0 may die too; then the next one does).
pub fn lowest(ranks: &BTreeSet<u32>) -> u32 {
    ranks.iter().next().copied().unwrap_or(0)
}

/// Wall-clock time, ns since the Unix epoch (how death notices are stamped).
pub fn unix_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// The agreement round that opens phase `i` (its step number).
pub const OPEN: u64 = 1 << 61;
/// The agreement round that ends phase `i`.
pub const END: u64 = 1 << 60;
/// Marks the round that follows a resynchronisation (the step's number
/// with this bit set).
pub const RESYNC: u64 = 1 << 62;

/// What the members do when one of them dies or freezes.
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    clap::ValueEnum,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum OnDeath {
    /// The survivors mask it, agree that it is gone and go on.
    #[default]
    Survive,
    /// The run stops, every survivor naming it (within about 4 s).
    Fail,
}

/// `--fault-timeout MS` (`ep`'s, `collectives`'): at least 1 ms.
pub fn fault_timeout_arg(ms: i64) -> Result<Duration, crate::cli::UsageError> {
    match u64::try_from(ms) {
        Ok(ms) if ms > 0 => Ok(Duration::from_millis(ms)),
        _ => Err(crate::cli::UsageError(format!(
            "--fault-timeout {ms}: the wait for a rank before it counts as gone must be at least 1 ms"
        ))),
    }
}

/// `--fault-timeout`'s default: 1000 ms (how long a member waits on a
/// silent peer before it masks it).
pub const DEFAULT_FAULT_TIMEOUT_NS: u64 = 1_000_000_000;

/// A peer to connect to: its rank, its incarnation and what it published.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Peer<P> {
    pub rank: u32,
    pub incarnation: usize,
    pub payload: P,
}

/// The processes to connect to when a phase begins.
#[derive(Clone, Debug)]
pub struct Newcomers<P> {
    /// Those that published their payload.
    pub peers: Vec<Peer<P>>,
    /// Those that died before they did (the opening round agrees on them).
    pub gone: BTreeSet<u32>,
    /// How long a joiner waited for the phase before to end (zero for a
    /// member that stepped it).
    pub waited: Duration,
}

/// Peers that a phase will bring, looked up ahead of its begin
/// ([`Membership::ready_peers`]).
#[derive(Clone, Debug)]
pub struct Ready<P> {
    /// Those whose payload is in the store now.
    pub peers: Vec<Peer<P>>,
    /// Those whose payload is not (yet).
    pub missing: BTreeSet<u32>,
}

/// The decision after a round, as this process adopted it.
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

/// What a process remembers of the run and of its current phase.
#[derive(Default)]
struct PhaseState {
    phase: Option<usize>,
    gone: BTreeSet<u32>,
    /// Every process agreed dead in the run so far, as (rank, incarnation).
    dead: BTreeSet<(u32, usize)>,
    /// Keys of this phase this process wrote and others read (step
    /// decisions): deleted at the end of the next phase, as a rank that
    /// lags behind (and is about to learn it is gone) may still wait for
    /// them when this one ends.
    decided: Vec<String>,
    /// Those of the phase before.
    stale: Vec<String>,
    /// The launcher's death counter at the last look, and the processes
    /// whose notice was read.
    deaths_seen: i64,
    noticed: BTreeSet<(u32, usize)>,
    /// When [`Membership::found_dead`] may read the heartbeats next.
    next_silence_look: Option<Instant>,
    /// The phase's heartbeats as the lowest active rank (the likely
    /// leader) read them when the last steps began ([`Membership::steps_begin`]).
    steps_began: Option<(Clock, Beats)>,
}

/// One process's side of the membership (see the module docs).
pub struct Membership<'a> {
    group: &'a Group<'a>,
    plan: &'a Plan,
    me: u32,
    incarnation: usize,
    fault_timeout: Duration,
    on_death: OnDeath,
    state: Mutex<PhaseState>,
}

impl<'a> Membership<'a> {
    /// Rank `group.rank`'s process started in phase `incarnation` of
    /// `plan`; `fault_timeout` bounds the wait for a missing report where
    /// only heartbeats tell; `on_death` says what a death does. Errors when
    /// the plan does not start this rank in that phase.
    pub fn new(
        group: &'a Group<'a>,
        plan: &'a Plan,
        incarnation: usize,
        fault_timeout: Duration,
        on_death: OnDeath,
    ) -> Result<Self> {
        let me = group.rank;
        if plan.life(me, incarnation).is_empty() {
            bail!(
                "the plan does not start rank {me} in phase {incarnation} (NIXL_EP_INCARNATION): start the ranks \
                 with `ep --plan FILE`, which starts each as the plan says"
            );
        }
        if on_death == OnDeath::Survive {
            // Silence is the agreement's to judge from the start.
            group.watch_only(&[]);
        }
        Ok(Self {
            group,
            plan,
            me,
            incarnation,
            fault_timeout,
            on_death,
            state: Mutex::new(PhaseState::default()),
        })
    }

    /// Phases this process takes part in (by index), unless it dies.
    pub fn life(&self) -> Range<usize> {
        self.plan.life(self.me, self.incarnation)
    }

    /// The plan.
    pub fn plan(&self) -> &Plan {
        self.plan
    }

    /// The run's group this membership lives on.
    pub fn group(&self) -> &'a Group<'a> {
        self.group
    }

    /// This process's rank.
    pub fn rank(&self) -> u32 {
        self.me
    }

    /// The phase that started this process.
    pub fn incarnation(&self) -> usize {
        self.incarnation
    }

    /// Whether the run goes on after a death ([`OnDeath::Survive`]).
    pub fn survives(&self) -> bool {
        self.on_death == OnDeath::Survive
    }

    /// The members of phase `i` as this process knows them: the plan's,
    /// without the processes agreed dead so far.
    pub fn members(&self, i: usize) -> BTreeSet<u32> {
        let st = self.state();
        (self.plan.members(i).into_iter())
            .filter(|&r| !st.dead.contains(&(r, self.inc(r, i))))
            .collect()
    }

    /// The (rank, agent) pairs of phase `i`'s other members as this process
    /// knows them now: the elements of its remote view in that phase (each
    /// process of a rank id has its own agent, [`Group::agent_name`]).
    pub fn agents(&self, i: usize) -> Vec<(u32, String)> {
        (self.members(i).into_iter())
            .filter(|&r| r != self.me)
            .filter_map(|r| Some((r, self.group.agent_name(r, self.plan.incarnation(r, i)?))))
            .collect()
    }

    /// Phase `i`'s members still active now (not gone in the phase).
    pub fn active(&self, i: usize) -> BTreeSet<u32> {
        let gone = self.state().gone.clone();
        &self.members(i) - &gone
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

    /// Makes the group's probe watch `ranks` of phase `i` when a death
    /// fails the run; in a surviving run it watches nobody (silence is the
    /// agreement's to judge).
    fn watch(&self, ranks: &BTreeSet<u32>, i: usize) {
        match self.on_death {
            OnDeath::Fail => self.group.watch_only(&self.names(ranks.iter().copied(), i)),
            OnDeath::Survive => self.group.watch_only(&[]),
        }
    }

    /// The processes of `ranks` in phase `i`, as the group names them.
    fn names(&self, ranks: impl IntoIterator<Item = u32>, i: usize) -> Vec<(usize, String)> {
        (ranks.into_iter())
            .map(|r| (r as usize, process_name(r, self.inc(r, i))))
            .collect()
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
}

/// How long one wait inside the agreement lasts before it looks at the
/// launcher's notices again.
const WAIT: Duration = Duration::from_millis(20);

/// `812`, or what a special round is called.
pub fn round_name(step: u64) -> String {
    match step {
        OPEN => "open".into(),
        END => "end".into(),
        s if s & RESYNC != 0 => format!("resync after {}", s & !RESYNC),
        s => s.to_string(),
    }
}

/// `rank 2`, `ranks 1, 3`.
fn ranks_named(ranks: &BTreeSet<u32>) -> String {
    let list: Vec<String> = ranks.iter().map(u32::to_string).collect();
    match list.len() {
        1 => format!("rank {}", list[0]),
        _ => format!("ranks {}", list.join(", ")),
    }
}

/// Heartbeat counters by member, as read at one moment.
type Beats = std::collections::BTreeMap<usize, i64>;

/// A limit counted from a moment both in wall time and in our own
/// heartbeats, so that it stretches when the machine is too busy to run us.
pub(super) struct Clock {
    pub(super) at: Instant,
    pub(super) beats: u64,
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
