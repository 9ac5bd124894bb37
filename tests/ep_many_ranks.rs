//! `ep --ranks 64 --check-connection`, the documented maximum, meets on a
//! two-core machine without a GPU: the group's probes cost O(N) store
//! requests, not O(N²), and the silence limit stretches with the load.
//! Alone in its own test binary: 64 processes load the machine, and the
//! other tests should not share it with them.

use std::process::Command;

#[test]
fn sixty_four_ranks_connect_under_our_launcher() {
    let mut ep = Command::new(env!("CARGO_BIN_EXE_ep"));
    for v in [
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "TORCHELASTIC_USE_AGENT_STORE",
    ] {
        ep.env_remove(v);
    }
    let o = ep
        .args(["--ranks", "64", "--check-connection", "--timeout", "120"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    let text = || {
        format!(
            "{:?}\n{stdout}\n{}",
            o.status,
            String::from_utf8_lossy(&o.stderr)
        )
    };
    assert!(o.status.success(), "{}", text());
    for r in 0..64 {
        assert!(
            stdout.contains(&format!("[rank {r}] connected to all 63 other rank(s)")),
            "rank {r} did not connect to all: {}",
            text()
        );
    }
}
