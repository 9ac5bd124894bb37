//! two_proc over NIXL's own metadata exchange: its c10d client against our
//! TCPStore server, and its etcd client against a real etcd server; and the
//! failures a user meets first.

mod common;

use std::time::{Duration, Instant};

use common::*;

const DONE: &str = "[main] ✓ Test Complete - Both processes succeeded!";

#[test]
fn read_and_write_over_nixls_tcpstore_client() {
    let o = run(
        "two_proc",
        &[
            "--port",
            "0",
            "--timeout",
            "20",
            "--metadata",
            "nixl-tcpstore",
        ],
    );
    assert!(o.status.success(), "{}", both(&o));
    let out = stdout(&o);
    assert!(out.contains("[target] Published metadata via nixl-tcpstore and sent xfer descriptors to the initiator"), "{out}");
    assert!(
        out.contains("[target] Transfer 2 done") && out.contains(DONE),
        "{out}"
    );
}

#[cfg(feature = "libtorch")]
#[test]
fn read_and_write_over_nixls_tcpstore_client_and_torchs_server() {
    let port = free_port().to_string();
    let o = run(
        "two_proc",
        &[
            "--port",
            &port,
            "--timeout",
            "20",
            "--metadata",
            "nixl-tcpstore",
            "--store",
            "libtorch",
        ],
    );
    assert!(o.status.success(), "{}", both(&o));
}

#[test]
fn read_and_write_over_etcd_clearing_stale_keys_first() {
    let etcd = EtcdServer::start();
    // What a crashed earlier run leaves: the target's keys, with metadata
    // NIXL cannot load. Without the cleanup the initiator would fetch it.
    let c = etcd.client();
    c.put("/nixl/agents//target/", b"").unwrap();
    c.put("/nixl/agents//target/metadata", b"stale").unwrap();
    let o = run(
        "two_proc",
        &[
            "--timeout",
            "20",
            "--metadata",
            "etcd",
            "--etcd-endpoints",
            &etcd.endpoint,
        ],
    );
    assert!(o.status.success(), "{}", both(&o));
    let out = stdout(&o);
    assert!(out.contains("cleared 2 stale key(s)"), "{out}");
    assert!(
        out.contains("[target] Published metadata via etcd") && out.contains(DONE),
        "{out}"
    );
    assert_eq!(etcd.nixl_keys(), Vec::<String>::new());
}

#[test]
fn etcd_that_does_not_answer_is_named() {
    let closed = ClosedPort::new();
    let endpoint = format!("http://127.0.0.1:{}", closed.port);
    let start = Instant::now();
    let o = run(
        "two_proc",
        &[
            "--timeout",
            "5",
            "--metadata",
            "etcd",
            "--etcd-endpoints",
            &endpoint,
        ],
    );
    assert_eq!(o.status.code(), Some(1), "{}", both(&o));
    assert!(start.elapsed() < Duration::from_secs(10));
    let err = stderr(&o);
    assert!(
        err.contains(&format!("no etcd server at {endpoint}")),
        "{err}"
    );
    // A role started by hand checks too, before NIXL would only log it.
    let o = run(
        "two_proc",
        &[
            "--role",
            "target",
            "--timeout",
            "3",
            "--metadata",
            "etcd",
            "--etcd-endpoints",
            &endpoint,
        ],
    );
    assert_eq!(o.status.code(), Some(1), "{}", both(&o));
    assert!(stderr(&o).contains("no etcd server"), "{}", both(&o));
}

#[test]
fn nixls_tcpstore_client_without_a_server_fails_fast() {
    let closed = ClosedPort::new();
    let port = closed.port.to_string();
    let start = Instant::now();
    let o = run(
        "two_proc",
        &[
            "--role",
            "initiator",
            "--port",
            &port,
            "--timeout",
            "2",
            "--metadata",
            "nixl-tcpstore",
        ],
    );
    assert_eq!(o.status.code(), Some(1), "{}", both(&o));
    assert!(start.elapsed() < Duration::from_secs(10));
    assert!(
        stderr(&o).contains(&format!(
            "no TCPStore at 127.0.0.1:{port} for NIXL's TCPStore client"
        )),
        "{}",
        both(&o)
    );
}

#[test]
fn roles_on_different_exchanges_time_out_naming_the_peer() {
    // The target publishes through NIXL's client, the initiator looks in
    // our store: it never finds the target.
    let store = store_server();
    let port = store.port().to_string();
    let target = spawn(
        "two_proc",
        &[
            "--role",
            "target",
            "--port",
            &port,
            "--timeout",
            "3",
            "--metadata",
            "nixl-tcpstore",
        ],
    );
    let o = run(
        "two_proc",
        &["--role", "initiator", "--port", &port, "--timeout", "3"],
    );
    let t = target.wait_output(Duration::from_secs(20));
    assert_eq!(o.status.code(), Some(1), "{}", both(&o));
    assert!(stderr(&o).contains("target's metadata"), "{}", both(&o));
    assert_eq!(t.status.code(), Some(1), "{}", both(&t));
    assert!(
        stderr(&t).contains("metadata of agent 'initiator' did not arrive through nixl-tcpstore"),
        "{}",
        both(&t)
    );
}
