//! NIXL memory views: the device-side handles kernels address buffers by.
//!
//! `prepMemView` (nixl-sys `prep_mem_view_local` / `prep_mem_view_remote`)
//! turns a descriptor list into a `nixlMemViewH`, a device pointer to a UCX
//! memory list. A local view names our own registered buffers; a remote view
//! names a peer's, and carries what the transport needs to reach them (on
//! cuda_ipc, the mapped peer address). The view is released when the
//! `MemView` drops, which must happen before the memory is deregistered.

use std::mem::{offset_of, size_of};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use nixl_sys::{Agent, Backend, MemView, OptArgs, RemoteDescList, RemoteDescriptor};

use super::serdes::{Desc, DescList, MemType};

/// `nixlMemViewElem` from `nixl_device.cuh`: a memory view handle, the
/// index of a buffer in the view, and a byte offset into that buffer.
/// Passed to kernels by value; 24 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemViewElem {
    /// `nixlMemViewH`: the device pointer NIXL's `prepMemView` returned
    /// (`nixl_sys::MemView::as_ptr`).
    pub mvh: u64,
    /// Buffer index within the view (the descriptor's position in its list).
    pub index: u64,
    /// Byte offset into that buffer.
    pub offset: u64,
}

impl MemViewElem {
    /// Element `index` of `view`, at offset 0.
    pub fn new(view: &nixl_sys::MemView, index: u64) -> Self {
        Self {
            mvh: view.as_ptr() as u64,
            index,
            offset: 0,
        }
    }
}

// The layout contract with the kernels (cuda/kernels.cu asserts the same).
const _: () = {
    assert!(size_of::<MemViewElem>() == 24);
    assert!(offset_of!(MemViewElem, index) == 8 && offset_of!(MemViewElem, offset) == 16);
};

// SAFETY: plain #[repr(C)] data whose layout matches the kernel parameters.
unsafe impl cudarc::driver::DeviceRepr for MemViewElem {}

/// The two memory views an N-rank kernel works through, as it takes them:
/// `nixlMemViewH` device pointers ([`MemView::as_ptr`]), 0 where there is
/// none. `local` views this rank's window (one buffer, index 0); `remote`
/// is rank-indexed, element `r` rank `r`'s window ([`prep_remote_ranks`]).
/// A kernel addresses one byte of either as a
/// [`MemViewElem`] `{view, index, offset}`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Views {
    pub local: u64,
    pub remote: u64,
}

impl Views {
    /// The handles of `local` and `remote` (0 for a view not prepared: a
    /// single rank has no remote view).
    pub fn of(local: Option<&MemView>, remote: Option<&MemView>) -> Self {
        let handle = |v: Option<&MemView>| v.map_or(0, |v| v.as_ptr() as u64);
        Self {
            local: handle(local),
            remote: handle(remote),
        }
    }
}

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
    unsafe { agent.prep_mem_view_remote(&list, Some(&opt)) }
        .map_err(|e| remote_view_error(&format!("{remote_agent}'s buffers"), e))
}

/// One element of a rank-indexed remote view: the peer's buffer and agent
/// name, or `None` for a null-agent placeholder (this rank itself).
pub type RankBuffer = Option<(Desc, String)>;

/// Prepares one remote view whose elements belong to different agents:
/// element `r` is rank `r`'s buffer, so a kernel addresses any peer as
/// `nixlMemViewElem{view, r, offset}` (NIXL EP's layout). [`prep_remote`]
/// names one agent for every descriptor; this names one per element.
///
/// This rank's own element is a null agent (`None`): UCX's cuda_ipc refuses
/// a peer in its own process, and kernels copy their local share with plain
/// stores anyway.
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
        list.add_desc(&RemoteDescriptor {
            addr: b.as_ref().map_or(0, |(d, _)| d.addr as usize),
            len: b.as_ref().map_or(0, |(d, _)| d.len as usize),
            dev_id: b.as_ref().map_or(0, |(d, _)| d.dev_id),
            remote_agent: b.as_ref().map(|(_, name)| name.as_str()),
        })?;
    }
    let opt = backend_hint(backend)?;
    unsafe { agent.prep_mem_view_remote(&list, Some(&opt)) }
        .map_err(|e| remote_view_error("the other ranks' buffers", e))
}

/// The error of a failed remote `prepMemView`, naming the usual causes.
fn remote_view_error(what: &str, e: impl std::fmt::Display) -> anyhow::Error {
    anyhow::anyhow!(
        "preparing a memory view of {what} failed ({e}). Usual causes: no device-capable UCX \
         lane between the GPUs (\"lane not found\" above: cuda_ipc disabled by UCX_TLS, or the processes \
         cannot share CUDA IPC handles — containers need a shared PID namespace and --ipc=host), or /proc \
         access denied (set UCX_POSIX_USE_PROC_LINK=n), or both agents in one process (UCX's cuda_ipc refuses \
         a peer in its own process: \"cannot reach ...: same process\" at UCX_LOG_LEVEL=debug)"
    )
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
