//! Running an example's roles as child processes of one parent, so that a
//! failure of either never becomes a hang of the other.

use std::ffi::OsStr;
use std::process::{Child, Command, ExitCode};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use crate::report::EXIT_MISMATCH;

/// How long the surviving role may keep running after the other failed,
/// to report its side, before it is killed.
pub const GRACE: Duration = Duration::from_secs(3);

/// A command that runs this executable again as one role, with `args`.
///
/// Sets `UCX_POSIX_USE_PROC_LINK=n` unless the caller's environment has it:
/// in containers UCX's shared-memory transport otherwise opens
/// `/proc/<pid>/fd/N` of the peer and gets "Permission denied".
pub fn role_command<I, S>(args: I) -> Result<Command>
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let mut cmd = Command::new(std::env::current_exe().context("finding our own executable")?);
    cmd.args(args);
    if std::env::var_os("UCX_POSIX_USE_PROC_LINK").is_none() {
        cmd.env("UCX_POSIX_USE_PROC_LINK", "n");
    }
    Ok(cmd)
}

/// One role process and how it ended.
#[derive(Debug)]
pub struct RoleExit {
    /// The role's name, as the example prints it.
    pub name: String,
    /// Exit status; 137 when killed by a signal (e.g. by us after the
    /// other role failed or the deadline passed).
    pub code: i32,
    /// Whether we killed it.
    pub killed: bool,
}

/// Waits for every child, for at most `deadline` in total. When one exits
/// non-zero, the others get [`GRACE`] to report their side, then are
/// killed; at the deadline all remaining are killed.
pub fn supervise(children: Vec<(&str, Child)>, deadline: Duration) -> Vec<RoleExit> {
    let start = Instant::now();
    let mut failed_at: Option<Instant> = None;
    let mut slots: Vec<(String, Child, Option<RoleExit>)> = children
        .into_iter()
        .map(|(n, c)| (n.to_string(), c, None))
        .collect();
    while slots.iter().any(|s| s.2.is_none()) {
        for (name, child, done) in slots.iter_mut().filter(|s| s.2.is_none()) {
            let code = match child.try_wait() {
                Ok(Some(status)) => status.code().unwrap_or(128 + 9),
                Ok(None) => continue,
                // Cannot happen for a child we spawned; count it as a failure.
                Err(_) => -1,
            };
            if code != 0 && failed_at.is_none() {
                failed_at = Some(Instant::now());
            }
            *done = Some(RoleExit {
                name: name.clone(),
                code,
                killed: false,
            });
        }
        let give_up = start.elapsed() > deadline || failed_at.is_some_and(|t| t.elapsed() > GRACE);
        if give_up {
            for (name, child, done) in slots.iter_mut().filter(|s| s.2.is_none()) {
                let _ = child.kill();
                let _ = child.wait();
                *done = Some(RoleExit {
                    name: name.clone(),
                    code: 128 + 9,
                    killed: true,
                });
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    slots.into_iter().filter_map(|s| s.2).collect()
}

/// Kills and reaps children that were already started when a later step
/// (spawning the next one) failed.
pub fn kill_all(children: Vec<(&str, Child)>) {
    for (_, mut c) in children {
        let _ = c.kill();
        let _ = c.wait();
    }
}

/// The parent's exit status: 0 if every role succeeded, 3 if any reported
/// a data mismatch, 1 otherwise.
pub fn overall(exits: &[RoleExit]) -> ExitCode {
    if exits.iter().all(|e| e.code == 0) {
        ExitCode::SUCCESS
    } else if exits.iter().any(|e| e.code == EXIT_MISMATCH) {
        ExitCode::from(EXIT_MISMATCH as u8)
    } else {
        ExitCode::FAILURE
    }
}

/// `"Target: 0, Initiator: 137 (killed)"`, for the parent's summary line.
pub fn summary(exits: &[RoleExit]) -> String {
    exits
        .iter()
        .map(|e| {
            let mut name = e.name.clone();
            if let Some(first) = name.get_mut(0..1) {
                first.make_ascii_uppercase();
            }
            format!(
                "{name}: {}{}",
                e.code,
                if e.killed { " (killed)" } else { "" }
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}
