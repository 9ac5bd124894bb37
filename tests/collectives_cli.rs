//! `collectives` as users meet it without a GPU: arguments that cannot
//! work (exit 2, before any network or GPU work), and the connection check
//! — three ranks started by `collectives --ranks 3` meet through the store
//! and wire up their NIXL agents (the real library, over UCX).

use std::process::{Command, Output};

mod common;

fn collectives() -> Command {
    let mut c = common::launcher(env!("CARGO_BIN_EXE_collectives"));
    c.env("UCX_POSIX_USE_PROC_LINK", "n");
    c
}

fn text(o: &Output) -> String {
    format!(
        "status {:?}\n--- stdout\n{}--- stderr\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn usage_error(args: &[&str], needle: &str) {
    let o = collectives().args(args).output().unwrap();
    assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains(needle),
        "{args:?} does not say '{needle}': {}",
        text(&o)
    );
}

#[test]
fn arguments_that_cannot_work_exit_2() {
    // 3 ranks of f32 allgather need 12 bytes at least.
    usage_error(
        &["--ranks", "3", "-b", "8", "-e", "8", "--op", "allgather"],
        "at least 12",
    );
    usage_error(&["-b", "64", "-e", "8"], "larger than -e");
    usage_error(&["-f", "1"], "-f must be at least 2");
    usage_error(&["--ranks", "17"], "17");
    usage_error(&["--ranks", "2", "--inject", "corrupt=5"], "corrupt=R");
    usage_error(&["-w", "0"], "0");
    let o = collectives()
        .args(["--ranks", "3"])
        .env("RANK", "0")
        .env("WORLD_SIZE", "2")
        .env("MASTER_PORT", "1")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
}

#[test]
fn three_ranks_meet_and_connect_without_a_gpu() {
    let o = collectives()
        .args(["--ranks", "3", "--check-connection", "--timeout", "20"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    for r in 0..3 {
        assert!(
            out.contains(&format!("[rank {r}] connected to all 2 other rank(s)")),
            "rank {r}: {}",
            text(&o)
        );
    }
}
