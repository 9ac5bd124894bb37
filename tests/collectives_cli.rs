//! `collectives` as users meet it without a GPU: arguments that cannot
//! work (exit 2, before any network or GPU work), and the connection check
//! — three ranks started by `collectives --ranks 3` meet through the store
//! and wire up their NIXL agents (the real library, over UCX).

use std::process::Command;

mod common;

use common::both as text;

fn collectives() -> Command {
    let mut c = common::launcher(env!("CARGO_BIN_EXE_collectives"));
    c.env("UCX_POSIX_USE_PROC_LINK", "n");
    c
}

fn usage_error(args: &[&str], needle: &str) {
    common::usage_error(collectives(), args, needle);
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
    usage_error(
        &["--algo", "ll", "--path", "put"],
        "--algo ll runs on the store path only",
    );
    usage_error(
        &["--algo", "ll128", "--path", "put"],
        "--algo ll128 runs on the store path only",
    );
    usage_error(
        &["--algo", "ll128", "-b", "8M", "-e", "16M"],
        "--algo ll128 runs up to 4 MiB",
    );
    usage_error(
        &["--ranks", "2", "--tuned", "/nonexistent/tuned.json"],
        "--tune FILE writes one",
    );
    common::refuses_a_world_that_disagrees(collectives());
}

#[test]
fn three_ranks_meet_and_connect_without_a_gpu() {
    let o = collectives()
        .args(["--ranks", "3", "--check-connection", "--timeout", "20"])
        .output()
        .unwrap();
    common::assert_all_connected(&o, 3);
}

#[test]
fn elastic_arguments_that_cannot_work_exit_2() {
    let dir = std::env::temp_dir().join(format!("coll-plan-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let plan = |name: &str, text: &str| {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p.to_str().unwrap().to_string()
    };
    usage_error(
        &["--plan", &plan("leave.json", "[[0,1,2],[0,1]]")],
        "rank 2 leaves at the end of phase 0: a collectives rank leaves only by dying",
    );
    usage_error(
        &["--plan", &plan("again.json", "[[0,1,-2],[0,1,2]]")],
        "rank 2 joins phase 1 but was a member before: a joiner takes a new rank id",
    );
    usage_error(&["--elastic", "--fault-timeout", "0"], "--fault-timeout 0");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A plan of one phase kills one of 4 ranks (drawn, with the signal, from
/// the clock; printed) during the steps of agreement: every survivor names
/// it, and the run exits 0.
#[test]
fn a_rank_the_plan_kills_is_named_by_every_survivor_without_a_gpu() {
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    let victim = 1 + seed % 3;
    let signal = ["KILL", "STOP"][(seed / 3 % 2) as usize];
    println!("seed {seed}: rank {victim}, SIG{signal}");
    let dir = std::env::temp_dir().join(format!("coll-kill-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let plan = dir.join("plan.json");
    let members: Vec<String> = (0..4)
        .map(|r| match r == victim {
            true => format!("-{r}"),
            false => r.to_string(),
        })
        .collect();
    std::fs::write(&plan, format!("[[{}]]", members.join(","))).unwrap();
    let o = collectives()
        .args([
            "--plan",
            plan.to_str().unwrap(),
            "--check-connection",
            "--iters",
            "12",
        ])
        .args([
            "--kill-signal",
            signal,
            "--kill-seed",
            &seed.to_string(),
            "--timeout",
            "30",
        ])
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    for r in (0..4).filter(|&r| r != victim) {
        assert!(
            out.contains(&format!("[rank {r}] phase 0: ranks gone: [{victim}]")),
            "rank {r} did not name rank {victim}: {}",
            text(&o)
        );
    }
}

/// A plan whose second phase brings a new rank after one died (grow after
/// shrink, as `ncclCommShrink` then `ncclCommGrow`): the joiner connects to
/// every member of its phase and every survivor to the joiner, through the
/// same membership the GPU run uses; the run exits 0.
#[test]
fn a_rank_joins_between_phases_after_one_died_without_a_gpu() {
    let dir = std::env::temp_dir().join(format!("coll-grow-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let plan = dir.join("plan.json");
    std::fs::write(&plan, "[[0,1,-2,3],[0,1,3,4]]").unwrap();
    let o = collectives()
        .args(["--plan", plan.to_str().unwrap(), "--check-connection"])
        .args(["--iters", "6", "--kill-seed", "7", "--timeout", "30"])
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    let want = [
        "[rank 4] connected to all 3 other rank(s)".to_string(),
        "[rank 0] phase 1: connected to 1 joiner(s)".into(),
        "[rank 1] phase 1: connected to 1 joiner(s)".into(),
        "[rank 3] phase 1: connected to 1 joiner(s)".into(),
    ];
    for line in want {
        assert!(out.contains(&line), "never printed {line:?}: {}", text(&o));
    }
    for r in [0, 1, 3] {
        assert!(
            out.contains(&format!("[rank {r}] phase 0: ranks gone: [2]")),
            "rank {r} did not name rank 2: {}",
            text(&o)
        );
    }
}
