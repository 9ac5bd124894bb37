//! The notifications example end to end: tags and prefixes sent alone,
//! notifications attached to WRITEs with the data checked on arrival, over
//! each metadata exchange; and a run that must fail when notifications are
//! missing.

mod common;

use std::time::{Duration, Instant};

use common::*;

const LINES: &[&str] = &[
    "[target] Tag match: \"HELLO\" ✓",
    "[target] Prefix match \"MSG:\": 8/8 arrived",
    "[target] Binary message: 260 bytes",
    "[target] Attached to WRITEs: 4/4 \"XFER:<i>\", each slot verified on arrival ✓",
    "[target] Re-posted request with its message replaced: \"REPOST:0\", slot 0 verified ✓",
    "[initiator] Target verified the re-posted WRITE ✓",
    "[main] ✓ Test Complete - Both processes succeeded!",
];

fn assert_complete(o: &std::process::Output) {
    assert!(o.status.success(), "{}", both(o));
    let out = stdout(o);
    for line in LINES {
        assert!(out.contains(line), "missing {line:?} in:\n{}", both(o));
    }
}

#[test]
fn every_notification_arrives_over_our_tcpstore() {
    assert_complete(&run("notifications", &["--port", "0", "--timeout", "20"]));
}

#[test]
fn every_notification_arrives_over_nixls_tcpstore_client() {
    assert_complete(&run(
        "notifications",
        &[
            "--port",
            "0",
            "--timeout",
            "20",
            "--metadata",
            "nixl-tcpstore",
        ],
    ));
}

#[test]
fn every_notification_arrives_over_nixls_etcd_exchange() {
    let etcd = EtcdServer::start();
    let o = run(
        "notifications",
        &[
            "--timeout",
            "20",
            "--metadata",
            "etcd",
            "--etcd-endpoints",
            &etcd.endpoint,
        ],
    );
    assert_complete(&o);
    assert_eq!(etcd.nixl_keys(), Vec::<String>::new());
}

#[test]
fn many_messages_and_large_slots() {
    let o = run(
        "notifications",
        &[
            "--port",
            "0",
            "--timeout",
            "20",
            "--messages",
            "500",
            "--transfers",
            "16",
            "--buf-size",
            "1048576",
        ],
    );
    assert!(o.status.success(), "{}", both(&o));
    assert!(
        stdout(&o).contains("Prefix match \"MSG:\": 500/500 arrived"),
        "{}",
        both(&o)
    );
    assert!(
        stdout(&o).contains("Attached to WRITEs: 16/16"),
        "{}",
        both(&o)
    );
}

#[test]
fn missing_notifications_are_named_and_fail_the_run() {
    let store = store_server();
    let port = store.port().to_string();
    let target = spawn(
        "notifications",
        &[
            "--role",
            "target",
            "--port",
            &port,
            "--timeout",
            "3",
            "--messages",
            "10",
        ],
    );
    let initiator = spawn(
        "notifications",
        &[
            "--role",
            "initiator",
            "--port",
            &port,
            "--timeout",
            "3",
            "--messages",
            "7",
        ],
    );
    let start = Instant::now();
    let t = target.wait_output(Duration::from_secs(20));
    let i = initiator.wait_output(Duration::from_secs(20));
    assert!(start.elapsed() < Duration::from_secs(15));
    assert_eq!(t.status.code(), Some(1), "{}", both(&t));
    assert!(
        stderr(&t).contains("missing 3 of 10: MSG:7, MSG:8, MSG:9"),
        "{}",
        both(&t)
    );
    // The initiator never gets its acknowledgement.
    assert_eq!(i.status.code(), Some(1), "{}", both(&i));
    assert!(stderr(&i).contains("ACK:alone"), "{}", both(&i));
}
