//! The single-process host-API example end to end: two agents of the real
//! NIXL library in one process, over UCX, DRAM only.

mod common;

use common::{both, run, stderr, stdout};

#[test]
fn every_step_runs_in_order_and_every_transfer_verifies() {
    let o = run("single_process", &["--timeout", "20"]);
    assert!(o.status.success(), "{}", both(&o));
    let out = stdout(&o);
    // The phases, in the order the example runs them.
    let steps = [
        "[target] Registered 2 DRAM buffers of 256 B",
        "[initiator] Registered 2 DRAM buffers of 256 B",
        "[initiator] Loaded name from metadata: target",
        "[initiator] Posting READ (tag UUID1)",
        "[initiator] ✓ READ: both buffers verified",
        "[initiator] Sent notif DESCS + 128 B",
        "[target] Received 2 descriptors",
        "[initiator] Posting WRITE local [0, 1] -> remote [1, 0] (tag UUID2)",
        "[initiator] ✓ WRITE: both target buffers verified",
        "[initiator] Removed remote agent target",
        "[initiator] Memory deregistered",
        "[target] Memory deregistered",
        "Test Complete.",
    ];
    let mut from = 0;
    for step in steps {
        match out[from..].find(step) {
            Some(at) => from += at + step.len(),
            None => panic!("{step:?} missing or out of order in:\n{out}"),
        }
    }
    // Two transfers (READ, WRITE), each checked.
    assert_eq!(out.matches("] ✓ ").count(), 2, "{out}");
    // Nothing went wrong quietly either (NIXL logs a failed send, say, to
    // stderr without failing the call that queued it).
    let err = stderr(&o).to_lowercase();
    assert!(
        !err.contains("error") && !err.contains("fail"),
        "{}",
        both(&o)
    );
}

#[test]
fn a_corrupted_write_is_caught_with_buffer_offset_and_bytes() {
    let o = run("single_process", &["--timeout", "20", "--corrupt"]);
    assert_eq!(o.status.code(), Some(3), "{}", both(&o));
    let err = stderr(&o);
    assert!(
        err.contains(
            "data mismatch: target buffer 1 after the WRITE (from initiator buffer 0): \
             1 byte(s) wrong; first at offset 100 (expected 0x"
        ),
        "{err}"
    );
    assert!(err.contains(", got 0x"), "{err}");
    let out = stdout(&o);
    assert!(!out.contains("✓ WRITE"), "{out}");
    assert!(!out.contains("Test Complete."), "{out}");
}
