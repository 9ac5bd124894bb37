//! `ep --ranks N`: starts the N rank processes on this machine, with the
//! environment torchrun would give them, and waits for all.
//!
//! The children run this same executable with the same arguments; `RANK`
//! being set is what makes them ranks. Rank 0 hosts the store on
//! `MASTER_PORT` (a free port unless `--port` says otherwise).

use std::time::Duration;

use anyhow::{Context, Result};

use crate::launch::{RoleExit, RoleSpec, run_roles_with};

/// A TCP port free on all interfaces right now (rank 0 binds it a moment
/// later; another process could take it in between, and rank 0 would then
/// say the port is in use).
pub fn free_port() -> Result<u16> {
    let l =
        std::net::TcpListener::bind(("0.0.0.0", 0)).context("finding a free port for the store")?;
    Ok(l.local_addr()?.port())
}

/// Runs `ranks` copies of this executable with this process's arguments
/// and torchrun's variables (rank `r` as `RANK=r`, `LOCAL_RANK=r`), and
/// waits for all ([`crate::launch`]). Once one fails, the others get
/// `grace` to notice and say why, then are killed.
pub fn run_ranks(ranks: u32, port: u16, grace: Duration) -> Result<Vec<RoleExit>> {
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    let specs = (0..ranks)
        .map(|r| {
            let mut spec = RoleSpec::new(&format!("rank {r}"), args.clone())
                .env("RANK", r.to_string())
                .env("WORLD_SIZE", ranks.to_string())
                .env("LOCAL_RANK", r.to_string())
                .env("LOCAL_WORLD_SIZE", ranks.to_string())
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", port.to_string())
                // Ours, not torchrun's agent: rank 0 hosts the store.
                .env("TORCHELASTIC_USE_AGENT_STORE", "False");
            if std::env::var_os("NCCL_NVLS_ENABLE").is_none() {
                // NVLink SHARP (multicast) stays off on these machines.
                spec = spec.env("NCCL_NVLS_ENABLE", "0");
            }
            spec
        })
        .collect();
    // A backstop only: every wait inside the ranks has its own deadline.
    run_roles_with(specs, Duration::from_secs(24 * 3600), grace)
}
