//! `ep --ranks 64 --check-connection`, the documented maximum, meets on a
//! two-core machine without a GPU: the group's probes cost O(N) store
//! requests, not O(N²), and the silence limit stretches with the load.
//! Alone in its own test binary: 64 processes load the machine, and the
//! other tests should not share it with them.

mod common;

#[test]
fn sixty_four_ranks_connect_under_our_launcher() {
    let mut ep = common::launcher(env!("CARGO_BIN_EXE_ep"));
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
