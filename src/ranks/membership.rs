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

use std::collections::BTreeSet;
use std::ops::Range;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow, bail};

use super::group::{Group, process_name};
pub use super::keys::{Death, Report, Verdict};
use super::plan::Plan;
use crate::deadline::{Pace, poll};
use crate::group::{BEAT, Dismissed, PROBE_EVERY, Value};

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

/// How often a wait inside the agreement looks again for the proof that a
/// rank it waits on is dead: the launcher's notice is one request.
const LOOK: Duration = Duration::from_millis(2);

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

    /// Steps of phase `i` are about to run: the lowest active rank, which
    /// will most likely lead the agreement after them, reads the phase's
    /// heartbeats now (one request). Where no launcher's notice proves a
    /// death (torchrun), a rank masked in those steps was waited on for the
    /// fault timeout, so by the agreement its heartbeat has had the time to
    /// show whether it still beats: the leader then decides at once.
    pub fn steps_begin(&self, i: usize) -> Result<()> {
        let active = &self.members(i) - &self.phase_gone(i)?;
        let lowest = active.iter().next() == Some(&self.me);
        let snapshot = match lowest && !self.group.launcher {
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

    /// Makes the group's probe watch `ranks` of phase `i` when a death
    /// fails the run; in a surviving run it watches nobody (silence is the
    /// agreement's to judge).
    fn watch(&self, ranks: &BTreeSet<u32>, i: usize) {
        match self.on_death {
            OnDeath::Fail => self.group.watch_only(&self.names(ranks.iter().copied(), i)),
            OnDeath::Survive => self.group.watch_only(&[]),
        }
    }

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
    fn to_connect(&self, i: usize) -> BTreeSet<u32> {
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
    fn await_phase_end(
        &self,
        i: usize,
        mut meanwhile: impl FnMut() -> Result<()>,
    ) -> Result<Verdict> {
        let g = self.group;
        let ended = g.keys.decision(i, END);
        let what = format!("the end of phase {i}");
        let (mut rounds, mut moved) = (-1, Instant::now());
        loop {
            if let Some(v) = g.try_get(&ended)? {
                return Ok(v);
            }
            meanwhile()?;
            let now = g.add(&g.keys.rounds(i), 0)?;
            if now != rounds {
                (rounds, moved) = (now, Instant::now());
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
        poll(
            g.timeout(),
            Pace::Every(Duration::ZERO),
            || {
                if let Some(p) = g.try_get(entry)? {
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

    /// Which of `ranks` (members of phase `i`) are proven dead now: the
    /// launcher noticed them, or (read at most every [`PROBE_EVERY`]) their
    /// heartbeat stood still for the probe's limit. What a process without
    /// kernels to time out masks (`--check-connection`).
    pub fn found_dead(&self, ranks: &[u32], i: usize) -> Result<BTreeSet<u32>> {
        let mut dead = self.noticed_among(ranks, i)?;
        let now = Instant::now();
        let due = self.state().next_silence_look.is_none_or(|t| now >= t);
        if due {
            self.state().next_silence_look = Some(now + PROBE_EVERY);
            let silent = self
                .group
                .silent_among(&self.names(ranks.iter().copied(), i))?;
            dead.extend(silent.into_iter().map(|r| r as u32));
        }
        Ok(dead)
    }

    /// Whether process `<r>.<inc>` is proven dead while the current phase
    /// begins: the launcher's notice (one request, every call), or, at
    /// most every [`PROBE_EVERY`] (`next_look`), a heartbeat silent for the
    /// probe's limit where silence proves it ([`Self::silence_proves`]).
    fn proven_dead(&self, r: u32, inc: usize, next_look: &mut Instant) -> Result<bool> {
        if self.noticed(r, inc)? {
            return Ok(true);
        }
        let phase = self.state().phase;
        let starting = phase.is_some_and(|i| !self.silence_proves(inc, i, None));
        if starting || Instant::now() < *next_look {
            return Ok(false);
        }
        *next_look = Instant::now() + PROBE_EVERY;
        let name = [(r as usize, process_name(r, inc))];
        Ok(!self.group.silent_among(&name)?.is_empty())
    }

    /// Whether process `<r>.<inc>`, which we failed to reach, is dead: the
    /// launcher's notice, or its heartbeat silent for the probe's limit
    /// (where silence proves it: not for a process still starting under
    /// our launcher, see the module docs); looked for up to that limit and
    /// a second more (a live peer's failure is then ours to report).
    pub fn is_dead(&self, r: u32, inc: usize) -> Result<bool> {
        let until = Instant::now() + crate::group::SILENT_AFTER + Duration::from_secs(1);
        let mut next_look = Instant::now();
        while Instant::now() < until {
            if self.proven_dead(r, inc, &mut next_look)? {
                return Ok(true);
            }
            std::thread::sleep(WAIT);
        }
        Ok(false)
    }

    /// Whether the launcher noticed process `<r>.<inc>` die or stop.
    fn noticed(&self, r: u32, inc: usize) -> Result<bool> {
        Ok(self.death(r, inc)?.is_some())
    }

    /// Whether a heartbeat silent for the probe's limit proves that a
    /// process started in phase `inc` died, judged in phase `i`'s round
    /// `step` (`None`: while the phase begins, before its rounds). Where no
    /// launcher watches, always: silence is the only evidence there. Under
    /// our launcher, not while the process is starting, that is in its
    /// first phase up to and including the phase's opening round: a
    /// starting process loads NIXL and UCX, creates its agent and makes its
    /// first connections, and on a loaded machine its heartbeat can stand
    /// still for longer than the limit while it is alive. That stall is its
    /// own, so our beats, which stretch the limit when the whole machine is
    /// slow, do not stretch with it (a joiner whose card came late, its
    /// heartbeat standing still meanwhile, was once agreed gone this way).
    /// The launcher sees a child die or stop at once and writes its notice,
    /// so a starting process that dies is still named at once.
    fn silence_proves(&self, inc: usize, i: usize, step: Option<u64>) -> bool {
        !self.group.launcher || inc != i || step.is_some_and(|s| s != OPEN)
    }

    /// Those of `ranks` (members of phase `i`) whose silence may prove them
    /// dead in round `step` ([`Self::silence_proves`]), as the group names
    /// their processes.
    fn judged_by_silence(
        &self,
        ranks: impl IntoIterator<Item = u32>,
        i: usize,
        step: u64,
    ) -> Vec<(usize, String)> {
        let judged = ranks
            .into_iter()
            .filter(|&r| self.silence_proves(self.inc(r, i), i, Some(step)));
        self.names(judged, i)
    }

    /// The launcher's notice of process `<r>.<inc>`'s death, if it wrote one.
    pub fn death(&self, r: u32, inc: usize) -> Result<Option<Death>> {
        self.group.try_get(&self.group.keys.death(r, inc))
    }

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
    /// fail the run ([`OnDeath::Fail`]), no decision within the run's
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
    fn adopt(&self, i: usize, step: u64, verdict: Verdict, waited_us: u64) -> Result<Decision> {
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
        let what = format!("the decision after round {} of phase {i}", round_name(step));
        let mut suspects: BTreeSet<u32> = round.mine.clone();
        let mut watch = Fallback::new(PROBE_EVERY);
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
                anyhow!(
                    "no decision on who is gone after round {} of phase {i} within {waited:.0?}",
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
    fn passed_over(&self, round: &Round, leader: u32, watch: &mut Fallback) -> Result<bool> {
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

    /// Which of `ranks` (members of phase `i`) the launcher noticed dead:
    /// one request (its death counter) unless a death is new since the
    /// last look; nothing where no launcher watches (torchrun).
    fn noticed_among(&self, ranks: &[u32], i: usize) -> Result<BTreeSet<u32>> {
        let g = self.group;
        if !g.launcher {
            return Ok(BTreeSet::new());
        }
        let deaths = g.add(&g.keys.deaths(), 0)?;
        let fresh = std::mem::replace(&mut self.state().deaths_seen, deaths) != deaths;
        if fresh {
            // A new notice: read those of every process of this phase and
            // the next (rare: once per death). The next phase's joiners run
            // already, and one that dies before it begins is a member whose
            // notice no later move of the counter would make us read.
            let mut found = BTreeSet::new();
            for p in self.processes_of(i..(i + 2).min(self.plan.len())) {
                if self.noticed(p.0, p.1)? {
                    found.insert(p);
                }
            }
            self.state().noticed.extend(found);
        }
        let st = self.state();
        Ok((ranks.iter().copied())
            .filter(|&r| st.noticed.contains(&(r, self.inc(r, i))))
            .collect())
    }

    /// The processes, as (rank, incarnation), that are members of the
    /// `phases`, not yet known to be noticed dead.
    fn processes_of(&self, phases: Range<usize>) -> BTreeSet<(u32, usize)> {
        let st = self.state();
        (phases.flat_map(|j| self.plan.members(j).into_iter().map(move |r| (r, j))))
            .map(|(r, j)| (r, self.inc(r, j)))
            .filter(|p| !st.noticed.contains(p))
            .collect()
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
    /// waiting for every active rank not in it. One the launcher noticed
    /// dead joins the union at once; where no launcher watches, one whose
    /// heartbeat falls silent, or whose report does not come within the
    /// fault timeout while its heartbeat stands still. Then the masked
    /// ranks are heard (`hear_the_masked`). Publishes the decision
    /// (compare-and-set) and returns the one that won. Errors: a rank that
    /// keeps beating but never reports, past the run's timeout (stuck).
    fn lead(&self, round: &Round) -> Result<Verdict> {
        let g = self.group;
        let (i, step) = (round.i, round.step);
        let mut union: BTreeSet<u32> = &self.phase_gone(i)? | &round.mine;
        let mut heard = BTreeSet::from([self.me]);
        let mut watch = Fallback::new(Duration::ZERO);
        loop {
            let missing = self.collect_reports(round, &mut union, &mut heard)?;
            if missing.is_empty() {
                break;
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
    fn proven_gone(
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
    fn decide(
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
    fn hear_the_masked(
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

    /// When the launcher killed or saw the death of rank `r`'s process of
    /// phase `i` (unix ns), if it did and said so.
    pub fn died_at(&self, i: usize, r: u32) -> Result<Option<u64>> {
        Ok(self.death(r, self.inc(r, i))?.map(|d| d.at_ns))
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

/// The heartbeat fallback's pace inside one wait: when it may look next,
/// and the heartbeats at its first look.
struct Fallback {
    next: Instant,
    every: Duration,
    before: Option<Beats>,
}

impl Fallback {
    fn new(first_after: Duration) -> Self {
        Self {
            next: Instant::now() + first_after,
            every: PROBE_EVERY,
            before: None,
        }
    }

    /// Whether a look is due now (and if so, the next one is scheduled).
    fn due(&mut self) -> bool {
        if Instant::now() < self.next {
            return false;
        }
        self.next = Instant::now() + self.every;
        true
    }
}

/// Without the launcher's notices: the windows of two beats over which a
/// masked rank's heartbeat must move to count as alive.
struct Windows {
    base: Beats,
    window: Clock,
    round: usize,
}

impl Windows {
    fn start(el: &Membership, round: &Round, open: &BTreeSet<u32>) -> Result<Self> {
        let began = el.state().steps_began.take();
        let (base, window) = match began {
            Some(b) => (b.1, b.0),
            None if el.group.launcher => (Beats::new(), Clock::start(el.group)),
            None => (
                el.group
                    .heartbeats_of(&el.names(open.iter().copied(), round.i))?,
                Clock::start(el.group),
            ),
        };
        Ok(Self {
            base,
            window,
            round: round.i,
        })
    }

    /// Once the window passed: keeps in `open` the ranks whose heartbeat
    /// moved within it (alive, waited for), drops those still or whose key
    /// is gone (they left), and starts the next window.
    fn judge(&mut self, el: &Membership, open: &mut BTreeSet<u32>) -> Result<()> {
        let g = el.group;
        if !self.window.passed(g, 2 * BEAT) {
            return Ok(());
        }
        let now = g.heartbeats_of(&el.names(open.iter().copied(), self.round))?;
        open.retain(|r| {
            let at = now.get(&(*r as usize));
            at.is_some() && at != self.base.get(&(*r as usize))
        });
        (self.base, self.window) = (now, Clock::start(g));
        Ok(())
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
    use crate::group::Bytes;
    use crate::ranks::env::RankEnv;
    use crate::store::Store;
    use crate::store::memory::MemoryStore;

    const PROGRAM: crate::ranks::Program = crate::ranks::Program {
        name: "test",
        namespace: "nixl_test",
    };

    /// Rank `r` of `world` under torchrun (no launcher's notices: the
    /// heartbeats tell), rank 0 hosting the store.
    fn env(r: u32, world: u32) -> RankEnv {
        let vars = [
            ("RANK", r.to_string()),
            ("WORLD_SIZE", world.to_string()),
            ("MASTER_PORT", "1".to_string()),
        ];
        RankEnv::from_vars(PROGRAM, |k| {
            vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone())
        })
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
        on_death: OnDeath,
        absent: Option<u32>,
        masked: impl Fn(u32) -> BTreeSet<u32> + Sync,
        rest: impl Fn(&Membership, Decision) -> Result<T> + Sync,
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
                            let e = Membership::new(&g, plan, 0, Duration::from_secs(2), on_death)?;
                            let new = e.begin_phase(0, &Bytes(vec![r as u8]), || Ok(()))?;
                            assert_eq!(new.peers.len(), plan.members(0).len() - 1);
                            assert!(new.peers.iter().all(|p| p.payload.0 == [p.rank as u8]));
                            e.opened(0, &new.gone)?;
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

    /// Ends phase 0 and returns the step's decision (`phase0`'s `rest`).
    fn end_phase(e: &Membership, d: Decision) -> Result<Decision> {
        e.end_phase(0)?;
        Ok(d)
    }

    const SURVIVE: OnDeath = OnDeath::Survive;

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
        let out = phase0(&store, &plan, SURVIVE, None, |_| BTreeSet::new(), end_phase);
        for d in &out {
            let d = d.as_ref().unwrap();
            assert!(d.gone.is_empty() && d.new.is_empty());
            assert_eq!((d.leader, d.reports, d.survivors), (0, 3, 3));
        }
        assert_eq!(store.keys(), Vec::<String>::new(), "keys left behind");
    }

    /// Rank 2 (killed by the plan) ends after connecting; rank 1 masked
    /// it, so the union has it, and no report comes: it is gone.
    #[test]
    fn a_masked_rank_that_never_reports_is_in_every_survivors_decision() {
        let store = MemoryStore::new(Duration::from_secs(30));
        let plan = Plan::parse("[[0,1,-2]]").unwrap();
        let out = phase0(&store, &plan, SURVIVE, Some(2), masks(1, 2), end_phase);
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
        let out = phase0(&store, &plan, SURVIVE, None, masks(0, 1), end_phase);
        for d in &out {
            let d = d.as_ref().unwrap();
            assert!(d.gone.is_empty(), "{d:?}");
            assert_eq!(d.forgiven, BTreeSet::from([1]));
            assert_eq!((d.reports, d.survivors), (3, 3));
        }
        assert_eq!(store.keys(), Vec::<String>::new(), "keys left behind");
    }

    /// A member that dies is agreed gone and the survivors end the phase
    /// without it (the membership knows no plan); where deaths fail the
    /// run, every survivor fails naming it.
    #[test]
    fn a_death_is_survived_or_named() {
        for on_death in [OnDeath::Survive, OnDeath::Fail] {
            let store = MemoryStore::new(Duration::from_secs(30));
            let plan = Plan::fixed(3);
            let out = phase0(&store, &plan, on_death, Some(1), masks(0, 1), |e, d| {
                assert_eq!(d.gone, BTreeSet::from([1]));
                e.end_phase(0)
            });
            for r in [0, 2] {
                match (on_death, &out[r]) {
                    (OnDeath::Survive, Ok(end)) => assert_eq!(end.survivors, 2),
                    (OnDeath::Fail, Err(e)) => {
                        assert!(
                            format!("{e:#}").contains("rank 1 stopped responding in phase 0"),
                            "{e:#}"
                        )
                    }
                    (_, other) => panic!("{on_death:?}: rank {r}: {other:?}"),
                }
            }
        }
    }

    /// Connecting ahead (plan `[[0,1],[0,1,2]]`): while the members step
    /// phase 0, rank 2's payload is missing until it publishes, then ready;
    /// rank 2, waiting for phase 0 to end, finds both members' payloads
    /// ready (phase 0 goes on until it has); at phase 1's begin each gets
    /// what it connected to ahead.
    #[test]
    fn peers_are_ready_ahead_of_the_phase_that_brings_them() {
        use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
        let store = MemoryStore::new(Duration::from_secs(30));
        let plan = Plan::parse("[[0,1],[0,1,2]]").unwrap();
        let (publishing, saw_both) = (AtomicBool::new(false), AtomicBool::new(false));
        let nobody = |_: u32, _: usize| false;
        let member = |r: u32| -> Result<Vec<u32>> {
            let g = Group::new(&store, &env(r, 3), Duration::from_secs(30));
            g.run(|| {
                let e = Membership::new(&g, &plan, 0, Duration::from_secs(2), SURVIVE)?;
                let new = e.begin_phase(0, &Bytes(vec![r as u8]), || Ok(()))?;
                e.opened(0, &new.gone)?;
                let early = e.ready_peers::<Bytes>(1, nobody)?;
                assert!(publishing.load(SeqCst) || early.peers.is_empty());
                let pace = Pace::Every(Duration::from_millis(1));
                let ready = poll(
                    Duration::from_secs(20),
                    pace,
                    || {
                        let ready = e.ready_peers::<Bytes>(1, nobody)?;
                        Ok(ready.missing.is_empty().then_some(ready))
                    },
                    |_| anyhow!("rank 2 never published"),
                )?;
                assert_eq!((ready.peers[0].rank, ready.peers[0].incarnation), (2, 1));
                assert!(
                    e.ready_peers::<Bytes>(1, |r, i| (r, i) == (2, 1))?
                        .peers
                        .is_empty()
                );
                e.agree(0, 0, &BTreeSet::new())?;
                while !saw_both.load(SeqCst) {
                    std::thread::sleep(Duration::from_millis(1));
                }
                e.end_phase(0)?;
                let new = e.begin_phase(1, &Bytes(vec![r as u8]), || Ok(()))?;
                e.opened(1, &new.gone)?;
                e.end_phase(1)?;
                Ok(new.peers.iter().map(|p| p.rank).collect())
            })
        };
        let joiner = || -> Result<Vec<u32>> {
            let env = RankEnv {
                incarnation: 1,
                ..env(2, 3)
            };
            let g = Group::new(&store, &env, Duration::from_secs(30));
            g.run(|| {
                let e = Membership::new(&g, &plan, 1, Duration::from_secs(2), SURVIVE)?;
                let mut seen = BTreeSet::new();
                // Set before the payload goes out: while unset, none is there.
                publishing.store(true, SeqCst);
                let new = e.begin_phase(1, &Bytes(vec![2]), || {
                    let ready = e.ready_peers::<Bytes>(1, nobody)?;
                    seen.extend(ready.peers.iter().map(|p| p.rank));
                    saw_both.store(seen.len() == 2, SeqCst);
                    Ok(())
                })?;
                assert_eq!(new.peers.len(), 2);
                e.opened(1, &new.gone)?;
                e.end_phase(1)?;
                Ok(seen.into_iter().collect())
            })
        };
        let got: Vec<Vec<u32>> = std::thread::scope(|s| {
            let runs = [
                s.spawn(|| member(0)),
                s.spawn(|| member(1)),
                s.spawn(joiner),
            ];
            runs.map(|h| h.join().unwrap().unwrap()).into()
        });
        assert_eq!(got, [vec![2], vec![2], vec![0, 1]]);
    }

    /// Rank `r` of `world` started by our launcher (which hosts the store
    /// and writes death notices).
    fn launched(r: u32, world: u32) -> RankEnv {
        RankEnv {
            incarnation: 0,
            launcher_store: true,
            ..env(r, world)
        }
    }

    /// A joiner that dies before its phase begins (plan `[[0,1],[0,1,2]]`):
    /// its notice moves the death counter while the members step phase 0,
    /// and phase 1's opening round still finds it. The joiner's heartbeat
    /// goes on (it never reports), so only the notice can prove it gone:
    /// missed, the round would wait until the run's timeout and fail.
    #[test]
    fn a_joiner_that_dies_before_its_phase_is_found_by_its_notice() {
        use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
        // A hang guard, not a timing assumption: the flags come in ms.
        let until = |flag: &AtomicBool| {
            let t0 = Instant::now();
            while !flag.load(SeqCst) && t0.elapsed() < Duration::from_secs(60) {
                std::thread::sleep(Duration::from_millis(1));
            }
            flag.load(SeqCst)
        };
        let store = MemoryStore::new(Duration::from_secs(30));
        let plan = Plan::parse("[[0,1],[0,1,2]]").unwrap();
        let keys = crate::ranks::keys::Keys::new(launched(0, 3).key_prefix());
        let (published, released) = (AtomicBool::new(false), AtomicBool::new(false));
        let member = |r: u32| -> Result<Decision> {
            let g = Group::new(&store, &launched(r, 3), Duration::from_secs(30));
            g.run(|| {
                let e = Membership::new(&g, &plan, 0, Duration::from_secs(2), SURVIVE)?;
                let new = e.begin_phase(0, &Bytes(vec![r as u8]), || Ok(()))?;
                e.opened(0, &new.gone)?;
                if r == 0 {
                    // The launcher's notice of the joiner, written now.
                    anyhow::ensure!(until(&published), "the joiner never published");
                    let death = Death {
                        how: "SIGKILL".into(),
                        at_ns: unix_ns(),
                        planned: false,
                    };
                    store.set(keys.death(2, 1).key(), &death.encode())?;
                    store.add(&keys.deaths(), 1)?;
                    anyhow::ensure!(e.found_dead(&[1], 0)?.is_empty(), "rank 1 found dead");
                }
                e.agree(0, 0, &BTreeSet::new())?;
                e.end_phase(0)?;
                let new = e.begin_phase(1, &Bytes(vec![r as u8]), || Ok(()))?;
                let d = e.opened(1, &new.gone)?;
                e.end_phase(1)?;
                Ok(d)
            })
        };
        let joiner = || -> Result<()> {
            let env = RankEnv {
                incarnation: 1,
                ..launched(2, 3)
            };
            let g = Group::new(&store, &env, Duration::from_secs(30));
            // Beats, publishes its card, then stops answering: no report.
            g.with_heartbeat(|| {
                let e = Membership::new(&g, &plan, 1, Duration::from_secs(2), SURVIVE)?;
                e.begin_phase(1, &Bytes(vec![2]), || {
                    published.store(true, SeqCst);
                    Ok(())
                })?;
                until(&released);
                Ok(())
            })
        };
        let decided: Vec<Decision> = std::thread::scope(|s| {
            let j = s.spawn(joiner);
            let m = [s.spawn(|| member(0)), s.spawn(|| member(1))];
            // Released whatever the members' results, so that a failure
            // fails the test rather than hanging it.
            let out = m.map(|h| h.join().unwrap());
            released.store(true, SeqCst);
            // The joiner plays a process the launcher declared dead: whether
            // its own begin still finds the members' cards depends on whether
            // they had finished (and deleted them) first. What is tested is
            // the members' decision, so its result is not.
            let _ = j.join().unwrap();
            out.map(|d| d.unwrap()).into()
        });
        for d in decided {
            assert_eq!(d.gone, BTreeSet::from([2]), "{d:?}");
        }
    }

    /// A joiner whose heartbeat stands still while it starts (it beat
    /// once, then loaded its libraries and created its agent on a loaded
    /// machine) is not agreed gone by its silence under our launcher: the
    /// members wait for its card and connect to it (plan
    /// `[[0,1],[0,1,2]]`). Its card comes only once the members have waited
    /// past the probe's limit, by the wall clock and by their own beats
    /// (their heartbeat counters in the store); where silence judged a
    /// starting process too, they found it gone before it came.
    #[test]
    fn a_starting_joiner_whose_heartbeat_stands_still_is_waited_for() {
        use crate::group::{SILENT_AFTER, SILENT_BEATS};
        use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
        let store = MemoryStore::new(Duration::from_secs(30));
        let plan = Plan::parse("[[0,1],[0,1,2]]").unwrap();
        let prefix = launched(0, 3).key_prefix();
        let waiting = [AtomicBool::new(false), AtomicBool::new(false)];
        let member = |r: u32| -> Result<Newcomers<Bytes>> {
            let g = Group::new(&store, &launched(r, 3), Duration::from_secs(30));
            g.run(|| {
                let e = Membership::new(&g, &plan, 0, Duration::from_secs(2), SURVIVE)?;
                let new = e.begin_phase(0, &Bytes(vec![r as u8]), || Ok(()))?;
                e.opened(0, &new.gone)?;
                e.end_phase(0)?;
                waiting[r as usize].store(true, SeqCst);
                let new = e.begin_phase(1, &Bytes(vec![r as u8]), || Ok(()))?;
                e.opened(1, &new.gone)?;
                e.end_phase(1)?;
                Ok(new)
            })
        };
        let beats = || -> Vec<i64> {
            (0..2)
                .map(|r| store.add(&format!("{prefix}alive/{r}.0"), 0).unwrap())
                .collect()
        };
        let joiner = || -> Result<()> {
            // It beat once, and then stood still while it started.
            store.add(&format!("{prefix}alive/2.1"), 1)?;
            let t0 = Instant::now();
            let hang_guard = |what: &str| {
                anyhow::ensure!(t0.elapsed() < Duration::from_secs(60), "{what}");
                std::thread::sleep(Duration::from_millis(10));
                Ok(())
            };
            while !waiting.iter().all(|w| w.load(SeqCst)) {
                hang_guard("phase 0 never ended")?;
            }
            let (since, before) = (Instant::now(), beats());
            let limit = SILENT_BEATS as i64 + 2;
            while since.elapsed() < SILENT_AFTER + Duration::from_secs(1)
                || beats().iter().zip(&before).any(|(now, b)| now - b < limit)
            {
                hang_guard("the members stopped beating")?;
            }
            let env = RankEnv {
                incarnation: 1,
                ..launched(2, 3)
            };
            let g = Group::new(&store, &env, Duration::from_secs(30));
            g.run(|| {
                let e = Membership::new(&g, &plan, 1, Duration::from_secs(2), SURVIVE)?;
                let new = e.begin_phase(1, &Bytes(vec![2]), || Ok(()))?;
                e.opened(1, &new.gone)?;
                e.end_phase(1).map(drop)
            })
        };
        let (members, joined) = std::thread::scope(|s| {
            let j = s.spawn(joiner);
            let m = [s.spawn(|| member(0)), s.spawn(|| member(1))];
            (m.map(|h| h.join().unwrap()), j.join().unwrap())
        });
        joined.unwrap();
        for new in members {
            let new = new.unwrap();
            assert!(new.gone.is_empty(), "{new:?}");
            assert_eq!(new.peers.iter().map(|p| p.rank).collect::<Vec<_>>(), [2]);
        }
    }

    /// How a rank's process ends in a drawn trial: `None` lives; else it dies
    /// at that step, before or after reporting it.
    type Fate = Option<(u64, bool)>;

    /// One drawn trial: `world` ranks step `steps` times, each reporting
    /// late by a drawn 0-2 ms and masking the ranks it finds dead; the
    /// doomed die at their step, before or after their report (heartbeat
    /// stopped, keys left), and a launcher thread writes each death's
    /// notice 0-3 ms later. Returns every rank's decisions (step, gone),
    /// the phase's end as step `END`.
    fn trial(
        world: u32,
        steps: u64,
        fates: &[Fate],
        seed: u64,
    ) -> Vec<Result<Vec<(u64, BTreeSet<u32>)>>> {
        let store = MemoryStore::new(Duration::from_secs(30));
        let plan = Plan::fixed(world);
        let keys = crate::ranks::keys::Keys::new(launched(0, world).key_prefix());
        let (tx, rx) = std::sync::mpsc::channel::<u32>();
        std::thread::scope(|s| {
            let (store, keys) = (&store, &keys);
            s.spawn(move || {
                let mut rng = crate::rng::SplitMix64::new(seed ^ 0xdead);
                for r in rx {
                    std::thread::sleep(Duration::from_micros(rng.next_u64() % 3000));
                    let death = Death {
                        how: "SIGKILL".into(),
                        at_ns: unix_ns(),
                        planned: false,
                    };
                    store.set(keys.death(r, 0).key(), &death.encode()).unwrap();
                    store.add(&keys.deaths(), 1).unwrap();
                }
            });
            let runs: Vec<_> = (0..world)
                .map(|r| {
                    let (tx, plan) = (tx.clone(), &plan);
                    s.spawn(move || {
                        let g = Group::new(store, &launched(r, world), Duration::from_secs(30));
                        let fate = fates[r as usize];
                        let mut rng = crate::rng::SplitMix64::new(seed ^ u64::from(r));
                        let body = || steps_of(&g, plan, steps, fate, &tx, &mut rng);
                        match fate {
                            // Dies: its heartbeat stops, its keys stay.
                            Some(_) => g.with_heartbeat(body),
                            None => g.run(body),
                        }
                    })
                })
                .collect();
            drop(tx);
            runs.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    /// One rank of [`trial`]: its decisions until it dies or the phase ends.
    fn steps_of(
        g: &Group,
        plan: &Plan,
        steps: u64,
        fate: Fate,
        dead: &std::sync::mpsc::Sender<u32>,
        rng: &mut crate::rng::SplitMix64,
    ) -> Result<Vec<(u64, BTreeSet<u32>)>> {
        let e = Membership::new(g, plan, 0, Duration::from_secs(2), OnDeath::Survive)?;
        let new = e.begin_phase(0, &Bytes(vec![g.rank as u8]), || Ok(()))?;
        e.opened(0, &new.gone)?;
        let (mut seen, mut masked) = (Vec::new(), BTreeSet::new());
        for k in 0..steps {
            if fate == Some((k, false)) {
                dead.send(g.rank).unwrap();
                return Ok(seen);
            }
            std::thread::sleep(Duration::from_micros(rng.next_u64() % 2000));
            let others: Vec<u32> = e.active(0).into_iter().filter(|&r| r != g.rank).collect();
            masked.extend(e.found_dead(&others, 0)?);
            let d = e.agree(0, k, &masked)?;
            masked.retain(|r| d.gone.contains(r));
            seen.push((k, d.gone));
            if fate == Some((k, true)) {
                dead.send(g.rank).unwrap();
                return Ok(seen);
            }
        }
        seen.push((END, e.end_phase(0)?.gone));
        Ok(seen)
    }

    /// Drawn trials (seeds printed on failure): 3-6 ranks, any of them
    /// doomed but one, rank 0 included, each at a drawn step, before or after
    /// its report, with late reports. Every survivor decides the same set
    /// after every step, no rank that lives is ever in it, and the phase's
    /// end names every death.
    #[test]
    fn drawn_deaths_and_late_reports_leave_every_survivor_with_one_set() {
        let (mut deaths, mut rank0) = (0, false);
        for seed in 1..=12u64 {
            let mut rng = crate::rng::SplitMix64::new(seed);
            let world = 3 + (rng.next_u64() % 4) as u32;
            let steps = 3 + rng.next_u64() % 5;
            let mut fates: Vec<Fate> = vec![None; world as usize];
            let doomed = rng.next_u64() % u64::from(world);
            for _ in 0..doomed {
                let r = (rng.next_u64() % u64::from(world)) as usize;
                fates[r] = Some((rng.next_u64() % steps, rng.next_u64() % 2 == 0));
            }
            if fates.iter().all(Option::is_some) {
                fates[0] = None;
            }
            let case = format!("seed {seed}: {world} ranks, {steps} steps, fates {fates:?}");
            let out = trial(world, steps, &fates, seed);
            let dead: BTreeSet<u32> = (0..world)
                .filter(|&r| fates[r as usize].is_some())
                .collect();
            let lived: Vec<&Vec<(u64, BTreeSet<u32>)>> = (0..world as usize)
                .filter(|&r| fates[r].is_none())
                .map(|r| {
                    out[r]
                        .as_ref()
                        .unwrap_or_else(|e| panic!("{case}: rank {r}: {e:#}"))
                })
                .collect();
            for seen in &lived {
                assert_eq!(*seen, lived[0], "{case}: the survivors decided differently");
                for (_, gone) in seen.iter() {
                    assert!(
                        gone.is_subset(&dead),
                        "{case}: a rank that lives was declared gone: {gone:?}"
                    );
                }
                assert_eq!(
                    seen.last().unwrap(),
                    &(END, dead.clone()),
                    "{case}: the end names every death"
                );
            }
            deaths += dead.len();
            rank0 |= dead.contains(&0);
        }
        // The draws are fixed: they must hold deaths, rank 0's among them.
        assert!(
            deaths >= 12 && rank0,
            "{deaths} deaths drawn, rank 0's: {rank0}"
        );
    }
}
