//! Agents for the host-API examples, which drive UCX from their own polls.
//!
//! [`super::agent::create_ucx_agent`] gives the agent a progress thread
//! with nixl-sys's default delay of 0 µs, and NIXL's UCX backend turns a
//! delay of 0 into `poll(..., 0)`: the thread spins, taking the UCX worker
//! lock on every pass. With two such processes on one machine every
//! `postXferReq`, `getXferStatus` and `genNotif` of the main thread queues
//! behind a spinning thread: on a 2-core machine the streaming example
//! measured 1–4 ms per call and 0.01 GB/s for 64 KiB transfers, against
//! 20–40 µs and 0.6–0.8 GB/s without the thread. The host-API examples
//! poll anyway (`getXferStatus` and `getNotifs` both progress the worker),
//! so they need no thread.

use anyhow::Result;
use nixl_sys::AgentConfig;

use super::agent::{UcxAgent, create_ucx_agent_with};

/// Creates agent `name` with no progress thread and no listener thread,
/// plus the UCX backend with the settings of
/// [`super::agent::create_ucx_agent`] (`num_workers=1`,
/// `ucx_error_handling_mode=none`). UCX then advances only inside NIXL
/// calls: a caller waiting for a transfer or a notification must keep
/// calling `get_xfer_status` / `get_notifications`.
pub fn create_polled_agent(name: &str) -> Result<UcxAgent> {
    create_ucx_agent_with(
        name,
        &AgentConfig {
            enable_prog_thread: false,
            enable_listen_thread: false,
            ..Default::default()
        },
    )
}
