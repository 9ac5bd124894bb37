//! Creating NIXL agents the way the examples need them.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use nixl_sys::{Agent, AgentConfig, Backend};

use super::runtime;

/// An agent with its UCX backend.
pub struct UcxAgent {
    pub agent: Agent,
    pub backend: Backend,
}

/// Creates agent `name` with a progress thread and no listener
/// (`nixlAgentConfig(true)`), plus the UCX backend from the plugin's default
/// parameters with `num_workers=1` and `ucx_error_handling_mode=none`, the
/// settings of upstream's `simple_write`.
///
/// Loads NIXL first ([`runtime::load`]). Errors name the cause: NIXL
/// missing, the UCX plugin missing from `NIXL_PLUGIN_DIR`, backend creation
/// refused.
pub fn create_ucx_agent(name: &str) -> Result<UcxAgent> {
    create_ucx_agent_with(
        name,
        &AgentConfig {
            enable_prog_thread: true,
            enable_listen_thread: false,
            ..Default::default()
        },
    )
}

/// [`create_ucx_agent`] with another agent configuration (e.g. no progress
/// thread: [`super::host_agent::create_polled_agent`]).
pub fn create_ucx_agent_with(name: &str, cfg: &AgentConfig) -> Result<UcxAgent> {
    let rt = runtime::load()?;
    let agent = Agent::new_configured(name, cfg).with_context(|| {
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
    let start = Instant::now();
    while !agent.check_remote_metadata(remote, None) {
        if start.elapsed() > timeout {
            bail!(
                "metadata of agent '{remote}' was not usable after {timeout:?}: the peer's metadata did not load (different NIXL versions?)"
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}
