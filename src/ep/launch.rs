//! `ep --ranks N` and `ep --plan FILE`: the launcher. It hosts the run's
//! store itself (so any rank may die), starts each phase's ranks as child
//! processes of this executable with the environment torchrun would give
//! them, kills the ranks a plan marks `-r`, and waits for all.
//!
//! The children run this same executable with the same arguments; `RANK`
//! being set is what makes them ranks, and `NIXL_EP_INCARNATION` (the
//! phase that started them) tells them that the launcher hosts the store at
//! `MASTER_ADDR:MASTER_PORT`. `--ranks N` is the plan `[[0..N-1]]`.
//!
//! The plan runs through the store (keys in [`super::keys`]): phase 0's
//! ranks start at once; when `phase/<i>/ended` appears (every survivor of
//! phase `i` finished it) the launcher starts phase `i+1`'s joiners; when
//! `phase/<i>/halfway` appears (the phase is past its middle step) it sends
//! each `-r` rank of phase `i` SIGKILL or SIGSTOP (`--kill-signal`) and
//! writes the kill's wall time under `phase/<i>/killed/<r>`. Stopped ranks
//! get SIGKILL once every other rank has exited. A planned kill is not a
//! failure; any other non-zero exit is, and then the others get `grace` to
//! say why before they are killed. Ctrl-C: the children clean up, one
//! summary, exit 130.

use std::process::Child;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};

use super::env::INCARNATION_VAR;
use super::keys::Keys;
use super::plan::Plan;
use crate::group::{Marker, Value};
use crate::launch::{
    RoleExit, RoleSpec, forward, is_stopped, kill_all, run_roles_with, signal_name,
};
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

/// Runs `ranks` copies of this executable with this process's arguments
/// and torchrun's variables (rank `r` as `RANK=r`, `LOCAL_RANK=r`); rank 0
/// hosts the store on `port`. For `collectives --ranks N`; `ep` runs
/// [`run_plan`]. Once one fails, the others get `grace` to notice and say
/// why, then are killed.
pub fn run_ranks(ranks: u32, port: u16, grace: Duration) -> Result<Vec<RoleExit>> {
    let specs = (0..ranks)
        .map(|r| rank_spec(r, ranks, port, None))
        .collect();
    // A backstop only: every wait inside the ranks has its own deadline.
    run_roles_with(specs, Duration::from_secs(24 * 3600), grace)
}

/// Rank `r` of `world` with torchrun's variables; `incarnation` set: the
/// launcher hosts the store (`NIXL_EP_INCARNATION`), else rank 0 does.
fn rank_spec(r: u32, world: u32, port: u16, incarnation: Option<usize>) -> RoleSpec {
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    let name = match incarnation {
        Some(i) if i > 0 => format!("rank {r} (started in phase {i})"),
        _ => format!("rank {r}"),
    };
    let mut spec = RoleSpec::new(&name, args)
        .env("RANK", r.to_string())
        .env("WORLD_SIZE", world.to_string())
        .env("LOCAL_RANK", r.to_string())
        .env("LOCAL_WORLD_SIZE", world.to_string())
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", port.to_string())
        // Not torchrun's agent: ours (incarnation set) or rank 0's store.
        .env("TORCHELASTIC_USE_AGENT_STORE", "False");
    if let Some(i) = incarnation {
        spec = spec.env(INCARNATION_VAR, i.to_string());
    }
    if std::env::var_os("NCCL_NVLS_ENABLE").is_none() {
        // NVLink SHARP (multicast) stays off on these machines.
        spec = spec.env("NCCL_NVLS_ENABLE", "0");
    }
    spec
}

/// How [`run_plan`] runs.
#[derive(Clone, Debug)]
pub struct LaunchOptions {
    /// Every rank's `WORLD_SIZE`: the plan's capacity.
    pub capacity: u32,
    /// The store's port (0: a free one).
    pub port: u16,
    pub kill_signal: KillSignal,
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
}

/// Runs `plan`: hosts the store, starts and kills the ranks as the plan
/// says, waits for all (a backstop of 24 h; every wait inside the ranks has
/// its own deadline) and returns how each ended, planned kills marked.
/// Errors: the store cannot be hosted (port taken: a usage error), a rank
/// cannot be started.
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
    crate::interrupt::install().context("routing Ctrl-C and SIGTERM")?;
    let mut run = PlanRun {
        plan,
        opts,
        store: &store,
        keys: Keys::new("nixl_ep/"),
        procs: Vec::new(),
        phase: 0,
        killed_in: None,
    };
    run.start_phase(0)?;
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
    /// The phase whose kills were sent.
    killed_in: Option<usize>,
}

impl PlanRun<'_> {
    /// Starts phase `i`'s joiners.
    fn start_phase(&mut self, i: usize) -> Result<()> {
        for r in self.plan.joiners(i) {
            let spec = rank_spec(r, self.opts.capacity, self.store.port(), Some(i));
            let spawned = spec.command().and_then(|mut c| {
                c.spawn()
                    .with_context(|| format!("starting the {} process", spec.name))
            });
            match spawned {
                Ok(child) => self.procs.push(Proc {
                    name: spec.name.clone(),
                    rank: r,
                    incarnation: i,
                    child,
                    exit: None,
                    planned: None,
                }),
                Err(e) => {
                    let running = self.procs.drain(..).filter(|p| p.exit.is_none());
                    kill_all(running.map(|p| (p.name, p.child)).collect());
                    return Err(e);
                }
            }
        }
        match self.plan.joiners(i) {
            _ if i == 0 => {}
            j if j.is_empty() => tracing::info!("phase {i} begins (no rank joins)"),
            j => tracing::info!("phase {i} begins: started rank(s) {j:?}"),
        }
        Ok(())
    }

    /// The launcher's loop: children, the plan's keys, Ctrl-C, deadlines.
    fn supervise(mut self) -> Vec<RoleExit> {
        let start = Instant::now();
        let backstop = Duration::from_secs(24 * 3600);
        let mut failed_at: Option<Instant> = None;
        let mut interrupted = false;
        let mut next_look = Instant::now();
        while self.procs.iter().any(|p| p.exit.is_none()) {
            if self.reap() && failed_at.is_none() {
                failed_at = Some(Instant::now());
            }
            if let Some(sig) = crate::interrupt::received().filter(|_| !interrupted) {
                interrupted = true;
                failed_at.get_or_insert_with(Instant::now);
                for p in self.procs.iter().filter(|p| p.exit.is_none()) {
                    forward(&p.child, sig.0);
                }
            }
            // The store is asked at most every 50 ms: 64 ranks share it.
            if failed_at.is_none() && Instant::now() >= next_look {
                next_look = Instant::now() + Duration::from_millis(50);
                if let Err(e) = self.follow_plan() {
                    crate::eline!("[ep] error: {e:#}");
                    failed_at = Some(Instant::now());
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
            std::thread::sleep(Duration::from_millis(10));
        }
        self.procs.into_iter().filter_map(|p| p.exit).collect()
    }

    /// Collects the children that exited; true when one failed.
    fn reap(&mut self) -> bool {
        let mut failed = false;
        for p in self.procs.iter_mut().filter(|p| p.exit.is_none()) {
            let mut exit = match p.child.try_wait() {
                Ok(Some(status)) => RoleExit::of(&p.name, status),
                Ok(None) => continue,
                // Cannot happen for a child we spawned; count it as a failure.
                Err(_) => RoleExit {
                    name: p.name.clone(),
                    code: -1,
                    signal: None,
                    killed: false,
                    planned: false,
                },
            };
            exit.planned = p.planned.is_some() && exit.signal == Some(libc::SIGKILL);
            failed |= exit.failed();
            p.exit = Some(exit);
        }
        failed
    }

    /// Kills what still runs: the stopped ranks as planned (`planned`), or
    /// everything after a failure or at the backstop.
    fn kill_remaining(&mut self, planned: bool) {
        for p in self.procs.iter_mut().filter(|p| p.exit.is_none()) {
            let _ = p.child.kill();
            let _ = p.child.wait();
            p.exit = Some(RoleExit {
                name: p.name.clone(),
                code: 128 + 9,
                signal: Some(9),
                killed: !planned,
                planned: planned && p.planned.is_some(),
            });
        }
    }

    /// One look at the store: the phase's kills once it is halfway, the
    /// next phase once it ended, and the stopped ranks once nothing else
    /// runs. Errors: the ranks of a phase all exited before it ended.
    fn follow_plan(&mut self) -> Result<()> {
        let i = self.phase;
        if self.killed_in != Some(i)
            && !self.plan.killed(i).is_empty()
            && self.seen(self.keys.halfway(i))?
        {
            self.kill_planned(i)?;
        }
        if i + 1 < self.plan.len() && self.seen(self.keys.ended(i))? {
            self.phase = i + 1;
            self.start_phase(i + 1)?;
            return Ok(());
        }
        let running = (self.procs.iter())
            .filter(|p| p.exit.is_none() && p.planned != Some(libc::SIGSTOP))
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

    /// Whether `entry` exists; if so it is deleted (the launcher is its reader).
    fn seen(&self, entry: crate::group::Entry<Marker>) -> Result<bool> {
        if !self.store.check(&[entry.key()])? {
            return Ok(false);
        }
        self.store.delete_key(entry.key())?;
        Ok(true)
    }

    /// Sends phase `i`'s `-r` ranks the kill signal and records when.
    fn kill_planned(&mut self, i: usize) -> Result<()> {
        self.killed_in = Some(i);
        let sig = self.opts.kill_signal.signal();
        for r in self.plan.killed(i) {
            let inc = self.plan.incarnation(r, i);
            let current =
                |p: &&mut Proc| p.rank == r && Some(p.incarnation) == inc && p.exit.is_none();
            let Some(p) = self.procs.iter_mut().find(current) else {
                anyhow::bail!("the plan kills rank {r} in phase {i}, but it is no longer running");
            };
            // SAFETY: a plain syscall on a child we spawned and have not reaped.
            unsafe { libc::kill(p.child.id() as libc::pid_t, sig) };
            let ns = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64);
            p.planned = Some(sig);
            let entry = self.keys.killed(i, r);
            self.store.set(entry.key(), &ns.encode())?;
            crate::eline!(
                "[ep] phase {i}: sent {} to rank {r}, as the plan says (-{r})",
                signal_name(sig)
            );
        }
        Ok(())
    }
}
