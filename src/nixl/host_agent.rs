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

use anyhow::{Context, Result};
use nixl_sys::{Agent, AgentConfig};

use super::agent::UcxAgent;
use super::runtime;

/// Creates agent `name` with no progress thread and no listener thread,
/// plus the UCX backend with the settings of
/// [`super::agent::create_ucx_agent`] (`num_workers=1`,
/// `ucx_error_handling_mode=none`). UCX then advances only inside NIXL
/// calls: a caller waiting for a transfer or a notification must keep
/// calling `get_xfer_status` / `get_notifications`.
///
/// Errors name the cause: NIXL missing, the UCX plugin missing from
/// `NIXL_PLUGIN_DIR`, backend creation refused.
pub fn create_polled_agent(name: &str) -> Result<UcxAgent> {
    let rt = runtime::load()?;
    let cfg = AgentConfig { enable_prog_thread: false, enable_listen_thread: false, ..Default::default() };
    let agent = Agent::new_configured(name, &cfg)
        .with_context(|| format!("creating NIXL agent '{name}' (library in {})", rt.lib_dir.display()))?;
    let (_mems, mut params) = agent.get_plugin_params("UCX").with_context(|| {
        format!(
            "NIXL's UCX plugin is not loadable from {} (NIXL_PLUGIN_DIR): is libplugin_UCX.so there, with its UCX libraries?",
            rt.plugin_dir.display()
        )
    })?;
    params.set("num_workers", "1")?;
    params.set("ucx_error_handling_mode", "none")?;
    let backend = agent
        .create_backend("UCX", &params)
        .context("creating the UCX backend (UCX could not initialise: see UCX's own messages above)")?;
    Ok(UcxAgent { agent, backend })
}
