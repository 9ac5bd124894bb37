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

use super::protocol::{self as p, AgentMetadata, Role};
use super::session::Session;
use super::target::claim_pair;
use crate::nixl::agent::create_ucx_agent;
use crate::nixl::view::load_peer;
use crate::say;
use crate::store::Store;

/// The initiator's side. Returns once the target confirmed.
pub fn initiator(store: &dyn Store, timeout: Duration) -> Result<()> {
    let session = Session::new(store, Role::Initiator, timeout);
    session.with_heartbeat(|| {
        let nixl = create_ucx_agent(p::INITIATOR_NAME)?;
        session.put(
            &p::initiator_meta(),
            &AgentMetadata(nixl.agent.get_local_md()?),
        )?;
        let md = session.get(&p::target_meta(), "agent metadata")?;
        load_peer(&nixl.agent, &md.0, p::TARGET_NAME, timeout)?;
        nixl.agent.make_connection(p::TARGET_NAME, None)?;
        say!("[initiator] Connected to target (agents wired up through the store; no GPU used)");
        session.mark(&p::initiator_done())?;
        session.get(&p::target_done(), "completion")?;
        let _ = nixl.agent.invalidate_remote_md(p::TARGET_NAME);
        session.delete([
            p::initiator_meta().key(),
            p::initiator_done().key(),
            p::target_done().key(),
            p::target_claim().key(),
        ]);
        Ok(())
    })
}

/// The target's side.
pub fn target(store: &dyn Store, timeout: Duration) -> Result<()> {
    let session = Session::new(store, Role::Target, timeout);
    claim_pair(&session, true)?;
    session.with_heartbeat(|| {
        let nixl = create_ucx_agent(p::TARGET_NAME)?;
        session.put(
            &p::target_meta(),
            &AgentMetadata(nixl.agent.get_local_md()?),
        )?;
        let md = session.get(&p::initiator_meta(), "agent metadata")?;
        load_peer(&nixl.agent, &md.0, p::INITIATOR_NAME, timeout)?;
        say!("[target] Connected to initiator (agents wired up through the store; no GPU used)");
        session.get(&p::initiator_done(), "release")?;
        let _ = nixl.agent.invalidate_remote_md(p::INITIATOR_NAME);
        session.delete([p::target_meta().key()]);
        session.mark(&p::target_done())?;
        Ok(())
    })
}
