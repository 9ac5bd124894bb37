//! A frozen peer must not freeze its partner. A process stopped with
//! SIGSTOP (a debugger, a paused container, a stuck driver call) keeps its
//! sockets open, so nothing ever fails by itself: the survivor has to
//! notice the silence. Each test freezes one side of a real pair at a point
//! it knows the peer reached (a line the peer printed, a port that
//! listens), and asserts that the other exits 1 naming the silent peer and
//! the cause, and that no process is left behind (the frozen one is killed
//! by `Reaped`'s drop). `ep`'s frozen ranks are in `ep_cli.rs`.

mod common;

use std::io::BufRead;
use std::time::{Duration, Instant};

use common::*;

const TIMEOUT_S: u64 = 3;
/// How long past --timeout a survivor may run before the test calls it hung.
const HANG_GUARD: Duration = Duration::from_secs(60);

/// Freezes `p` and returns once the kernel shows it stopped (state `T`),
/// so that nothing it does can race what the test starts next.
fn stop(p: &mut Reaped) {
    let pid = p.child().id();
    // SAFETY: signalling a child we spawned and still own.
    unsafe { libc::kill(pid as i32, libc::SIGSTOP) };
    let stat = format!("/proc/{pid}/stat");
    let stopped = || {
        let s = std::fs::read_to_string(&stat).unwrap_or_default();
        // The state follows the command name, which is in parentheses.
        s.rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('T'))
    };
    while !stopped() {
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Waits for the survivor; asserts exit 1 and a message that names `peer`
/// and gives one of `causes`, the words of the --timeout waits that can
/// run out where the peer froze. That the wait has a deadline is what the
/// message proves; the limit here only keeps a hung survivor from hanging
/// the suite.
fn assert_notices(survivor: Reaped, peer: &str, causes: &[&str]) {
    let o = survivor.wait_output(Duration::from_secs(TIMEOUT_S) + HANG_GUARD);
    assert_eq!(o.status.code(), Some(1), "{}", both(&o));
    let err = stderr(&o);
    assert!(
        err.contains(peer) && causes.iter().any(|c| err.contains(c)),
        "the message does not name the {peer} with one of {causes:?}:\n{}",
        both(&o)
    );
}

/// Reads `p`'s stdout until a line starts with `prefix`.
fn wait_for_line(p: &mut Reaped, prefix: &str) {
    let out = p.child().stdout.take().unwrap();
    let mut lines = std::io::BufReader::new(out).lines();
    let mut seen = Vec::new();
    while let Some(Ok(line)) = lines.next() {
        if line.starts_with(prefix) {
            // Keep draining in the background so the pipe never fills.
            std::thread::spawn(move || lines.for_each(drop));
            return;
        }
        seen.push(line);
    }
    panic!("never printed {prefix:?}:\n{}", seen.join("\n"));
}

/// The initiator starts first and is frozen once registered, before the
/// target exists: it cannot have fetched the target's metadata, so it can
/// never finish first (frozen after the target started, it can finish both
/// transfers in the moment before the signal lands).
///
/// (The other way round a frozen two_proc target is no obstacle: the
/// initiator's READ and WRITE are one-sided, and its notifications queue in
/// UCX, so the initiator may rightly succeed.)
#[test]
fn two_proc_target_notices_an_initiator_frozen_during_the_exchange() {
    let store = store_server();
    let port = store.port().to_string();
    let t = TIMEOUT_S.to_string();
    let common = ["--port", port.as_str(), "--timeout", t.as_str()];
    let mut initiator = spawn(
        "two_proc",
        &[&["--role", "initiator"][..], &common].concat(),
    );
    wait_for_line(&mut initiator, "[initiator] Memory registered");
    stop(&mut initiator);
    let target = spawn("two_proc", &[&["--role", "target"][..], &common].concat());
    assert_notices(target, "initiator", &["none arrived within 3"]);
}

#[test]
fn send_recv_sender_notices_a_receiver_frozen_mid_stream() {
    let (store, mut receiver, mut sender) = streaming_pair();
    wait_for_line(&mut sender, "[sender] Sent 100/");
    stop(&mut receiver);
    assert_notices(
        sender,
        "receiver",
        &[
            "no progress report from the receiver within 3",
            "did not complete within 3",
        ],
    );
    drop(store);
}

#[test]
fn send_recv_receiver_notices_a_sender_frozen_mid_stream() {
    let (store, receiver, mut sender) = streaming_pair();
    wait_for_line(&mut sender, "[sender] Sent 100/");
    stop(&mut sender);
    assert_notices(receiver, "sender", &["within 3"]);
    drop(store);
}

/// A streaming pair started by hand around our store, long enough to be
/// frozen mid-stream.
fn streaming_pair() -> (nixl_examples::store::native::TcpStore, Reaped, Reaped) {
    let store = store_server();
    let port = store.port().to_string();
    let t = TIMEOUT_S.to_string();
    let common = [
        "--port",
        &port,
        "--timeout",
        &t,
        "--num-buffers",
        "4",
        "--buffer-size",
        "256K",
        "--num-transfers",
        "10000000",
    ];
    let receiver = spawn(
        "send_recv",
        &[&["--role", "receiver"][..], &common].concat(),
    );
    let sender = spawn("send_recv", &[&["--role", "sender"][..], &common].concat());
    (store, receiver, sender)
}

#[test]
fn notifications_initiator_notices_a_target_frozen_during_the_exchange() {
    let store = store_server();
    let port = store.port().to_string();
    let t = TIMEOUT_S.to_string();
    let common = ["--port", port.as_str(), "--timeout", t.as_str()];
    let mut target = spawn(
        "notifications",
        &[&["--role", "target"][..], &common].concat(),
    );
    wait_for_line(&mut target, "[target]");
    stop(&mut target);
    let initiator = spawn(
        "notifications",
        &[&["--role", "initiator"][..], &common].concat(),
    );
    // Frozen before it published its metadata, or after: the initiator
    // then waits for the metadata, or for the target's answer.
    let causes = ["timed out after 3s", "none arrived within 3"];
    assert_notices(initiator, "target", &causes);
}

/// simple_write's arguments for a pair on `port`. The timeout is long on
/// purpose: a frozen peer must be named by the probes, in seconds, not by
/// the timeout.
fn simple_write_args(mode: &'static str, port: &str, extra: &[&'static str]) -> Vec<String> {
    let mut v: Vec<String> = [
        "--mode",
        mode,
        "--check-connection",
        "--port",
        port,
        "--timeout",
    ]
    .map(String::from)
    .to_vec();
    v.push(PROBED_TIMEOUT_S.to_string());
    v.extend(extra.iter().map(|s| s.to_string()));
    v
}

/// --timeout of the simple_write and ep runs below: the survivor must stop
/// long before it (it names the frozen peer within a few seconds).
const PROBED_TIMEOUT_S: u64 = 60;

/// Waits for the survivor of a freeze: exit 1, a message that names
/// `peer` and contains `cause`, and an end well before --timeout (the
/// probes named the peer, not the timeout).
fn assert_named(survivor: Reaped, frozen_at: Instant, peer: &str, cause: &str) {
    let limit = Duration::from_secs(PROBED_TIMEOUT_S);
    let o = survivor.wait_output(limit * 2);
    assert_eq!(o.status.code(), Some(1), "{}", both(&o));
    let err = stderr(&o);
    assert!(
        err.contains(peer) && err.contains(cause),
        "the message does not name {peer:?} with {cause:?}:\n{}",
        both(&o)
    );
    let took = frozen_at.elapsed();
    assert!(
        took < limit / 2,
        "took {took:?} of a {limit:?} timeout: {}",
        both(&o)
    );
}

fn simple_write(args: &[String]) -> Reaped {
    Reaped::new(
        std::process::Command::new(env!("CARGO_BIN_EXE_simple_write"))
            .args(args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("spawning simple_write"),
    )
}

/// The target hangs once connected (`--inject hang-after-connect`), is
/// frozen there, and the initiator names it by its silent heartbeat.
#[test]
fn simple_write_initiator_notices_a_target_frozen_during_the_exchange() {
    let port = free_port().to_string();
    let initiator = simple_write(&simple_write_args("initiator", &port, &[]));
    let mut target = simple_write(&simple_write_args(
        "target",
        &port,
        &["--inject", "hang-after-connect"],
    ));
    wait_for_line(&mut target, "[target] Hanging");
    stop(&mut target);
    let frozen_at = Instant::now();
    assert_named(initiator, frozen_at, "the target", "stopped responding");
}

/// The initiator, which hosts the store, hangs once connected and is
/// frozen there: the store stops answering, and the target says who hosts it.
#[test]
fn simple_write_target_notices_an_initiator_frozen_during_the_exchange() {
    let port = free_port().to_string();
    let mut initiator = simple_write(&simple_write_args(
        "initiator",
        &port,
        &["--inject", "hang-after-connect"],
    ));
    let target = simple_write(&simple_write_args("target", &port, &[]));
    wait_for_line(&mut initiator, "[initiator] Hanging");
    stop(&mut initiator);
    let frozen_at = Instant::now();
    assert_named(target, frozen_at, "which the initiator hosts", "frozen");
}

/// The reproduction: the initiator listens, is frozen, and only
/// then does the target start. The kernel still completes the target's
/// connection, so only the unanswered handshake tells.
#[test]
fn simple_write_target_names_an_initiator_frozen_before_it_joined() {
    let port = free_port();
    let mut initiator = simple_write(&simple_write_args("initiator", &port.to_string(), &[]));
    wait_until_listening(port);
    stop(&mut initiator);
    let frozen_at = Instant::now();
    let target = simple_write(&simple_write_args("target", &port.to_string(), &[]));
    assert_named(
        target,
        frozen_at,
        "the initiator, which hosts the store",
        "frozen",
    );
}

/// Returns once something accepts connections on `port` (the store is bound).
fn wait_until_listening(port: u16) {
    let start = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "nothing listened on {port}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[path = "../crates/tcpstore/tests/silent_server/mod.rs"]
#[allow(dead_code)]
mod silent_server;

/// The reproduction: a store that completes the handshake and then
/// never answers, before the first key and after some replies.
#[test]
fn simple_write_target_gives_up_on_a_store_that_goes_silent() {
    for answered in [0, 3] {
        let store = silent_server::SilentStore::start(answered);
        let port = store.port().to_string();
        let start = Instant::now();
        let target = simple_write(
            &[
                "--mode",
                "target",
                "--check-connection",
                "--port",
                &port,
                "--timeout",
                "5",
            ]
            .map(String::from),
        );
        let o = target.wait_output(Duration::from_secs(30));
        assert_eq!(o.status.code(), Some(1), "{}", both(&o));
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "took {:?}",
            start.elapsed()
        );
        let err = stderr(&o);
        assert!(
            err.contains(&store.addr()) || err.contains(&port),
            "{}",
            both(&o)
        );
        assert!(
            err.contains("did not answer") || err.contains("frozen"),
            "{}",
            both(&o)
        );
    }
}
