//! `ep --ranks N`: starts the N rank processes on this machine, with the
//! environment torchrun would give them, and waits for all.
//!
//! The children run this same executable with the same arguments; `RANK`
//! being set is what makes them ranks. Rank 0 hosts the store on
//! `MASTER_PORT` (a free port unless `--port` says otherwise).

use std::process::{Child, ExitCode};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use crate::cli::EXIT_USAGE;
use crate::report::EXIT_MISMATCH;
use crate::supervise::role_command;

/// A TCP port free on all interfaces right now (rank 0 binds it a moment
/// later; another process could take it in between, and rank 0 would then
/// say the port is in use).
pub fn free_port() -> Result<u16> {
    let l =
        std::net::TcpListener::bind(("0.0.0.0", 0)).context("finding a free port for the store")?;
    Ok(l.local_addr()?.port())
}

/// Starts `ranks` copies of this executable with this process's arguments
/// and torchrun's variables, rank `r` as `RANK=r`, `LOCAL_RANK=r`.
pub fn spawn_ranks(ranks: u32, port: u16) -> Result<Vec<Child>> {
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    let mut children = Vec::new();
    for r in 0..ranks {
        let mut cmd = role_command(&args)?;
        cmd.env("RANK", r.to_string())
            .env("WORLD_SIZE", ranks.to_string())
            .env("LOCAL_RANK", r.to_string())
            .env("LOCAL_WORLD_SIZE", ranks.to_string())
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", port.to_string())
            .env_remove("TORCHELASTIC_USE_AGENT_STORE");
        if std::env::var_os("NCCL_NVLS_ENABLE").is_none() {
            // NVLink SHARP (multicast) stays off on these machines.
            cmd.env("NCCL_NVLS_ENABLE", "0");
        }
        match cmd.spawn() {
            Ok(c) => children.push(c),
            Err(e) => {
                for mut c in children {
                    let _ = c.kill();
                    let _ = c.wait();
                }
                return Err(e).context(format!("starting rank {r}"));
            }
        }
    }
    Ok(children)
}

/// Waits for every rank. Once one fails, the others get `grace` to notice
/// and say why (their waits end within `--timeout`), then are killed.
/// Returns each rank's exit status (137 when killed here).
pub fn supervise(mut children: Vec<Child>, grace: Duration) -> Vec<i32> {
    let mut codes: Vec<Option<i32>> = vec![None; children.len()];
    let mut failed_at: Option<Instant> = None;
    while codes.iter().any(Option::is_none) {
        for (i, c) in children.iter_mut().enumerate() {
            if codes[i].is_some() {
                continue;
            }
            if let Ok(Some(status)) = c.try_wait() {
                let code = status.code().unwrap_or(128 + 9);
                if code != 0 && failed_at.is_none() {
                    failed_at = Some(Instant::now());
                }
                codes[i] = Some(code);
            }
        }
        if failed_at.is_some_and(|t| t.elapsed() > grace) {
            for (i, c) in children.iter_mut().enumerate() {
                if codes[i].is_none() {
                    let _ = c.kill();
                    let _ = c.wait();
                    eprintln!("[ep] rank {i} still running {grace:?} after another failed: killed");
                    codes[i] = Some(128 + 9);
                }
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    codes.into_iter().map(|c| c.unwrap_or(1)).collect()
}

/// The launcher's exit status: 0 when every rank succeeded; else 2 if a
/// rank found a usage error, 3 if one found wrong data, the interrupt
/// status if interrupted, 1 otherwise.
pub fn overall(codes: &[i32]) -> ExitCode {
    if codes.iter().all(|&c| c == 0) {
        return ExitCode::SUCCESS;
    }
    for want in [EXIT_USAGE, EXIT_MISMATCH, 130, 143] {
        if codes.contains(&want) {
            return ExitCode::from(want as u8);
        }
    }
    ExitCode::FAILURE
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_status_prefers_the_most_specific_failure() {
        assert_eq!(overall(&[0, 0]), ExitCode::SUCCESS);
        assert_eq!(overall(&[1, 3, 1]), ExitCode::from(3));
        assert_eq!(overall(&[1, 2]), ExitCode::from(2));
        assert_eq!(overall(&[137, 1]), ExitCode::FAILURE);
    }
}
