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

use super::env::RankEnv;
use super::group::{Group, open_store};
use super::membership::{Decision, Membership, OnDeath, Peer};
use super::plan::Plan;
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
    let store = open_store(env, check.timeout)?;
    crate::interrupt::install()?;
    let group = Group::new(store.as_ref(), env, check.timeout);
    group.run(|| {
        let elastic = Membership::new(
            &group,
            plan,
            env.incarnation,
            check.fault_timeout,
            check.on_death,
        )?;
        live(&group, &elastic, check)
    })
}

/// Every phase of this process's life.
fn live(group: &Group, elastic: &Membership, check: Check) -> Result<()> {
    let (me, inject) = (group.rank, check.inject);
    let nixl = create_ucx_agent(&group.agent_name(me, elastic.incarnation()))?;
    let mine = AgentMetadata(nixl.agent.get_local_md()?);
    let mut known: Vec<String> = Vec::new();
    for i in elastic.life() {
        for (r, inc) in elastic.departed(i) {
            let _ = nixl.agent.invalidate_remote_md(&group.agent_name(r, inc));
        }
        let first = i == elastic.life().start;
        let new = elastic.begin_phase(i, &mine, || Ok(()))?;
        if inject.die_rank == Some(me) && first {
            die(me);
        }
        let unreachable = connect_phase(
            elastic,
            &nixl.agent,
            i,
            &new.peers,
            check.timeout,
            &mut known,
        )?;
        if inject.hang_rank == Some(me) && first {
            hang(group)?;
        }
        say_gone(me, i, &elastic.opened(i, &(&new.gone | &unreachable))?);
        steps(group, elastic, i, &check)?;
        say_gone(me, i, &elastic.end_phase(i)?);
    }
    for name in known {
        let _ = nixl.agent.invalidate_remote_md(&name);
    }
    Ok(())
}

/// A decision's line when it found a rank gone.
fn say_gone(me: u32, i: usize, d: &Decision) {
    if !d.new.is_empty() {
        say!("{}", decision_line(me, i, d));
    }
}

/// Phase `i` begins: this rank connects to `peers`, those it must reach
/// now ([`Membership::begin_phase`]). Returns the peers that died while it
/// connected (the launcher's notice, or a silent heartbeat), for the
/// opening round to agree on when the run survives deaths; any other
/// failure to reach a peer is an error naming it ([`Membership::blame`]).
fn connect_phase(
    elastic: &Membership,
    agent: &Agent,
    i: usize,
    peers: &[Peer<AgentMetadata>],
    timeout: Duration,
    known: &mut Vec<String>,
) -> Result<BTreeSet<u32>> {
    let me = elastic.rank();
    let mut unreachable = BTreeSet::new();
    for p in peers {
        let name = elastic.group().agent_name(p.rank, p.incarnation);
        let reached = load_peer(agent, &p.payload.0, &name, timeout).and_then(|()| {
            (agent.make_connection(&name, None)).map_err(|e| anyhow::anyhow!("{e}"))
        });
        match reached {
            Ok(()) => say!("[rank {me}] connected to rank {} ({name})", p.rank),
            Err(_) if elastic.survives() && elastic.is_dead(p.rank, p.incarnation)? => {
                unreachable.insert(p.rank);
                continue;
            }
            Err(e) => {
                let e = e.context(format!("connecting to rank {} ({name})", p.rank));
                return Err(elastic.blame(p.rank, p.incarnation, e));
            }
        }
        known.push(name);
    }
    let others = elastic.plan().members(i).len() - 1;
    match (i == elastic.life().start, unreachable.is_empty()) {
        (true, true) => say!(
            "[rank {me}] connected to all {others} other rank(s) (agents wired up through the store; no GPU used)"
        ),
        (true, false) => say!(
            "[rank {me}] connected to {} of {others} other rank(s); rank(s) {unreachable:?} died meanwhile",
            others - unreachable.len()
        ),
        (false, true) => say!(
            "[rank {me}] phase {i}: connected to {} joiner(s)",
            peers.len()
        ),
        (false, false) => say!(
            "[rank {me}] phase {i}: connected to {} of {} joiner(s); rank(s) {unreachable:?} died meanwhile",
            peers.len() - unreachable.len(),
            peers.len()
        ),
    }
    Ok(unreachable)
}

/// The phase's steps (`check.steps`), each its work (a pause) then the
/// agreement on who is gone, with this rank's masked set from the
/// launcher's notices and silent heartbeats; one line per decision that
/// found a rank gone.
fn steps(group: &Group, elastic: &Membership, i: usize, check: &Check) -> Result<()> {
    let (me, n) = (group.rank, check.steps);
    let mut masked: BTreeSet<u32> = BTreeSet::new();
    for k in 0..n {
        let others: Vec<u32> = elastic.active(i).into_iter().filter(|&r| r != me).collect();
        if k + 1 == n && n >= 2 {
            await_planned_kills(elastic, i, check.timeout)?;
        }
        elastic.steps_begin(i)?;
        std::thread::sleep(check.step_work);
        masked.extend(elastic.found_dead(&others, i)?);
        let d = elastic.agree(i, i as u64 * n + k, &masked)?;
        say_gone(me, i, &d);
        masked.retain(|r| d.gone.contains(r));
    }
    Ok(())
}

/// Before the phase's last step: every other rank the plan kills in phase
/// `i` has been killed (the launcher's notice is there), so that a step's
/// agreement names it. The launcher kills at a random moment in the first
/// half of the phase's rounds; steps without a GPU are short, and on a
/// loaded machine the phase could otherwise end first and the kill never
/// land. Errors: no notice within `timeout` (no launcher of ours?).
fn await_planned_kills(elastic: &Membership, i: usize, timeout: Duration) -> Result<()> {
    let me = elastic.rank();
    let victims: Vec<u32> = (elastic.plan().killed(i).into_iter())
        .filter(|&r| r != me)
        .collect();
    let start = std::time::Instant::now();
    for r in victims {
        while elastic.died_at(i, r)?.is_none() {
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
