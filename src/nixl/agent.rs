//! Creating NIXL agents with the UCX backend, the way the examples need them.

use std::time::Duration;

use anyhow::{Context, Result};
use nixl_sys::{Agent, AgentConfig, Backend};

use super::runtime;
use crate::deadline::{Pace, poll};

/// An agent with its UCX backend.
pub struct UcxAgent {
    pub agent: Agent,
    pub backend: Backend,
}

/// Creates agent `name` with a progress thread and no listener
/// (`nixlAgentConfig(true)`), plus the UCX backend from the plugin's default
/// parameters with `num_workers=1` and `ucx_error_handling_mode=none`: the
/// settings of upstream's `simple_write`, and what the device API needs
/// (the thread keeps UCX's endpoints progressing while kernels move data).
///
/// Loads NIXL first ([`runtime::load`]). Errors name the cause: NIXL
/// missing, the UCX plugin missing from `NIXL_PLUGIN_DIR`, backend creation
/// refused.
pub fn create_ucx_agent(name: &str) -> Result<UcxAgent> {
    create_with(name, true)
}

/// Creates agent `name` with no progress thread and no listener, plus the
/// UCX backend of [`create_ucx_agent`]. For the host-API examples, which
/// poll anyway (`getXferStatus` and `getNotifs` both progress the worker).
///
/// Why not a progress thread there: nixl-sys's default thread delay is
/// 0 µs, which NIXL's UCX backend turns into `poll(..., 0)`: the thread
/// spins, taking the UCX worker lock on every pass, and every call of the
/// main thread queues behind it. On a 2-core machine the streaming example
/// measured 1–4 ms per call and 0.01 GB/s for 64 KiB transfers with the
/// thread, 20–40 µs and 0.6–0.8 GB/s without it. Without it, a caller
/// waiting for a transfer or a notification must keep calling
/// `get_xfer_status` / `get_notifications`.
pub fn create_polled_agent(name: &str) -> Result<UcxAgent> {
    create_with(name, false)
}

fn create_with(name: &str, progress_thread: bool) -> Result<UcxAgent> {
    let rt = runtime::load()?;
    let cfg = AgentConfig {
        enable_prog_thread: progress_thread,
        enable_listen_thread: false,
        ..Default::default()
    };
    let agent = Agent::new_configured(name, &cfg).with_context(|| {
        format!(
            "creating NIXL agent '{name}' (library in {})",
            rt.lib_dir.display()
        )
    })?;
    let (_mems, mut params) = agent.get_plugin_params("UCX").with_context(|| {
        format!(
            "NIXL's UCX plugin is not loadable from {} (NIXL_PLUGIN_DIR): is libplugin_UCX.so there, with its UCX libraries?",
            rt.plugin_dir.display()
        )
    })?;
    params.set("num_workers", "1")?;
    params.set("ucx_error_handling_mode", "none")?;
    let backend = agent.create_backend("UCX", &params).context(
        "creating the UCX backend (UCX could not initialise: see UCX's own messages above)",
    )?;
    Ok(UcxAgent { agent, backend })
}

/// Polls `check_remote_metadata` every 10 ms until the remote agent's
/// metadata is loaded (as upstream's `checkRemoteMD` loop), for at most
/// `timeout`.
pub fn wait_remote_md(agent: &Agent, remote: &str, timeout: Duration) -> Result<()> {
    poll(
        timeout,
        Pace::Every(Duration::from_millis(10)),
        || Ok(agent.check_remote_metadata(remote, None).then_some(())),
        |waited| {
            anyhow::anyhow!(
                "metadata of agent '{remote}' was not usable after {waited:?}: the peer's metadata did not load \
                 (different NIXL versions?)"
            )
        },
    )
}
