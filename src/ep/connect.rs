//! `ep --check-connection`: the ranks meet through the store, wire up
//! their NIXL agents — every rank loads its peers' metadata and connects to
//! them — and live the plan's phases without touching a GPU.
//!
//! It runs the real membership of a GPU run (store, keys, agent names,
//! barriers, heartbeats, the per-step agreement on who is gone, teardown),
//! so it answers before any GPU time is spent: do the ranks find the store,
//! do they all load NIXL, do the agents accept each other's metadata, do
//! joiners connect and do the survivors of a kill agree? And it is testable
//! on any machine. Each phase runs [`STEPS`] steps of agreement in which a
//! rank's masked set is the ranks whose heartbeat it finds silent (the
//! process-level detector: no GPU kernels to time out).

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::Result;

use super::elastic::{Decision, Elastic, Peer};
use super::env::RankEnv;
use super::group::{Group, open_store, process_name};
use super::plan::Plan;
use crate::group::AgentMetadata;
use crate::nixl::agent::create_ucx_agent;
use crate::nixl::view::load_peer;
use crate::say;
use nixl_sys::Agent;

/// Steps of agreement in a phase with kills; the launcher's kills come after the
/// agreement of step [`MIDDLE`], so two steps follow them.
pub const STEPS: u64 = 4;
/// The phase's middle step (0-based).
pub const MIDDLE: u64 = 1;

/// The NIXL agent name of rank `r` in a fixed run (`ep-rank-<r>`).
pub fn agent_name(r: u32) -> String {
    format!("ep-rank-{r}")
}

/// The NIXL agent name of rank `r`'s process started in phase `inc`
/// (`ep-rank-2.1`): a rank id taken again by a new process gets a new
/// agent name, so its peers never confuse it with its predecessor.
pub fn incarnation_agent(r: u32, inc: usize) -> String {
    format!("ep-rank-{}", process_name(r, inc))
}

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

/// Runs this rank's side of the connection check over `plan`;
/// `fault_timeout` bounds the agreement's wait for a missing report.
pub fn check_connection(
    env: &RankEnv,
    plan: &Plan,
    timeout: Duration,
    fault_timeout: Duration,
    inject: Inject,
) -> Result<()> {
    crate::nixl::runtime::load()?;
    let store = open_store(env, timeout)?;
    crate::interrupt::install()?;
    let group = Group::new(store.as_ref(), env, timeout);
    group.run(|| {
        let elastic = Elastic::new(&group, plan, env.incarnation, fault_timeout)?;
        live(&group, &elastic, timeout, inject)
    })
}

/// Every phase of this process's life.
fn live(group: &Group, elastic: &Elastic, timeout: Duration, inject: Inject) -> Result<()> {
    let me = group.rank;
    let nixl = create_ucx_agent(&incarnation_agent(me, elastic.incarnation()))?;
    let mine = AgentMetadata(nixl.agent.get_local_md()?);
    let mut known: Vec<String> = Vec::new();
    for i in elastic.life() {
        for (r, inc) in elastic.departed(i) {
            let _ = nixl.agent.invalidate_remote_md(&incarnation_agent(r, inc));
        }
        let first = i == elastic.life().start;
        let peers = elastic.begin_phase(i, &mine)?;
        if inject.die_rank == Some(me) && first {
            die(me);
        }
        connect_phase(elastic, &nixl.agent, i, &peers, timeout, &mut known)?;
        if inject.hang_rank == Some(me) && first {
            hang(group)?;
        }
        elastic.connected(i)?;
        // Steps of agreement only where the plan kills: elsewhere they would
        // only judge the heartbeats of 64 processes on a loaded machine.
        if !elastic.plan().killed(i).is_empty() {
            steps(group, elastic, i)?;
        }
        elastic.end_phase(i)?;
    }
    for name in known {
        let _ = nixl.agent.invalidate_remote_md(&name);
    }
    Ok(())
}

/// Phase `i` begins: this rank connects to `peers`, those it must reach
/// now ([`Elastic::begin_phase`]).
/// A peer that cannot be reached is blamed by its heartbeat: a dead one is
/// named as dead ([`Elastic::blame`]).
fn connect_phase(
    elastic: &Elastic,
    agent: &Agent,
    i: usize,
    peers: &[Peer<AgentMetadata>],
    timeout: Duration,
    known: &mut Vec<String>,
) -> Result<()> {
    let me = elastic.rank();
    for p in peers {
        let name = incarnation_agent(p.rank, p.incarnation);
        let reached = load_peer(agent, &p.payload.0, &name, timeout).and_then(|()| {
            (agent.make_connection(&name, None)).map_err(|e| anyhow::anyhow!("{e}"))
        });
        reached.map_err(|e| {
            let e = e.context(format!("connecting to rank {} ({name})", p.rank));
            elastic.blame(p.rank, p.incarnation, e)
        })?;
        say!("[rank {me}] connected to rank {} ({name})", p.rank);
        known.push(name);
    }
    let others = elastic.plan().members(i).len() - 1;
    match i == elastic.life().start {
        true => say!(
            "[rank {me}] connected to all {others} other rank(s) (agents wired up through the store; no GPU used)"
        ),
        false => say!(
            "[rank {me}] phase {i}: connected to {} joiner(s)",
            peers.len()
        ),
    }
    Ok(())
}

/// The phase's steps: after each, the agreement on who is gone, with this
/// rank's masked set from heartbeat silence; one line per decision that
/// found a rank gone.
fn steps(group: &Group, elastic: &Elastic, i: usize) -> Result<()> {
    let me = group.rank;
    let mut masked: BTreeSet<u32> = BTreeSet::new();
    let mut gone: BTreeSet<u32> = BTreeSet::new();
    for k in 0..STEPS {
        let active: Vec<(usize, String)> = (elastic.plan().members(i).into_iter())
            .filter(|r| *r != me && !gone.contains(r))
            .map(|r| {
                let inc = elastic.plan().incarnation(r, i).expect("a member");
                (r as usize, process_name(r, inc))
            })
            .collect();
        elastic.steps_begin(i)?;
        masked.extend(group.silent_among(&active)?.into_iter().map(|r| r as u32));
        let d = elastic.agree(i, i as u64 * STEPS + k, &masked)?;
        if !d.new.is_empty() {
            say!("{}", decision_line(me, i, &d));
        }
        gone.clone_from(&d.gone);
        masked.retain(|r| d.gone.contains(r));
        if k == MIDDLE {
            elastic.halfway(i, &d)?;
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
