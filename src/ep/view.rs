//! A remote memory view whose elements belong to different agents: element
//! `r` is rank `r`'s window, so a kernel addresses any peer as
//! `nixlMemViewElem{view, r, offset}` (as NIXL EP does).
//!
//! `crate::nixl::view::prep_remote` names one agent for every descriptor;
//! this is its many-agent sibling (a candidate to move down into
//! `src/nixl/view.rs`). This rank's own element is a null agent: UCX's
//! cuda_ipc refuses a peer in its own process, and the kernels copy their
//! local share with plain stores anyway.

use anyhow::Result;
use nixl_sys::{Agent, Backend, MemView, OptArgs, RemoteDescList, RemoteDescriptor};

use crate::nixl::serdes::{Desc, MemType};

/// One element of a rank-indexed remote view: the peer's buffer and agent
/// name, or `None` for a null-agent placeholder (ourselves).
pub type RankBuffer = Option<(Desc, String)>;

/// Prepares a remote view of every rank's buffer, element `r` = rank `r`.
///
/// NIXL waits (with progress) while UCX endpoints are still connecting, so
/// an error here is final; it names the usual causes.
///
/// # Safety
/// The peers' buffers must stay registered until the view drops.
pub unsafe fn prep_remote_ranks(
    agent: &Agent,
    backend: &Backend,
    buffers: &[RankBuffer],
) -> Result<MemView> {
    let mut list = RemoteDescList::new(MemType::Vram.into())?;
    for b in buffers {
        let d = match b {
            Some((d, name)) => RemoteDescriptor {
                addr: d.addr as usize,
                len: d.len as usize,
                dev_id: d.dev_id,
                remote_agent: Some(name.as_str()),
            },
            None => RemoteDescriptor {
                addr: 0,
                len: 0,
                dev_id: 0,
                remote_agent: None,
            },
        };
        list.add_desc(&d)?;
    }
    let mut opt = OptArgs::new()?;
    opt.add_backend(backend)?;
    unsafe { agent.prep_mem_view_remote(&list, Some(&opt)) }.map_err(|e| {
        anyhow::anyhow!(
            "preparing the memory view of the other ranks' windows failed ({e}). Usual causes: no device-capable UCX \
             lane between the GPUs (\"lane not found\" above: cuda_ipc disabled by UCX_TLS, or processes that cannot \
             share CUDA IPC handles — containers need a shared PID namespace and --ipc=host), or /proc access denied \
             (set UCX_POSIX_USE_PROC_LINK=n)"
        )
    })
}
