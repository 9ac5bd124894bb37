//! `ep --check-connection`: the ranks meet through the store and wire up
//! their NIXL agents — every rank loads every other rank's metadata and
//! connects to it — without touching a GPU.
//!
//! It runs the real start of a GPU run (store, keys, agent names, barriers,
//! heartbeats, teardown), so it answers before any GPU time is spent: do
//! the ranks find the store, do they all load NIXL, do the agents accept
//! each other's metadata? And it is testable on any machine.

use std::time::Duration;

use anyhow::Result;

use super::env::RankEnv;
use super::group::{Group, open_store};
use crate::group::AgentMetadata;
use crate::nixl::agent::create_ucx_agent;
use crate::nixl::view::load_peer;
use crate::say;

/// The NIXL agent name of rank `r`.
pub fn agent_name(r: u32) -> String {
    format!("ep-rank-{r}")
}

/// Test hooks (`--inject`, hidden).
#[derive(Clone, Copy, Debug, Default)]
pub struct Inject {
    /// This rank stops after connecting (heartbeat still running) until it
    /// is killed: the others must name it once it dies.
    pub hang_rank: Option<u32>,
}

/// Runs this rank's side of the connection check.
pub fn check_connection(env: &RankEnv, timeout: Duration, inject: Inject) -> Result<()> {
    crate::nixl::runtime::load()?;
    let store = open_store(env, timeout)?;
    crate::interrupt::install()?;
    let group = Group::new(store.as_ref(), env, timeout);
    group.run(|| wire_up(&group, timeout, inject).and_then(|()| group.leave()))
}

fn wire_up(group: &Group, timeout: Duration, inject: Inject) -> Result<()> {
    let (me, n) = (group.rank, group.world);
    let nixl = create_ucx_agent(&agent_name(me))?;
    group.put(
        &group.keys.metadata(me),
        &AgentMetadata(nixl.agent.get_local_md()?),
    )?;
    let peers: Vec<u32> = (0..n).filter(|&r| r != me).collect();
    for &r in &peers {
        let md = group.get(&group.keys.metadata(r), r, "agent metadata")?;
        load_peer(&nixl.agent, &md.0, &agent_name(r), timeout)?;
        nixl.agent
            .make_connection(&agent_name(r), None)
            .map_err(|e| anyhow::anyhow!("connecting to rank {r} ({}): {e}", agent_name(r)))?;
        say!("[rank {me}] connected to rank {r} ({})", agent_name(r));
    }
    say!(
        "[rank {me}] connected to all {} other rank(s) (agents wired up through the store; no GPU used)",
        peers.len()
    );
    group.barrier("connected")?;
    if inject.hang_rank == Some(me) {
        say!("[rank {me}] hanging (injected fault) until stopped or killed");
        loop {
            if let Some(sig) = crate::interrupt::received() {
                anyhow::bail!("{sig}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    for &r in &peers {
        let _ = nixl.agent.invalidate_remote_md(&agent_name(r));
    }
    Ok(())
}
