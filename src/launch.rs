//! Running roles as child processes of one parent: the one way every
//! program here starts its peers (`simple_write --mode pair`, the host-API
//! examples, `put_and_signal`, `ep --ranks N`), so that a failure of one
//! never becomes a hang of another.

use std::ffi::OsString;
use std::process::{Child, Command, ExitCode};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use crate::cli::{EXIT_MISMATCH, EXIT_USAGE};

/// How long the surviving roles may keep running after one failed, to
/// report their side, before they are killed.
pub const GRACE: Duration = Duration::from_secs(3);

/// One role to start: this executable again, with `args` and extra `env`.
#[derive(Clone, Debug)]
pub struct RoleSpec {
    /// The role's name, as the program prints it (`initiator`, `rank 3`).
    pub name: String,
    pub args: Vec<OsString>,
    pub env: Vec<(OsString, OsString)>,
}

impl RoleSpec {
    pub fn new<S: Into<OsString>>(name: &str, args: impl IntoIterator<Item = S>) -> Self {
        Self {
            name: name.to_string(),
            args: args.into_iter().map(Into::into).collect(),
            env: Vec::new(),
        }
    }

    /// Adds an environment variable for this role.
    pub fn env(mut self, key: impl Into<OsString>, value: impl Into<OsString>) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }

    /// The command that runs it. Sets `UCX_POSIX_USE_PROC_LINK=n` unless the
    /// environment has it: in containers UCX's shared-memory transport
    /// otherwise opens `/proc/<pid>/fd/N` of the peer and gets "Permission
    /// denied".
    pub fn command(&self) -> Result<Command> {
        let mut cmd = Command::new(std::env::current_exe().context("finding our own executable")?);
        cmd.args(&self.args);
        if std::env::var_os("UCX_POSIX_USE_PROC_LINK").is_none() {
            cmd.env("UCX_POSIX_USE_PROC_LINK", "n");
        }
        cmd.envs(self.env.iter().map(|(k, v)| (k, v)));
        Ok(cmd)
    }
}

/// One role process and how it ended.
#[derive(Debug)]
pub struct RoleExit {
    pub name: String,
    /// Exit status; 137 when killed by a signal (e.g. by us after another
    /// role failed or the deadline passed).
    pub code: i32,
    /// Whether we killed it.
    pub killed: bool,
}

/// Starts every role, then waits for all of them for at most `deadline`
/// ([`supervise`], survivors get [`GRACE`]). If a role cannot be started,
/// the ones already running are killed and the error returned.
pub fn run_roles(roles: Vec<RoleSpec>, deadline: Duration) -> Result<Vec<RoleExit>> {
    run_roles_with(roles, deadline, GRACE)
}

/// [`run_roles`] with the survivors' grace after a failure: long enough for
/// them to notice it and say why (e.g. a GPU wait's `--timeout`).
pub fn run_roles_with(
    roles: Vec<RoleSpec>,
    deadline: Duration,
    grace: Duration,
) -> Result<Vec<RoleExit>> {
    let mut children: Vec<(String, Child)> = Vec::new();
    for role in &roles {
        let spawned = role.command().and_then(|mut c| {
            c.spawn()
                .with_context(|| format!("starting the {} process", role.name))
        });
        match spawned {
            Ok(child) => children.push((role.name.clone(), child)),
            Err(e) => {
                kill_all(children);
                return Err(e);
            }
        }
    }
    Ok(supervise(children, deadline, grace))
}

/// Waits for every child, for at most `deadline` in total. When one exits
/// non-zero, the others get `grace` to report their side, then are
/// killed; at the deadline all remaining are killed.
pub fn supervise(
    children: Vec<(String, Child)>,
    deadline: Duration,
    grace: Duration,
) -> Vec<RoleExit> {
    let start = Instant::now();
    let mut failed_at: Option<Instant> = None;
    let mut slots: Vec<(String, Child, Option<RoleExit>)> =
        children.into_iter().map(|(n, c)| (n, c, None)).collect();
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
        let give_up = start.elapsed() > deadline || failed_at.is_some_and(|t| t.elapsed() > grace);
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

/// Kills and reaps children.
pub fn kill_all(children: Vec<(String, Child)>) {
    for (_, mut c) in children {
        let _ = c.kill();
        let _ = c.wait();
    }
}

/// The parent's exit status: 0 if every role succeeded; else the most
/// specific failure: 2 (a usage error), 3 (wrong data), 130/143 (interrupted),
/// 1 otherwise.
pub fn overall(exits: &[RoleExit]) -> ExitCode {
    if exits.iter().all(|e| e.code == 0) {
        return ExitCode::SUCCESS;
    }
    for want in [EXIT_USAGE, EXIT_MISMATCH, 130, 143] {
        if exits.iter().any(|e| e.code == want) {
            return ExitCode::from(want as u8);
        }
    }
    ExitCode::FAILURE
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

#[cfg(test)]
mod tests {
    use super::*;

    fn exits(codes: &[i32]) -> Vec<RoleExit> {
        codes
            .iter()
            .map(|&code| RoleExit {
                name: "r".into(),
                code,
                killed: false,
            })
            .collect()
    }

    #[test]
    fn exit_status_prefers_the_most_specific_failure() {
        assert_eq!(overall(&exits(&[0, 0])), ExitCode::SUCCESS);
        assert_eq!(overall(&exits(&[1, 3, 1])), ExitCode::from(3));
        assert_eq!(overall(&exits(&[1, 2])), ExitCode::from(2));
        assert_eq!(overall(&exits(&[137, 1])), ExitCode::FAILURE);
    }
}
