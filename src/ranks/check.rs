//! `--check-connection` (`ep`'s, `collectives`'): the ranks meet through the store, wire up
//! their NIXL agents — every rank loads its peers' metadata and connects to
//! them — and live the plan's phases without touching a GPU.
//!
//! It runs the real membership of a GPU run (store, keys, agent names,
//! heartbeats, the agreement rounds that open and end each phase and follow
//! every step, teardown), so it answers before any GPU time is spent: do
//! the ranks find the store, do they all load NIXL, do the agents accept
//! each other's metadata, do joiners connect, and do the survivors of a
//! death — planned by the launcher or not — agree on it and go on? And it
//! is testable on any machine. Each phase runs `steps` steps of agreement
//! ([`Check::steps`], `--iters`) in which a rank's masked set is the ranks
//! it finds dead (the launcher's notice, or a silent heartbeat: there are
//! no GPU kernels to time out).

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::Result;

use super::driver::{Change, PhaseRecord, PhaseView, PhaseWork, StepOutcome};
use super::env::RankEnv;
use super::group::Group;
use super::membership::{OnDeath, Peer};
use super::plan::Plan;
use super::rank::{Rank, RankOptions, run_rank};
use crate::group::AgentMetadata;
use crate::nixl::agent::create_ucx_agent;
use crate::nixl::view::load_peer;
use crate::say;
use nixl_sys::Agent;

/// Test hooks (`--inject`, hidden).
#[derive(Clone, Copy, Debug, Default)]
pub struct Inject {
    /// This rank stops after connecting in its first phase (heartbeat still
    /// running, before the phase's barrier) until it is killed: the others
    /// must name it once it dies.
    pub hang_rank: Option<u32>,
    /// This rank dies (SIGKILL to itself) in its first phase once it has
    /// published its metadata and read the others', before connecting to
    /// them: the others, which may be loading its metadata or connecting to
    /// it just then, must name it as dead.
    pub die_rank: Option<u32>,
    /// (rank, step): this rank stops making progress at that step of its
    /// first phase, its heartbeat still going (alive, so nothing proves it
    /// dead): the stall watchdog must end it, and the others must stop
    /// naming the round they wait on, within the run's timeout.
    pub stall_at: Option<(u32, u64)>,
}

/// How the connection check runs.
#[derive(Clone, Copy, Debug)]
pub struct Check {
    /// Every wait's limit.
    pub timeout: Duration,
    /// Where only heartbeats tell, the wait for a missing report.
    pub fault_timeout: Duration,
    /// Steps of agreement per phase (`--iters`).
    pub steps: u64,
    /// What one step's work takes, slept before its agreement (`--step-us`):
    /// a GPU step's stand-in, so that a kill can land inside a step.
    pub step_work: Duration,
    pub on_death: OnDeath,
    pub inject: Inject,
}

/// Runs this rank's side of the connection check over `plan`.
pub fn check_connection(env: &RankEnv, plan: &Plan, check: Check) -> Result<()> {
    crate::nixl::runtime::load()?;
    let opts = RankOptions {
        timeout: check.timeout,
        fault_timeout: check.fault_timeout,
        on_death: check.on_death,
    };
    run_rank(env, plan, opts, |rank| {
        let me = rank.rank();
        let nixl = create_ucx_agent(&rank.group.agent_name(me, rank.incarnation()))?;
        let card = AgentMetadata(nixl.agent.get_local_md()?);
        crate::stall::progressed();
        let mut work = Wiring {
            rank,
            agent: &nixl.agent,
            check,
            known: Vec::new(),
        };
        let lived = rank.drive(&mut work, &card);
        for name in work.known {
            let _ = nixl.agent.invalidate_remote_md(&name);
        }
        lived.map(drop)
    })
}

/// The check's work in each phase: NIXL agents connected to each other,
/// and steps that are a pause (`--step-us`) standing in for a GPU step.
struct Wiring<'a> {
    rank: &'a Rank<'a>,
    agent: &'a Agent,
    check: Check,
    /// Agents whose metadata this rank loaded (invalidated at the end).
    known: Vec<String>,
}

impl PhaseWork for Wiring<'_> {
    type Card = AgentMetadata;

    /// Drops the departed peers and connects to `peers`; those it could
    /// not reach go back to the driver, which judges them.
    fn connect(
        &mut self,
        view: &PhaseView,
        peers: &[Peer<AgentMetadata>],
    ) -> Result<Vec<(u32, anyhow::Error)>> {
        let (me, g) = (view.me, self.rank.group);
        for &(r, inc) in &view.departed {
            let _ = self.agent.invalidate_remote_md(&g.agent_name(r, inc));
        }
        if self.check.inject.die_rank == Some(me) && view.first {
            die(me);
        }
        let mut failed = Vec::new();
        for p in peers {
            let name = g.agent_name(p.rank, p.incarnation);
            let reached =
                load_peer(self.agent, &p.payload.0, &name, self.check.timeout).and_then(|()| {
                    (self.agent.make_connection(&name, None)).map_err(|e| anyhow::anyhow!("{e}"))
                });
            match reached {
                Ok(()) => say!("[rank {me}] connected to rank {} ({name})", p.rank),
                Err(e) => failed.push((
                    p.rank,
                    e.context(format!("connecting to rank {} ({name})", p.rank)),
                )),
            }
            self.known.push(name);
            crate::stall::progressed();
        }
        Ok(failed)
    }

    fn enter(&mut self, view: &PhaseView, unreachable: &BTreeSet<u32>) -> Result<()> {
        say_connected(view, self.rank.plan(), unreachable);
        if self.check.inject.hang_rank == Some(view.me) && view.first {
            hang(self.rank.group)?;
        }
        Ok(())
    }

    fn steps(&self, _: &PhaseView) -> u64 {
        self.check.steps
    }

    /// A pause, before which the phase's last step waits for the plan's
    /// kills to have landed; nothing masked (no kernels: the driver finds
    /// the dead).
    fn step(&mut self, view: &PhaseView, k: u64) -> Result<StepOutcome> {
        let n = self.check.steps;
        if k + 1 == n && n >= 2 {
            await_planned_kills(self.rank, view.phase, self.check.timeout)?;
        }
        if self.check.inject.stall_at == Some((view.me, k)) && view.first {
            crate::stall::waiting_on(format!("an injected stall at step {k}"));
            hang(self.rank.group)?;
        }
        std::thread::sleep(self.check.step_work);
        Ok(StepOutcome::default())
    }

    fn apply(&mut self, _: &PhaseView, _: &Change) -> Result<()> {
        Ok(())
    }

    fn end(&mut self, _: &PhaseView, _: &PhaseRecord) -> Result<()> {
        Ok(())
    }
}

/// The line after connecting in a phase: to whom, and who died meanwhile.
fn say_connected(view: &PhaseView, plan: &Plan, unreachable: &BTreeSet<u32>) {
    let (me, i) = (view.me, view.phase);
    let others = plan.members(i).len() - 1;
    let joiners = (view.joiners.iter()).filter(|&&r| r != me).count();
    match (view.first, unreachable.is_empty()) {
        (true, true) => say!(
            "[rank {me}] connected to all {others} other rank(s) (agents wired up through the store; no GPU used)"
        ),
        (true, false) => say!(
            "[rank {me}] connected to {} of {others} other rank(s); rank(s) {unreachable:?} died meanwhile",
            others - unreachable.len()
        ),
        (false, true) => say!("[rank {me}] phase {i}: connected to {joiners} joiner(s)"),
        (false, false) => say!(
            "[rank {me}] phase {i}: connected to {} of {joiners} joiner(s); rank(s) {unreachable:?} died meanwhile",
            joiners - unreachable.len(),
        ),
    }
}

/// Before the phase's last step: every other rank the plan kills in phase
/// `i` has been killed (the launcher's notice is there), so that a step's
/// agreement names it. The launcher kills at a random moment in the first
/// half of the phase's rounds; steps without a GPU are short, and on a
/// loaded machine the phase could otherwise end first and the kill never
/// land. Errors: no notice within `timeout` (no launcher of ours?).
fn await_planned_kills(rank: &Rank, i: usize, timeout: Duration) -> Result<()> {
    let me = rank.rank();
    let victims: Vec<u32> = (rank.plan().killed(i).into_iter())
        .filter(|&r| r != me)
        .collect();
    let start = std::time::Instant::now();
    for r in victims {
        while rank.died_at(i, r)?.is_none() {
            if start.elapsed() > timeout {
                anyhow::bail!(
                    "the plan kills rank {r} in phase {i}, but no kill came within {timeout:?}: \
                     planned kills need this program's own launcher (not torchrun)"
                );
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    Ok(())
}

/// The injected death: SIGKILL to ourselves, so nothing is cleaned up
/// and our heartbeat key stays, as after a crash.
fn die(me: u32) -> ! {
    say!("[rank {me}] dying (injected fault)");
    // SAFETY: kill(2) on our own pid.
    unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
    loop {
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// The injected hang: stops here, heartbeat going, until killed, or until
/// the group's probe finds a reason to stop (interrupted, an abort, the
/// store lost). Prints the pid, so that a test can freeze this very process.
fn hang(group: &Group) -> Result<()> {
    say!(
        "[rank {}] hanging (injected fault) until stopped or killed (pid {})",
        group.rank,
        std::process::id()
    );
    loop {
        if let Some(why) = group.probe() {
            anyhow::bail!("{why}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
