//! `ep --ranks N` and `ep --plan FILE` (any program on this layer): the
//! launcher. It hosts the run's
//! store itself (so any rank may die), starts each phase's ranks as child
//! processes of this executable with the environment torchrun would give
//! them, kills the ranks a plan marks `-r` at a random moment of their
//! phase, writes a notice when any rank process dies or stops, and waits
//! for all.
//!
//! The children run this same executable with the same arguments; `RANK`
//! being set is what makes them ranks, and `NIXL_EP_INCARNATION` (the
//! phase that started them) tells them that the launcher hosts the store at
//! `MASTER_ADDR:MASTER_PORT`. `--ranks N` is the plan `[[0..N-1]]`.
//!
//! The plan runs through the store (keys in [`super::keys`]): phase 0's
//! ranks start at once; when the decision that ends phase `i` appears
//! (`phase/<i>/step/<end>/decision`) the launcher starts phase `i+1`'s
//! joiners. A rank marked `-r` in phase `i` is not told: the launcher
//! draws (from `--kill-seed`) one of the first half of the phase's
//! agreement rounds and a
//! fraction of a round, follows the rounds by the counter the leaders bump
//! (`phase/<i>/rounds`), and when that round has passed and the fraction of
//! the last round's length after it, sends SIGKILL or SIGSTOP
//! (`--kill-signal`), so the kill lands anywhere: inside a kernel, in an
//! agreement round, between steps. Every death it sees — its own kills,
//! and any other process that ends through a signal or stops — it writes
//! as a notice, `dead/<r>.<inc>`, which the survivors' agreement takes as
//! proof at once. Stopped ranks get SIGKILL once every other rank has
//! exited. A planned kill is not a failure, nor, when the run survives
//! deaths ([`OnDeath::Survive`]), a death by a signal nobody planned (it is
//! listed as died, survived); any other non-zero exit is a failure, and
//! then the others get `grace` to say why before they are killed. Ctrl-C:
//! the children clean up, one summary, exit 130.

use std::process::Child;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use super::env::{INCARNATION_VAR, Program};
use super::keys::{Death, Keys};
use super::membership::{END, OnDeath, unix_ns};
use super::plan::Plan;
use crate::group::Value;
use crate::launch::{RoleExit, RoleSpec, dying, forward, is_frozen, is_stopped, signal_name};
use crate::rng::SplitMix64;
use crate::store::native::TcpStore;
use crate::store::{Store, StoreOptions};

/// How the launcher ends a rank the plan marks `-r`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum KillSignal {
    /// SIGKILL: the process dies at once (its sockets close).
    #[default]
    Kill,
    /// SIGSTOP: the process freezes with its sockets open (a hung rank);
    /// it gets SIGKILL at the end of the run.
    Stop,
}

impl KillSignal {
    fn signal(self) -> i32 {
        match self {
            KillSignal::Kill => libc::SIGKILL,
            KillSignal::Stop => libc::SIGSTOP,
        }
    }
}

/// A TCP port free on all interfaces right now (the store binds it a moment
/// later; another process could take it in between, and the store would
/// then say the port is in use).
pub fn free_port() -> Result<u16> {
    let l =
        std::net::TcpListener::bind(("0.0.0.0", 0)).context("finding a free port for the store")?;
    Ok(l.local_addr()?.port())
}

/// `--ranks N` of a run that does not survive deaths: the plan
/// `[[0..N-1]]`, started as [`run_plan`] starts every plan (the launcher
/// hosts the store, so no rank is special); a rank that dies fails the run,
/// and the others get `grace` to say why.
pub fn run_fixed(
    program: Program,
    ranks: u32,
    port: u16,
    timeout: Duration,
    grace: Duration,
) -> Result<Vec<RoleExit>> {
    let opts = LaunchOptions {
        program,
        capacity: ranks,
        port,
        kill_signal: KillSignal::Kill,
        on_death: OnDeath::Fail,
        rounds_per_phase: 0,
        kill_seed: 0,
        grace,
        timeout,
    };
    run_plan(&Plan::fixed(ranks), &opts)
}

/// Rank `r` of `world` with torchrun's variables and the phase that starts
/// it (`NIXL_EP_INCARNATION`): the launcher hosts the store.
fn rank_spec(r: u32, world: u32, port: u16, incarnation: usize) -> RoleSpec {
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    let name = match incarnation {
        0 => format!("rank {r}"),
        i => format!("rank {r} (started in phase {i})"),
    };
    let mut spec = RoleSpec::new(&name, args)
        .env("RANK", r.to_string())
        .env("WORLD_SIZE", world.to_string())
        .env("LOCAL_RANK", r.to_string())
        .env("LOCAL_WORLD_SIZE", world.to_string())
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", port.to_string())
        // Not torchrun's agent: ours.
        .env("TORCHELASTIC_USE_AGENT_STORE", "False")
        .env(INCARNATION_VAR, incarnation.to_string());
    if std::env::var_os("NCCL_NVLS_ENABLE").is_none() {
        // NVLink SHARP (multicast) stays off on these machines.
        spec = spec.env("NCCL_NVLS_ENABLE", "0");
    }
    spec
}

/// How [`run_plan`] runs.
#[derive(Clone, Debug)]
pub struct LaunchOptions {
    /// The program the ranks run (its key namespace, its `[tag]`).
    pub program: Program,
    /// Every rank's `WORLD_SIZE`: the plan's capacity.
    pub capacity: u32,
    /// The store's port (0: a free one).
    pub port: u16,
    pub kill_signal: KillSignal,
    /// What a rank's death does to the run.
    pub on_death: OnDeath,
    /// Agreement rounds after steps in each phase (the rounds a planned
    /// kill is drawn among).
    pub rounds_per_phase: u64,
    /// Seed of the kills' moments.
    pub kill_seed: u64,
    /// After a rank failed, how long the others may run to say why.
    pub grace: Duration,
    /// The store's request deadline (the run's `--timeout`).
    pub timeout: Duration,
}

/// One rank process of the plan.
struct Proc {
    name: String,
    rank: u32,
    /// The phase that started it.
    incarnation: usize,
    child: Child,
    exit: Option<RoleExit>,
    /// The signal we sent it as the plan says, if we did.
    planned: Option<i32>,
    /// Whether its death notice is written.
    noticed: bool,
}

/// A planned kill still to come: rank `rank` once the phase's round
/// counter passed `round`, `fraction` of a round later.
#[derive(Clone, Copy, Debug)]
struct Kill {
    rank: u32,
    round: u64,
    fraction: f64,
}

/// `--kill-seed`: the one given, or one from the clock (run_plan prints
/// it, so a run can be repeated).
pub fn kill_seed(given: Option<u64>) -> u64 {
    given.unwrap_or_else(|| {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
        now.map_or(1, |d| d.as_nanos() as u64 % 1_000_000)
    })
}

/// Runs `plan`: hosts the store, starts and kills the ranks as the plan
/// says, writes the death notices, waits for all (a backstop of 24 h;
/// every wait inside the ranks has its own deadline) and returns how each
/// ended, planned kills and survived deaths marked. Errors: the store
/// cannot be hosted (port taken: a usage error), a rank cannot be started.
pub fn run_plan(plan: &Plan, opts: &LaunchOptions) -> Result<Vec<RoleExit>> {
    let store = TcpStore::open(&StoreOptions::server(opts.port, opts.timeout))
        .map_err(crate::cli::store_error)?;
    tracing::info!(
        "hosting the store on port {}; running a plan of {} phase(s) over {} rank(s) of capacity {}",
        store.port(),
        plan.len(),
        plan.processes().len(),
        opts.capacity
    );
    if (0..plan.len()).any(|i| !plan.killed(i).is_empty()) {
        crate::eline!(
            "[{}] kills land at random moments of their phase (--kill-seed {})",
            opts.program.name,
            opts.kill_seed
        );
    }
    crate::interrupt::install().context("routing Ctrl-C and SIGTERM")?;
    let mut run = PlanRun {
        plan,
        opts,
        store: &store,
        keys: Keys::new(format!("{}/", opts.program.namespace)),
        procs: Vec::new(),
        phase: 0,
        rng: SplitMix64::new(opts.kill_seed),
        kills: Vec::new(),
        rounds: Rounds::default(),
    };
    if let Err(e) = run.start_phase(0) {
        run.kill_remaining(false);
        return Err(e);
    }
    Ok(run.supervise())
}

/// The launcher's state while a plan runs.
struct PlanRun<'a> {
    plan: &'a Plan,
    opts: &'a LaunchOptions,
    store: &'a TcpStore,
    keys: Keys,
    procs: Vec<Proc>,
    /// The phase under way.
    phase: usize,
    rng: SplitMix64,
    /// The phase's planned kills still to come.
    kills: Vec<Kill>,
    rounds: Rounds,
}

/// The phase's round counter as last read, and when it last moved.
#[derive(Default)]
struct Rounds {
    count: u64,
    moved: Option<Instant>,
    /// The length of the last round seen, for the kills' fractions.
    last: Duration,
}

impl PlanRun<'_> {
    /// The `[tag]` of the launcher's lines: the program's name.
    fn tag(&self) -> &'static str {
        self.opts.program.name
    }

    /// Phase `i` begins: starts the next phase's joiners now, so that
    /// their start (CUDA context, NIXL agent, window: about 1.5 s) runs
    /// while this phase steps and they wait at its end with their cards
    /// published (phase 0's own are started first); draws the moments of
    /// the phase's kills.
    fn start_phase(&mut self, i: usize) -> Result<()> {
        if i == 0 {
            for r in self.plan.joiners(0) {
                self.spawn(r, 0)?;
            }
        }
        match self.plan.joiners(i) {
            _ if i == 0 => {}
            j if j.is_empty() => tracing::info!("phase {i} begins (no rank joins)"),
            j => tracing::info!(
                "phase {i} begins: rank(s) {j:?} join (started during phase {})",
                i - 1
            ),
        }
        if i + 1 < self.plan.len() {
            for r in self.plan.joiners(i + 1) {
                self.spawn(r, i + 1)?;
            }
        }
        // In the first half of the phase's rounds, so that the survivors
        // step on after it before the phase ends.
        let half = (self.opts.rounds_per_phase / 2).max(1);
        self.kills = (self.plan.killed(i).into_iter())
            .map(|rank| Kill {
                rank,
                round: self.rng.next_u64() % half,
                fraction: self.rng.next_f64(),
            })
            .collect();
        self.rounds = Rounds::default();
        Ok(())
    }

    /// Starts rank `r`'s process of phase `i`.
    fn spawn(&mut self, r: u32, i: usize) -> Result<()> {
        let spec = rank_spec(r, self.opts.capacity, self.store.port(), i);
        let spawned = spec.command().and_then(|mut c| {
            c.spawn()
                .with_context(|| format!("starting the {} process", spec.name))
        });
        match spawned {
            Ok(child) => {
                crate::eline!(
                    "[{}] started {} (pid {})",
                    self.tag(),
                    spec.name,
                    child.id()
                );
                self.procs.push(Proc {
                    name: spec.name.clone(),
                    rank: r,
                    incarnation: i,
                    child,
                    exit: None,
                    planned: None,
                    noticed: false,
                });
                Ok(())
            }
            // The caller stops the others (supervise, or run_plan before it).
            Err(e) => Err(e),
        }
    }

    /// The launcher's loop: children, the plan's keys, Ctrl-C, deadlines.
    /// When following the plan failed (a rank could not be started, or a
    /// phase's ranks all exited before it ended), every rank is stopped and
    /// the launcher is listed among the exits as failed (exit 1), so the
    /// run fails whatever the ranks' statuses.
    fn supervise(mut self) -> Vec<RoleExit> {
        let start = Instant::now();
        let backstop = Duration::from_secs(24 * 3600);
        let mut failed_at: Option<Instant> = None;
        let mut interrupted = false;
        let mut plan_failed = false;
        let mut next_look = Instant::now();
        while self.procs.iter().any(|p| p.exit.is_none()) {
            if self.reap() && failed_at.is_none() {
                failed_at = Some(Instant::now());
            }
            self.notice_deaths();
            if let Some(sig) = crate::interrupt::received().filter(|_| !interrupted) {
                interrupted = true;
                failed_at.get_or_insert_with(Instant::now);
                for p in self.procs.iter().filter(|p| p.exit.is_none()) {
                    forward(&p.child, sig.0);
                }
            }
            // The store is asked at most every 50 ms (64 ranks share it),
            // every ms while a kill waits for its round or the next phase
            // has kills (its start must not be seen late).
            if failed_at.is_none() && Instant::now() >= next_look {
                let pace = match self.kills_near() {
                    false => Duration::from_millis(50),
                    true => Duration::from_millis(1),
                };
                next_look = Instant::now() + pace;
                if let Err(e) = self.follow_plan() {
                    crate::eline!("[{}] error: {e:#}", self.tag());
                    failed_at = Some(Instant::now());
                    plan_failed = true;
                }
            }
            // After a failure, the ones left that are stopped (frozen, or
            // stopped as planned) have nothing to say: no grace for them.
            let only_stopped = failed_at.is_some()
                && (self.procs.iter().filter(|p| p.exit.is_none()))
                    .all(|p| is_stopped(p.child.id()));
            let give_up = start.elapsed() > backstop
                || failed_at.is_some_and(|t| t.elapsed() > self.opts.grace)
                || only_stopped;
            if give_up {
                self.kill_remaining(false);
            }
            // Short: a death's notice is what the survivors' agreement waits
            // for. A look is a waitpid and a /proc read per rank: 2 ms for
            // up to 8 ranks, longer with more, so that 64 ranks on two cores
            // are not starved by their launcher.
            let live = self.procs.iter().filter(|p| p.exit.is_none()).count() as u64;
            let nap = if self.kills_near() {
                1
            } else {
                2 * live.div_ceil(8).max(1)
            };
            std::thread::sleep(Duration::from_millis(nap));
        }
        let launcher = plan_failed.then(|| RoleExit {
            code: 1,
            ..RoleExit::named(&format!("the {} launcher", self.tag()))
        });
        (self.procs.into_iter().filter_map(|p| p.exit))
            .chain(launcher)
            .collect()
    }

    /// Whether a kill waits in this phase or the next one has kills.
    fn kills_near(&self) -> bool {
        let next = self.phase + 1;
        !self.kills.is_empty() || next < self.plan.len() && !self.plan.killed(next).is_empty()
    }

    /// Collects the children that exited; true when one failed. A death
    /// by a signal we did not plan is survived when the run survives
    /// deaths.
    fn reap(&mut self) -> bool {
        let survive = self.opts.on_death == OnDeath::Survive;
        let mut failed = false;
        for p in self.procs.iter_mut().filter(|p| p.exit.is_none()) {
            let mut exit = match p.child.try_wait() {
                Ok(Some(status)) => RoleExit::of(&p.name, status),
                Ok(None) => continue,
                // Cannot happen for a child we spawned; count it as a failure.
                Err(_) => RoleExit {
                    code: -1,
                    ..RoleExit::named(&p.name)
                },
            };
            exit.planned = p.planned.is_some() && exit.signal == Some(libc::SIGKILL);
            exit.survived = survive && !exit.planned && exit.signal.is_some();
            failed |= exit.failed();
            p.exit = Some(exit);
        }
        failed
    }

    /// Writes a notice for every rank process that died through a signal
    /// or stopped since the last look (read by the survivors' agreement).
    fn notice_deaths(&mut self) {
        for i in 0..self.procs.len() {
            let p = &self.procs[i];
            if p.noticed {
                continue;
            }
            let how = match &p.exit {
                Some(e) => match e.signal {
                    Some(sig) => signal_name(sig),
                    None => continue,
                },
                // Frozen, or killed and still being torn down (its GPU
                // memory unmapped): one read of /proc per rank and look.
                None => match dying(p.child.id()) {
                    Some(how) => how,
                    None => continue,
                },
            };
            let planned = p.planned.is_some();
            self.notice(i, how, planned);
        }
    }

    /// Writes process `i`'s death notice and bumps the death counter.
    fn notice(&mut self, i: usize, how: String, planned: bool) {
        let p = &mut self.procs[i];
        p.noticed = true;
        let death = Death {
            how,
            at_ns: unix_ns(),
            planned,
        };
        let entry = self.keys.death(p.rank, p.incarnation);
        let written = (self.store.set(entry.key(), &death.encode()))
            .and_then(|()| self.store.add(&self.keys.deaths(), 1).map(drop));
        if let Err(e) = written {
            tracing::warn!("could not write the death notice of {}: {e}", p.name);
        }
    }

    /// Kills what still runs: the stopped ranks as planned (`planned`), or
    /// everything after a failure or at the backstop.
    fn kill_remaining(&mut self, planned: bool) {
        let survive = self.opts.on_death == OnDeath::Survive;
        for p in self.procs.iter_mut().filter(|p| p.exit.is_none()) {
            let _ = p.child.kill();
            let _ = p.child.wait();
            p.exit = Some(RoleExit {
                code: 128 + 9,
                signal: Some(9),
                killed: !planned,
                planned: planned && p.planned.is_some(),
                // Stopped by someone else and never woken: a frozen rank
                // the others went on without.
                survived: planned && p.planned.is_none() && survive,
                ..RoleExit::named(&p.name)
            });
        }
    }

    /// One look at the store: the phase's kills once their round came,
    /// the next phase once this one ended, and the stopped ranks once
    /// nothing else runs. Errors: the ranks of a phase all exited before
    /// it ended.
    fn follow_plan(&mut self) -> Result<()> {
        let i = self.phase;
        let ended = self.keys.decision(i, END);
        let last = i + 1 == self.plan.len();
        if last && !self.kills.is_empty() && self.store.check(&[ended.key()])? {
            // Every step of the run was done: a kill now would land in the
            // teardown, after the last agreement that could name it.
            for k in std::mem::take(&mut self.kills) {
                crate::eline!(
                    "[{}] phase {i}, the last, ended before the planned kill of rank {} came: not killed",
                    self.tag(),
                    k.rank
                );
            }
        }
        if !self.kills.is_empty() {
            self.kill_when_due(i)?;
        }
        if i + 1 < self.plan.len() && self.store.check(&[ended.key()])? {
            // Kills the phase ended before: now, late.
            let late: Vec<Kill> = self.kills.drain(..).collect();
            for k in late {
                crate::eline!(
                    "[{}] phase {i} ended before the planned kill of rank {} came: killing it now",
                    self.tag(),
                    k.rank
                );
                self.kill(i, k)?;
            }
            self.phase = i + 1;
            self.start_phase(i + 1)?;
            return Ok(());
        }
        // The next phase's joiners, started early, wait for this one.
        let running = (self.procs.iter())
            .filter(|p| p.incarnation <= i && p.exit.is_none() && !is_frozen(p.child.id()))
            .count();
        if running == 0 {
            if i + 1 < self.plan.len() {
                anyhow::bail!(
                    "every rank of phase {i} exited before the phase ended: the plan cannot go on"
                );
            }
            self.kill_remaining(true);
        }
        Ok(())
    }

    /// Sends the kills of phase `i` whose moment came: the round counter
    /// passed their round, and their fraction of the last round's length
    /// after it.
    fn kill_when_due(&mut self, i: usize) -> Result<()> {
        let count = self.store.add(&self.keys.rounds(i), 0)? as u64;
        let now = Instant::now();
        if count != self.rounds.count {
            if let Some(t) = self.rounds.moved {
                self.rounds.last = (now - t) / (count - self.rounds.count).max(1) as u32;
            }
            (self.rounds.count, self.rounds.moved) = (count, Some(now));
        }
        let due = |k: &Kill, r: &Rounds| {
            r.count > k.round
                && r.moved
                    .is_some_and(|t| now - t >= r.last.mul_f64(k.fraction))
        };
        let (now_due, later): (Vec<Kill>, Vec<Kill>) =
            self.kills.iter().partition(|k| due(k, &self.rounds));
        self.kills = later;
        for k in now_due {
            self.kill(i, k)?;
        }
        Ok(())
    }

    /// Sends `k`'s rank (phase `i`'s process) the kill signal and writes
    /// its notice.
    fn kill(&mut self, i: usize, k: Kill) -> Result<()> {
        let r = k.rank;
        let sig = self.opts.kill_signal.signal();
        let inc = self.plan.incarnation(r, i);
        let current = |p: &Proc| p.rank == r && Some(p.incarnation) == inc && p.exit.is_none();
        let Some(at) = self.procs.iter().position(current) else {
            crate::eline!(
                "[{}] phase {i}: rank {r} ended before its planned kill",
                self.tag()
            );
            return Ok(());
        };
        let p = &mut self.procs[at];
        // SAFETY: a plain syscall on a child we spawned and have not reaped.
        unsafe { libc::kill(p.child.id() as libc::pid_t, sig) };
        p.planned = Some(sig);
        crate::eline!(
            "[{}] phase {i}: sent {} to rank {r} (pid {}) as the plan says (-{r}), {:.2} of a round after round {}",
            self.opts.program.name,
            signal_name(sig),
            p.child.id(),
            k.fraction,
            k.round
        );
        self.notice(at, signal_name(sig), true);
        Ok(())
    }
}
