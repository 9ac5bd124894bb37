//! Running roles as child processes of one parent: the one way every
//! program here starts its peers (`simple_write --mode pair`, the host-API
//! examples, `put_and_signal`, `ep --ranks N`), so that a failure of one
//! never becomes a hang of another.
//!
//! The children share the parent's terminal; each writes a line in one
//! write (`say!`, `tracing`, [`crate::eline!`]), so their lines never mix.
//! Ctrl-C reaches the whole process group: the parent then waits for its
//! children to clean up and say so (at most [`GRACE`] each), prints one
//! summary ([`finish`]) and exits 130 (143 for SIGTERM). A child killed by
//! a signal is reported with its name (`134 (killed by SIGABRT)`).

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

    /// This program again, with its own arguments followed by `extra` (the
    /// role's: `--role target`, the port the parent bound): how a parent
    /// re-runs itself for a role. The program's parser must let a later
    /// flag override an earlier one (clap's `args_override_self`).
    pub fn again(name: &str, extra: &[&str]) -> Self {
        let ours = std::env::args_os().skip(1);
        Self::new(name, ours.chain(extra.iter().map(OsString::from)))
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
    /// Exit status; `128 + signal` when a signal ended it (137: SIGKILL,
    /// e.g. ours after another role failed or the deadline passed).
    pub code: i32,
    /// The signal that ended it, if one did.
    pub signal: Option<i32>,
    /// Whether we killed it.
    pub killed: bool,
    /// Whether the signal that ended it was planned (`ep --plan`'s `-r`):
    /// not a failure.
    pub planned: bool,
    /// Whether it died (a signal nobody planned) and the others went on
    /// without it (`ep`'s elastic runs): not a failure either.
    pub survived: bool,
}

impl RoleExit {
    /// Role `name`, exited 0 (the fields to fill in from there).
    pub fn named(name: &str) -> Self {
        Self {
            name: name.to_string(),
            code: 0,
            signal: None,
            killed: false,
            planned: false,
            survived: false,
        }
    }

    /// How `status` ended role `name` (not planned, not killed by us).
    pub fn of(name: &str, status: std::process::ExitStatus) -> Self {
        use std::os::unix::process::ExitStatusExt as _;
        let signal = status.signal();
        Self {
            code: status.code().unwrap_or(128 + signal.unwrap_or(0)),
            signal,
            ..Self::named(name)
        }
    }

    /// Whether it counts as a failure (a non-zero exit that was neither
    /// planned nor survived).
    pub fn failed(&self) -> bool {
        self.code != 0 && !self.planned && !self.survived
    }
}

/// `SIGABRT` for 6: the usual name of a signal number (Linux numbering).
pub fn signal_name(sig: i32) -> String {
    let name = match sig {
        1 => "SIGHUP",
        2 => "SIGINT",
        3 => "SIGQUIT",
        4 => "SIGILL",
        5 => "SIGTRAP",
        6 => "SIGABRT",
        7 => "SIGBUS",
        8 => "SIGFPE",
        9 => "SIGKILL",
        10 => "SIGUSR1",
        11 => "SIGSEGV",
        12 => "SIGUSR2",
        13 => "SIGPIPE",
        14 => "SIGALRM",
        15 => "SIGTERM",
        18 => "SIGCONT",
        19 => "SIGSTOP",
        _ => return format!("signal {sig}"),
    };
    name.to_string()
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
    // From here Ctrl-C (which the terminal sends the children too) only
    // sets a flag: the children clean up, and we wait for them to.
    crate::interrupt::install().context("routing Ctrl-C and SIGTERM")?;
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
/// non-zero, or this process is interrupted (Ctrl-C, SIGTERM: passed on
/// to the children that have not had it), the others get `grace` to
/// report their side, then are killed; at the deadline all remaining are
/// killed.
pub fn supervise(
    children: Vec<(String, Child)>,
    deadline: Duration,
    grace: Duration,
) -> Vec<RoleExit> {
    let start = Instant::now();
    let mut failed_at: Option<Instant> = None;
    let mut interrupted = false;
    let mut slots: Vec<(String, Child, Option<RoleExit>)> =
        children.into_iter().map(|(n, c)| (n, c, None)).collect();
    while slots.iter().any(|s| s.2.is_none()) {
        for (name, child, done) in slots.iter_mut().filter(|s| s.2.is_none()) {
            let exit = match child.try_wait() {
                Ok(Some(status)) => RoleExit::of(name, status),
                Ok(None) => continue,
                // Cannot happen for a child we spawned; count it as a failure.
                Err(_) => RoleExit {
                    code: -1,
                    ..RoleExit::named(name)
                },
            };
            if exit.code != 0 && failed_at.is_none() {
                failed_at = Some(Instant::now());
            }
            *done = Some(exit);
        }
        if let Some(sig) = crate::interrupt::received().filter(|_| !interrupted) {
            interrupted = true;
            failed_at.get_or_insert_with(Instant::now);
            for (_, child, _) in slots.iter().filter(|s| s.2.is_none()) {
                forward(child, sig.0);
            }
        }
        // After a failure, the ones left that are stopped have nothing to say.
        let only_stopped = failed_at.is_some()
            && (slots.iter().filter(|s| s.2.is_none())).all(|s| is_stopped(s.1.id()));
        let give_up = start.elapsed() > deadline
            || failed_at.is_some_and(|t| t.elapsed() > grace)
            || only_stopped;
        if give_up {
            for (name, child, done) in slots.iter_mut().filter(|s| s.2.is_none()) {
                let _ = child.kill();
                let _ = child.wait();
                *done = Some(RoleExit {
                    code: 128 + 9,
                    signal: Some(9),
                    killed: true,
                    ..RoleExit::named(name)
                });
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    slots.into_iter().filter_map(|s| s.2).collect()
}

/// Whether process `pid` is stopped (SIGSTOP, a debugger: state `T` or `t`
/// in `/proc/<pid>/stat`): it cannot report anything, so waiting out a
/// grace period for it only delays the exit.
pub fn is_stopped(pid: u32) -> bool {
    state(pid).is_some_and(|s| s == "T" || s == "t")
}

/// Whether process `pid` is stopped by a signal (SIGSTOP, SIGTSTP: state
/// `T`), not merely halted by a tracer (`t`: strace or a debugger stepping
/// through it, which goes on by itself).
pub fn is_frozen(pid: u32) -> bool {
    state(pid).is_some_and(|s| s == "T")
}

/// How process `pid` is dying, from one read of `/proc/<pid>/stat`:
/// `stopped` when frozen ([`is_frozen`]); the signal's name while a signal
/// tears it down — a process killed with a GPU context can take tens of ms
/// (its device memory unmapped) before it can be reaped, and a survivor
/// waiting on it should not; `None` while it runs (or once it is gone).
pub fn dying(pid: u32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    if rest.split_whitespace().next() == Some("T") {
        return Some("stopped".into());
    }
    signal_of_exit(&stat).map(signal_name)
}

/// The signal tearing down the process of one `/proc/<pid>/stat` line:
/// the flag `PF_EXITING` with an exit code that names a signal (a plain
/// `exit(1)` names none).
fn signal_of_exit(stat: &str) -> Option<i32> {
    const PF_EXITING: u64 = 0x4;
    // Fields after the command name (in parentheses, which may hold
    // anything): state (3), ..., flags (9), ..., exit_code (52); proc(5).
    let (_, rest) = stat.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let flags: u64 = fields.get(6)?.parse().ok()?;
    let code: i32 = fields.get(49)?.parse().ok()?;
    (flags & PF_EXITING != 0 && code & 0x7f != 0).then_some(code & 0x7f)
}

/// Process `pid`'s state letter in `/proc/<pid>/stat`.
fn state(pid: u32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The state follows the command name, which is in parentheses and may
    // itself hold spaces or parentheses.
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().next().map(str::to_string)
}

/// Passes SIGTERM on to `child` (a `kill` or a job runner sends it to the
/// parent alone). SIGINT is not passed on: it comes from the terminal,
/// which sends it to the whole process group, and a child that gets it
/// twice exits at once, without its cleanup.
pub fn forward(child: &Child, sig: i32) {
    if sig == libc::SIGTERM {
        // SAFETY: a plain syscall on a child we spawned and have not reaped.
        unsafe { libc::kill(child.id() as libc::pid_t, sig) };
    }
}

/// Kills and reaps children.
pub fn kill_all(children: Vec<(String, Child)>) {
    for (_, mut c) in children {
        let _ = c.kill();
        let _ = c.wait();
    }
}

/// The parent's exit status: 0 if every role succeeded; else the most
/// specific failure: 130/143 (this process was interrupted), 2 (a usage
/// error), 3 (wrong data), 130/143 (a role was), 1 otherwise.
pub fn overall(exits: &[RoleExit]) -> ExitCode {
    if let Some(sig) = crate::interrupt::received() {
        return ExitCode::from(sig.exit_code() as u8);
    }
    if !exits.iter().any(RoleExit::failed) {
        return ExitCode::SUCCESS;
    }
    for want in [EXIT_USAGE, EXIT_MISMATCH, 130, 143] {
        if exits.iter().any(|e| e.failed() && e.code == want) {
            return ExitCode::from(want as u8);
        }
    }
    ExitCode::FAILURE
}

/// `"Target: 0, Initiator: 134 (killed by SIGABRT)"`, for the parent's
/// summary line.
pub fn summary(exits: &[RoleExit]) -> String {
    exits
        .iter()
        .map(|e| {
            let mut name = e.name.clone();
            if let Some(first) = name.get_mut(0..1) {
                first.make_ascii_uppercase();
            }
            let how = match (e.signal, e.killed, e.planned) {
                (Some(sig), _, true) => format!(" (killed as planned: {})", signal_name(sig)),
                (Some(sig), ..) if e.survived => {
                    format!(" (died: {}; the others went on)", signal_name(sig))
                }
                (Some(sig), true, _) => format!(" (stopped by us: {})", signal_name(sig)),
                (Some(sig), false, _) => format!(" (killed by {})", signal_name(sig)),
                (None, ..) => String::new(),
            };
            format!("{name}: {}{how}", e.code)
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The parent's last word: its exit status ([`overall`]) and, unless
/// every role succeeded, one line on stderr naming the processes that did
/// not (`[main] error: 1 of 2 processes failed: Target: 3`), or, when
/// this process was interrupted, how each ended.
pub fn finish(tag: &str, exits: &[RoleExit]) -> ExitCode {
    let code = overall(exits);
    if let Some(sig) = crate::interrupt::received() {
        crate::eline!("[{tag}] {sig}; the processes ended: {}", summary(exits));
    } else if code != ExitCode::SUCCESS {
        let failed: Vec<RoleExit> = exits
            .iter()
            .filter(|e| e.failed())
            .map(|e| RoleExit {
                name: e.name.clone(),
                ..*e
            })
            .collect();
        crate::eline!(
            "[{tag}] error: {} of {} processes failed: {}",
            failed.len(),
            exits.len(),
            summary(&failed)
        );
    }
    code
}

#[cfg(test)]
mod tests {

    /// A line of `/proc/<pid>/stat` with `flags` and `exit_code`.
    fn stat(flags: u64, code: i32) -> String {
        let mut f = vec!["0".to_string(); 50];
        f[0] = "R".into();
        f[6] = flags.to_string();
        f[49] = code.to_string();
        format!("42 (ep (rank) 1) {}", f.join(" "))
    }

    #[test]
    fn a_process_torn_down_by_a_signal_is_told_from_one_that_exits() {
        assert_eq!(signal_of_exit(&stat(0x4 | 0x40, 9)), Some(9));
        assert_eq!(signal_of_exit(&stat(0x4, 0x80 | 11)), Some(11));
        assert_eq!(signal_of_exit(&stat(0x4, 1 << 8)), None, "exit(1)");
        assert_eq!(signal_of_exit(&stat(0x40, 0)), None, "running");
        assert_eq!(signal_of_exit("garbage"), None);
    }

    use super::*;

    fn exits(codes: &[i32]) -> Vec<RoleExit> {
        codes
            .iter()
            .map(|&code| RoleExit {
                code,
                ..RoleExit::named("r")
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

    #[test]
    fn a_signal_death_is_named() {
        let run = |sh: &str| {
            let status = Command::new("sh").args(["-c", sh]).status().unwrap();
            RoleExit::of("target", status)
        };
        let abort = run("kill -ABRT $$");
        assert_eq!((abort.code, abort.signal), (134, Some(6)));
        assert_eq!(summary(&[abort]), "Target: 134 (killed by SIGABRT)");
        let done = run("exit 3");
        assert_eq!((done.code, done.signal), (3, None));
        assert_eq!(summary(&[done]), "Target: 3");
        assert_eq!(signal_name(64), "signal 64");
    }

    #[test]
    fn a_stopped_child_is_seen_as_stopped() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id();
        assert!(!is_stopped(pid));
        // SAFETY: a plain syscall on a child we spawned and have not reaped.
        unsafe { libc::kill(pid as libc::pid_t, libc::SIGSTOP) };
        // The state changes once the kernel has delivered the signal.
        let mut seen = false;
        for _ in 0..500 {
            if is_stopped(pid) {
                seen = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = child.kill();
        let _ = child.wait();
        assert!(seen, "a SIGSTOPped child never showed state T");
        assert!(!is_stopped(u32::MAX));
    }
}
