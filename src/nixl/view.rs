//! NIXL memory views: the device-side handles kernels address buffers by.
//!
//! `prepMemView` (nixl-sys `prep_mem_view_local` / `prep_mem_view_remote`)
//! turns a descriptor list into a `nixlMemViewH`, a device pointer to a UCX
//! memory list. A local view names our own registered buffers; a remote view
//! names a peer's, and carries what the transport needs to reach them (on
//! cuda_ipc, the mapped peer address). The view is released when the
//! `MemView` drops, which must happen before the memory is deregistered.

use std::time::Duration;

use anyhow::{Context, Result, bail};
use nixl_sys::{Agent, Backend, MemView, OptArgs};

use super::serdes::DescList;

fn backend_hint(backend: &Backend) -> Result<OptArgs> {
    let mut opt = OptArgs::new()?;
    opt.add_backend(backend)?;
    Ok(opt)
}

/// Prepares a view of our own registered buffers.
///
/// # Safety
/// The buffers must stay allocated and registered until the view drops.
pub unsafe fn prep_local(agent: &Agent, backend: &Backend, descs: &DescList) -> Result<MemView> {
    let list = descs.to_xfer_dlist()?;
    let opt = backend_hint(backend)?;
    unsafe { agent.prep_mem_view_local(&list, Some(&opt)) }.map_err(|e| {
        anyhow::anyhow!(
            "preparing a local memory view failed ({e}): UCX found no device-capable transport for this memory. \
             Is CUDA initialised before the agent, and is cuda_ipc allowed (UCX_TLS must not exclude it)?"
        )
    })
}

/// Prepares a view of `remote_agent`'s buffers.
///
/// NIXL itself waits (with progress) while the UCX endpoint to the peer is
/// still connecting, so any error here is final: usually no device-capable
/// transport (UCX prints "lane not found for element 0").
///
/// # Safety
/// The peer's buffers must stay registered until the view drops.
pub unsafe fn prep_remote(
    agent: &Agent,
    backend: &Backend,
    descs: &DescList,
    remote_agent: &str,
) -> Result<MemView> {
    let list = descs.to_remote_dlist(remote_agent)?;
    let opt = backend_hint(backend)?;
    unsafe { agent.prep_mem_view_remote(&list, Some(&opt)) }.map_err(|e| {
        anyhow::anyhow!(
            "preparing a memory view of {remote_agent}'s buffers failed ({e}). Usual causes: no device-capable UCX \
             lane between the two GPUs (\"lane not found\" above: cuda_ipc disabled by UCX_TLS, or the processes \
             cannot share CUDA IPC handles — containers need a shared PID namespace and --ipc=host), or /proc \
             access denied (set UCX_POSIX_USE_PROC_LINK=n), or both agents in one process (UCX's cuda_ipc refuses \
             a peer in its own process: \"cannot reach ...: same process\" at UCX_LOG_LEVEL=debug)"
        )
    })
}

/// Loads a peer's metadata blob (from `getLocalMD`) and waits until it is usable.
pub fn load_peer(
    agent: &Agent,
    metadata: &[u8],
    expected_name: &str,
    timeout: Duration,
) -> Result<()> {
    let name = agent
        .load_remote_md(metadata)
        .context("loading the peer's agent metadata")?;
    if name != expected_name {
        bail!(
            "the store holds metadata of agent '{name}', expected '{expected_name}': another pair of processes is using this port"
        );
    }
    super::agent::wait_remote_md(agent, &name, timeout)
}
