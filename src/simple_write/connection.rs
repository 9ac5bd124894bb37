//! `simple_write --check-connection`: the two processes meet through the
//! store and wire up their NIXL agents, without touching a GPU.
//!
//! Useful before a GPU run (is the port reachable, do both sides load NIXL,
//! do the agents accept each other's metadata?) and testable on any machine.
//! It uses the real keys, agent names and handshake of a GPU run: the
//! target claims its role, both publish `getLocalMD()`, each loads the
//! other's metadata and connects, and the teardown handshake ends it.

use std::time::Duration;

use anyhow::Result;

use super::protocol::{self as p, AgentMetadata, Marker};
use super::target_role::claim_pair;
use crate::group::Member;
use crate::nixl::agent::create_ucx_agent;
use crate::nixl::view::load_peer;
use crate::say;

/// The initiator's side. Returns once the target confirmed. With `hang`
/// (a test hook) it stops once connected, heartbeat still going, until
/// interrupted or killed.
pub fn initiator(member: &Member, hang: bool) -> Result<()> {
    member.run(|| {
        let nixl = create_ucx_agent(p::INITIATOR_NAME)?;
        member.put(
            &p::initiator_meta(),
            &AgentMetadata(nixl.agent.get_local_md()?),
        )?;
        let md = member.get(&p::target_meta(), p::TARGET, "agent metadata")?;
        let reached = load_peer(&nixl.agent, &md.0, p::TARGET_NAME, member.timeout())
            .and_then(|()| Ok(nixl.agent.make_connection(p::TARGET_NAME, None)?));
        reached.map_err(|e| member.blame_member(p::TARGET, e))?;
        say!("[initiator] Connected to target (agents wired up through the store; no GPU used)");
        hang_if(hang, "initiator")?;
        member.mark(&p::initiator_done())?;
        let done = member.get(&p::target_done(), p::TARGET, "completion");
        member.delete([p::target_done().key()]);
        let _ = nixl.agent.invalidate_remote_md(p::TARGET_NAME);
        done.map(drop)
    })
}

/// The target's side (`hang` as for the initiator).
pub fn target(member: &Member, hang: bool) -> Result<()> {
    claim_pair(member, true)?;
    member.run(|| {
        let nixl = create_ucx_agent(p::TARGET_NAME)?;
        member.put(
            &p::target_meta(),
            &AgentMetadata(nixl.agent.get_local_md()?),
        )?;
        let md = member.get(&p::initiator_meta(), p::INITIATOR, "agent metadata")?;
        load_peer(&nixl.agent, &md.0, p::INITIATOR_NAME, member.timeout())
            .map_err(|e| member.blame_member(p::INITIATOR, e))?;
        say!("[target] Connected to initiator (agents wired up through the store; no GPU used)");
        hang_if(hang, "target")?;
        member.get(&p::initiator_done(), p::INITIATOR, "release")?;
        let _ = nixl.agent.invalidate_remote_md(p::INITIATOR_NAME);
        member.delete_written();
        member.put_final(&p::target_done(), &Marker)
    })
}

/// `--inject hang-after-connect`: waits until interrupted (or killed), so
/// a test can freeze or kill this role at a known point.
fn hang_if(hang: bool, role: &str) -> Result<()> {
    if !hang {
        return Ok(());
    }
    say!("[{role}] Hanging (injected fault) until stopped or killed");
    loop {
        if let Some(sig) = crate::interrupt::received() {
            anyhow::bail!("{sig}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
