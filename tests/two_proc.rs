//! The host-API example end to end: two real processes, the real NIXL
//! library over UCX, metadata through a real TCPStore.

mod common;

use std::process::{Command, Output};

use common::example;

fn run(args: &[&str]) -> Output {
    common::run("two_proc", args)
}

fn lines(o: &Output) -> String {
    common::stdout(o)
}

#[test]
fn read_then_prepared_write_both_verify() {
    let o = run(&["--port", "0", "--timeout", "20"]);
    let out = lines(&o);
    assert!(
        o.status.success(),
        "stdout:\n{out}\nstderr:\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    for line in [
        "[target] Memory registered",
        "[target] Published metadata and xfer descriptors to TCP server",
        "[initiator] Successfully retrieved target descriptors",
        "[initiator] Transfer 1 done",
        "[initiator] Transfer 2 done",
        "[target] Transfer 1 done",
        "[target] Transfer 2 done",
        "[main] ✓ Test Complete - Both processes succeeded!",
    ] {
        assert!(out.contains(line), "missing {line:?} in:\n{out}");
    }
}

#[test]
fn larger_buffers_verify_too() {
    let o = run(&["--port", "0", "--buf-size", "1048576", "--seed", "99"]);
    assert!(
        o.status.success(),
        "{}\n{}",
        lines(&o),
        String::from_utf8_lossy(&o.stderr)
    );
}

#[cfg(feature = "libtorch")]
#[test]
fn runs_over_torchs_own_tcpstore() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let o = run(&[
        "--store",
        "libtorch",
        "--port",
        &port.to_string(),
        "--timeout",
        "20",
    ]);
    assert!(
        o.status.success(),
        "{}\n{}",
        lines(&o),
        String::from_utf8_lossy(&o.stderr)
    );
}

#[test]
fn a_role_without_a_store_fails_fast_and_names_it() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let start = std::time::Instant::now();
    let o = run(&[
        "--role",
        "initiator",
        "--port",
        &port.to_string(),
        "--timeout",
        "2",
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(start.elapsed().as_secs() < 15);
    assert!(err.contains(&format!("127.0.0.1:{port}")), "{err}");
}

#[test]
fn different_buffer_sizes_are_refused_clearly() {
    // Host a store via one role's process pair is overkill: use the library's server.
    use nixl_examples::store::{StoreOptions, native::TcpStore};
    let server = TcpStore::open(&StoreOptions {
        host: "127.0.0.1".into(),
        port: 0,
        is_server: true,
        num_workers: None,
        wait_workers: false,
        timeout: std::time::Duration::from_secs(10),
    })
    .unwrap();
    let port = server.port().to_string();
    let mut target = Command::new(example("two_proc"))
        .args([
            "--role",
            "target",
            "--port",
            &port,
            "--timeout",
            "5",
            "--buf-size",
            "256",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let o = run(&[
        "--role",
        "initiator",
        "--port",
        &port,
        "--timeout",
        "5",
        "--buf-size",
        "512",
    ]);
    let _ = target.kill();
    let _ = target.wait();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("same --buf-size"), "{err}");
}

#[test]
fn wrong_data_exits_3() {
    // Roles with different seeds: the target's data is wrong for the
    // initiator, whose READ check fails (a parent passes the 3 on).
    let server = common::store_server();
    let port = server.port().to_string();
    let role = |role: &str, seed: &str| {
        let args = ["--role", role, "--port", &port, "--timeout", "5"];
        common::spawn("two_proc", &[&args[..], &["--seed", seed]].concat())
    };
    let target = role("target", "1");
    let initiator = role("initiator", "2");
    let o = initiator.wait_output(std::time::Duration::from_secs(60));
    drop(target);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(3), "{err}");
    assert!(
        err.contains("data mismatch: initiator buffers after the READ"),
        "{err}"
    );
}
