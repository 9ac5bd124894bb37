//! `simple_write --check-connection`: the two processes meet through the
//! store and wire up their NIXL agents, without touching a GPU.
//!
//! Useful before a GPU run (is the port reachable, do both sides load NIXL,
//! do the agents accept each other's metadata?) and testable on any machine.
//! It uses the real keys, agent names and handshake of a GPU run: the
//! target claims its role, both publish `getLocalMD()`, each loads the
//! other's metadata and connects, and the teardown handshake ends it.

use anyhow::Result;

use super::keys;
use super::peer::Peer;
use crate::nixl::agent::create_ucx_agent;
use crate::nixl::view::load_peer;
use crate::say;
use crate::store::Store;

/// The initiator's side. Returns once the target confirmed.
pub fn initiator(store: &dyn Store, timeout: std::time::Duration) -> Result<()> {
    let peer = Peer::new(store, "initiator", "target", timeout);
    peer.with_heartbeat(|| {
        let nixl = create_ucx_agent(keys::INITIATOR_NAME)?;
        peer.set(keys::INITIATOR_META, &nixl.agent.get_local_md()?)?;
        let md = peer.get(keys::TARGET_META, "agent metadata")?;
        load_peer(&nixl.agent, &md, keys::TARGET_NAME, timeout)?;
        nixl.agent.make_connection(keys::TARGET_NAME, None)?;
        say!("[initiator] Connected to target (agents wired up through the store; no GPU used)");
        peer.set(keys::INITIATOR_DONE, b"")?;
        peer.get(keys::TARGET_DONE, "completion")?;
        let _ = nixl.agent.invalidate_remote_md(keys::TARGET_NAME);
        peer.delete(&[
            keys::INITIATOR_META,
            keys::INITIATOR_DONE,
            keys::TARGET_DONE,
            keys::TARGET_CLAIM,
        ]);
        Ok(())
    })
}

/// The target's side.
pub fn target(store: &dyn Store, timeout: std::time::Duration) -> Result<()> {
    let peer = Peer::new(store, "target", "initiator", timeout);
    let token = format!("pid {} (connection check)", std::process::id());
    let holder = store.compare_set(keys::TARGET_CLAIM, b"", token.as_bytes())?;
    anyhow::ensure!(
        holder == token.as_bytes(),
        "another target ({}) already joined this initiator's store",
        String::from_utf8_lossy(&holder)
    );
    peer.with_heartbeat(|| {
        let nixl = create_ucx_agent(keys::TARGET_NAME)?;
        peer.set(keys::TARGET_META, &nixl.agent.get_local_md()?)?;
        let md = peer.get(keys::INITIATOR_META, "agent metadata")?;
        load_peer(&nixl.agent, &md, keys::INITIATOR_NAME, timeout)?;
        say!("[target] Connected to initiator (agents wired up through the store; no GPU used)");
        peer.get(keys::INITIATOR_DONE, "release")?;
        let _ = nixl.agent.invalidate_remote_md(keys::INITIATOR_NAME);
        peer.delete(&[keys::TARGET_META]);
        peer.set(keys::TARGET_DONE, b"")?;
        Ok(())
    })
}
