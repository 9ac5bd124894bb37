//! Every program behaves the same way at its edges: one `--timeout` and
//! one byte-size parser, one launcher (whole lines, Ctrl-C waits for the
//! children, one summary), one exit status per kind of failure. Runs on a
//! machine without a GPU.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use common::{both, example, stderr};

/// The programs with a `--timeout`, as (name, command).
fn programs() -> Vec<(&'static str, Command)> {
    let mut v: Vec<(&'static str, Command)> = vec![
        (
            "simple_write",
            Command::new(env!("CARGO_BIN_EXE_simple_write")),
        ),
        ("ep", ep()),
        ("collectives", collectives()),
    ];
    for name in [
        "two_proc",
        "notifications",
        "send_recv",
        "send_recv_bench",
        "put_and_signal",
        "single_process",
    ] {
        v.push((name, Command::new(example(name))));
    }
    v
}

fn ep() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ep"));
    // The test's own environment must not make the launcher a rank.
    for v in [
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "MASTER_ADDR",
        "MASTER_PORT",
    ] {
        c.env_remove(v);
    }
    c
}

fn collectives() -> Command {
    rank_free(Command::new(env!("CARGO_BIN_EXE_collectives")))
}

fn pipeline() -> Command {
    rank_free(Command::new(env!("CARGO_BIN_EXE_pipeline")))
}

/// `c` without the variables that would make the launcher a rank.
fn rank_free(mut c: Command) -> Command {
    for v in [
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "MASTER_ADDR",
        "MASTER_PORT",
    ] {
        c.env_remove(v);
    }
    c
}

fn output(mut c: Command, args: &[&str]) -> Output {
    c.args(args).output().expect("running the program")
}

#[test]
fn every_timeout_has_one_range_and_one_message() {
    for (name, c) in programs() {
        for bad in ["0", "-1", "86401"] {
            let o = output(c_clone(&c), &[&format!("--timeout={bad}")]);
            assert_eq!(
                o.status.code(),
                Some(2),
                "{name} --timeout {bad}: {}",
                both(&o)
            );
            assert!(
                stderr(&o).contains("a timeout must be more than 0 and at most 86400 seconds"),
                "{name} --timeout {bad}: {}",
                both(&o)
            );
        }
        let o = output(c_clone(&c), &["--timeout", "soon"]);
        assert_eq!(o.status.code(), Some(2), "{name}: {}", both(&o));
        assert!(
            stderr(&o).contains("'soon' is not a number of seconds"),
            "{name}: {}",
            both(&o)
        );
    }
}

/// Every `--path` parses into the one `gpu::path::Path`; a program that
/// lacks the path asked for exits 2 naming it and what the program offers,
/// before any network or GPU work.
#[test]
fn a_path_a_program_lacks_is_refused_by_name() {
    let lacking = [
        ("ep", ep()),
        ("collectives", collectives()),
        ("put_and_signal", Command::new(example("put_and_signal"))),
    ];
    for (name, c) in lacking {
        for path in ["ll", "ll128"] {
            let o = output(c_clone(&c), &["--path", path]);
            assert_eq!(o.status.code(), Some(2), "{name}: {}", both(&o));
            let want = format!("--path {path}: {name} has no {path} path (it offers put, store)");
            assert!(stderr(&o).contains(&want), "{name}: {}", both(&o));
        }
    }
    // The pipeline has every path, but LL128 only at warp and block level.
    let o = output(pipeline(), &["--path", "ll128", "--level", "thread"]);
    assert_eq!(o.status.code(), Some(2), "pipeline: {}", both(&o));
    let want = "--path ll128 --level thread: eight lanes of a warp write an LL128 line at once";
    assert!(stderr(&o).contains(want), "pipeline: {}", both(&o));
}

/// A fresh `Command` with the same program (Command is not Clone).
fn c_clone(c: &Command) -> Command {
    let mut n = Command::new(c.get_program());
    for (k, v) in c.get_envs() {
        match v {
            Some(v) => n.env(k, v),
            None => n.env_remove(k),
        };
    }
    n
}

#[test]
fn every_byte_size_has_one_parser() {
    let sized: Vec<(Command, &str)> = vec![
        (Command::new(env!("CARGO_BIN_EXE_simple_write")), "--size"),
        (Command::new(example("two_proc")), "--buf-size"),
        (Command::new(example("notifications")), "--buf-size"),
        (Command::new(example("send_recv")), "--buffer-size"),
        (Command::new(example("send_recv_bench")), "--buffer-size"),
        (Command::new(example("put_and_signal")), "--size"),
        (collectives(), "-e"),
    ];
    for (c, flag) in &sized {
        for (bad, says) in [
            ("99999999999999999999", "more bytes than 64 bits can count"),
            ("1.5", "not a whole number of bytes"),
            ("5X", "unknown size suffix 'x'"),
            ("0", "at least 1 byte"),
        ] {
            let o = output(c_clone(c), &[flag, bad]);
            assert_eq!(o.status.code(), Some(2), "{flag} {bad}: {}", both(&o));
            assert!(stderr(&o).contains(says), "{flag} {bad}: {}", both(&o));
        }
    }
    // Suffixes and fractions work where the issue found them refused.
    let o = output(
        Command::new(example("two_proc")),
        &["--port", "0", "--buf-size", "1.5K", "--timeout", "20"],
    );
    assert!(o.status.success(), "{}", both(&o));
}

#[test]
fn rings_that_do_not_fit_in_memory_are_refused_with_both_numbers() {
    // 2 rings of 1000 GiB: more than any machine this runs on.
    let o = output(
        Command::new(example("send_recv")),
        &["--num-buffers", "4000", "--buffer-size", "256M"],
    );
    assert_eq!(o.status.code(), Some(2), "{}", both(&o));
    let err = stderr(&o);
    assert!(err.contains("2 ring(s) of 4000 × 256 MiB"), "{err}");
    assert!(
        err.contains("of host memory, but this machine has"),
        "{err}"
    );
    assert!(
        err.contains("available: use fewer or smaller slots"),
        "{err}"
    );
    let o = output(
        Command::new(example("send_recv")),
        &["--buffer-size", "64G"],
    );
    assert_eq!(o.status.code(), Some(2), "{}", both(&o));
    assert!(
        stderr(&o).contains("is 4398046511616 bytes, more than 1 TiB"),
        "{}",
        both(&o)
    );
}

#[test]
fn a_busy_port_is_a_usage_error_named_once_everywhere() {
    let busy = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
    let port = busy.local_addr().unwrap().port().to_string();
    let cases: Vec<(Command, Vec<&str>)> = vec![
        (Command::new(example("two_proc")), vec!["--port", &port]),
        (Command::new(example("send_recv")), vec!["--port", &port]),
        (
            Command::new(example("notifications")),
            vec!["--port", &port],
        ),
        (ep(), vec!["--port", &port, "--check-connection"]),
        (
            Command::new(env!("CARGO_BIN_EXE_simple_write")),
            vec!["--mode", "pair", "--check-connection", "--port", &port],
        ),
    ];
    for (c, args) in cases {
        let name = c.get_program().to_string_lossy().into_owned();
        let o = output(c, &args);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{name}: {}", both(&o));
        assert!(err.contains("pick another with --port"), "{name}: {err}");
        assert!(
            err.matches("Address already in use").count() <= 1,
            "{name} repeats the OS error: {err}"
        );
        assert!(!err.contains("simple_write initiator"), "{name}: {err}");
    }
}

#[test]
fn a_host_that_does_not_resolve_fails_at_the_lookup() {
    // A --timeout far beyond the test's patience: the lookup must end it.
    for (c, args) in [
        (
            Command::new(example("two_proc")),
            vec!["--role", "target", "--host", "nonexistent.invalid"],
        ),
        (
            Command::new(env!("CARGO_BIN_EXE_simple_write")),
            vec![
                "--mode",
                "target",
                "--check-connection",
                "--host",
                "nonexistent.invalid",
            ],
        ),
    ] {
        let child = common::Reaped::new(
            c_clone(&c)
                .args(&args)
                .args(["--timeout", "3600"])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap(),
        );
        let o = child.wait_output(Duration::from_secs(600));
        assert_eq!(o.status.code(), Some(1), "{}", both(&o));
        assert!(
            stderr(&o)
                .contains("cannot resolve the store's host 'nonexistent.invalid' (check --host)"),
            "{}",
            both(&o)
        );
    }
}

#[test]
fn store_messages_name_the_process_that_hosts_it() {
    let closed = common::ClosedPort::new();
    let port = closed.port.to_string();
    // In --role mode neither role hosts the store: the parent does.
    let o = output(
        Command::new(example("two_proc")),
        &["--role", "initiator", "--port", &port, "--timeout", "0.5"],
    );
    assert_eq!(o.status.code(), Some(1), "{}", both(&o));
    assert!(
        stderr(&o).contains("start the process that hosts the store first"),
        "{}",
        both(&o)
    );
    assert!(!stderr(&o).contains("(the initiator)"), "{}", both(&o));
}

#[test]
fn ep_checks_the_machine_once_in_the_launcher() {
    if nixl_examples::gpu::context::driver_present()
        && nixl_examples::ep::kernels::availability().is_ok()
    {
        eprintln!("SKIP ep launcher check: this machine can run ep");
        return;
    }
    let o = output(ep(), &["--ranks", "8", "--no-baseline"]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{}", both(&o));
    assert_eq!(err.matches("cannot run ep").count(), 1, "{err}");
    assert!(
        err.starts_with("[ep] error: this machine cannot run ep:"),
        "{err}"
    );
    assert!(!err.contains("for the baseline"), "{err}");
    assert!(!err.contains("warning"), "{err}");
    assert!(!err.contains("rank"), "no rank should have started: {err}");
}

/// Every write a program (and its children) makes to stdout or stderr
/// ends a line: lines of processes sharing a terminal never mix.
#[test]
fn every_line_reaches_the_terminal_in_one_write() {
    let strace = Command::new("strace").arg("-V").output();
    if !strace.is_ok_and(|o| o.status.success()) {
        eprintln!(
            "SKIP one-write-per-line check: strace is not installed (apt-get install strace)"
        );
        return;
    }
    let log = std::env::temp_dir().join(format!("cli-consistency-{}.strace", std::process::id()));
    // Rank 1 hangs after connecting: ranks 0 and 2 time out and say so,
    // the launcher stops rank 1 and prints its summary.
    let o = Command::new("strace")
        .args(["-f", "-qq", "-e", "trace=write", "-s", "100000", "-o"])
        .arg(&log)
        .arg(env!("CARGO_BIN_EXE_ep"))
        .args(["--ranks", "3", "--check-connection", "--timeout", "2"])
        .args(["--inject", "hang-after-connect=1"])
        .env_remove("RANK")
        .output()
        .unwrap();
    let trace = std::fs::read_to_string(&log).unwrap();
    let _ = std::fs::remove_file(&log);
    if trace.contains("PTRACE_TRACEME") || trace.is_empty() {
        eprintln!("SKIP one-write-per-line check: ptrace is not permitted here");
        return;
    }
    assert_ne!(o.status.code(), Some(0), "{}", both(&o));
    let mut writes = 0;
    for line in trace.lines() {
        let Some(at) = line.find("write(") else {
            continue;
        };
        let call = &line[at + "write(".len()..];
        if !(call.starts_with("1, \"") || call.starts_with("2, \"")) {
            continue;
        }
        writes += 1;
        let text = &call[4..call.rfind("\", ").expect("a complete write")];
        assert!(
            text.ends_with("\\n"),
            "a write that does not end a line: {line}"
        );
    }
    assert!(writes > 5, "too few writes seen:\n{trace}");
    assert!(stderr(&o).contains("[ep] error: "), "{}", both(&o));
    assert!(
        stderr(&o).contains("processes failed: Rank "),
        "{}",
        both(&o)
    );
}

/// Starts `c` in its own process group (as a terminal's job), waits for
/// `ready` on its stderr or stdout, then sends SIGINT to the whole group,
/// as Ctrl-C does; returns its output.
fn ctrl_c_after(mut c: Command, ready: &str) -> Output {
    use std::os::unix::process::CommandExt;
    let mut child = c
        .process_group(0)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id() as i32;
    let (tx, rx) = mpsc::channel::<String>();
    let pump = |r: Box<dyn std::io::Read + Send>, tx: mpsc::Sender<String>| {
        std::thread::spawn(move || {
            let mut all = String::new();
            for line in BufReader::new(r).lines().map_while(Result::ok) {
                let _ = tx.send(line.clone());
                all.push_str(&line);
                all.push('\n');
            }
            all
        })
    };
    let out = pump(Box::new(child.stdout.take().unwrap()), tx.clone());
    let err = pump(Box::new(child.stderr.take().unwrap()), tx);
    let mut seen = false;
    while let Ok(line) = rx.recv_timeout(Duration::from_secs(120)) {
        if line.contains(ready) {
            seen = true;
            break;
        }
    }
    // SAFETY: kill(2) on the process group of a child we started.
    unsafe { kill(-pid, 2) };
    drop(rx);
    // Every wait in the programs is bounded; so is the launcher's.
    let status = child.wait().unwrap();
    let stdout = out.join().unwrap().into_bytes();
    let stderr = err.join().unwrap().into_bytes();
    assert!(
        seen,
        "never saw {ready:?}:\n{}",
        String::from_utf8_lossy(&stderr)
    );
    Output {
        status,
        stdout,
        stderr,
    }
}

unsafe extern "C" {
    fn kill(pid: i32, sig: i32) -> i32;
}

fn assert_interrupted(o: &Output, roles: &[&str]) {
    let err = stderr(o);
    assert_eq!(o.status.code(), Some(130), "{}", both(o));
    let summaries: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("interrupted by SIGINT (Ctrl-C); the processes ended: "))
        .collect();
    assert_eq!(summaries.len(), 1, "one summary expected: {}", both(o));
    for role in roles {
        // The parent saw each child end (it did not stop them itself).
        assert!(
            summaries[0].contains(&format!("{role}: 130")),
            "{role} missing from {:?}",
            summaries[0]
        );
    }
    assert!(!summaries[0].contains("stopped by us"), "{}", both(o));
    // Its summary is the last thing anyone printed: the children were done.
    assert!(err.trim_end().ends_with(summaries[0]), "{}", both(o));
}

#[test]
fn ctrl_c_waits_for_the_ranks_then_one_summary_and_130() {
    let mut c = ep();
    c.args(["--ranks", "3", "--check-connection", "--timeout", "600"])
        .args(["--inject", "hang-after-connect=1"]);
    let o = ctrl_c_after(c, "hanging (injected fault)");
    assert_interrupted(&o, &["Rank 0", "Rank 1", "Rank 2"]);
}

#[test]
fn ctrl_c_waits_for_send_recv_roles_then_one_summary_and_130() {
    let mut c = Command::new(example("send_recv"));
    c.args(["--port", "0", "--num-buffers", "8", "--buffer-size", "64K"])
        .args(["--num-transfers", "1000000", "--consume-us", "1000"]);
    let o = ctrl_c_after(c, "[receiver] Processed 100/");
    assert_interrupted(&o, &["Receiver", "Sender"]);
}
