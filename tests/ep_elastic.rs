//! Elastic membership without a GPU: `ep --plan FILE --check-connection`
//! runs a plan's phases — the launcher hosts the store, starts each phase's
//! joiners, kills the `-r` ranks after the phase's middle step — while the
//! ranks connect their NIXL agents (the real library, over UCX) and agree
//! after every step on who is gone. Upstream's four plan files run
//! unchanged (tests/fixtures/elastic/); a SIGKILLed and a SIGSTOPped rank
//! are found, and every survivor reports the same set.
//!
//! Nothing here waits on a clock: each run ends by itself (the plan's keys
//! drive the launcher), and the deadlines are backstops only.

mod common;

use common::both as text;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/fixtures/elastic/{name}.json"))
}

/// A plan file of its own for one test (removed when dropped).
struct TempPlan(PathBuf);

impl TempPlan {
    fn new(tag: &str, text: &str) -> Self {
        let p = std::env::temp_dir().join(format!("ep-elastic-{tag}-{}.json", std::process::id()));
        std::fs::write(&p, text).unwrap();
        Self(p)
    }
}

impl Drop for TempPlan {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// `ep --check-connection --plan plan` with `extra`; its output once it
/// exits (killed and a panic after a generous backstop).
fn run_plan(plan: &Path, extra: &[&str]) -> Output {
    let mut c = ep_launcher();
    // The fault timeout is generous: a rank slowed down by a loaded machine
    // must never count as gone; a killed or frozen one is found by its
    // silent heartbeat anyway. 20 steps of 10 ms a phase: the launcher
    // draws a kill among the first 10 rounds, so even a launcher that
    // looks 100 ms late (a loaded machine) kills inside the phase.
    c.arg("--plan")
        .arg(plan)
        .args([
            "--check-connection",
            "--timeout",
            "120",
            "--fault-timeout",
            "3000",
            "--iters",
            "20",
            "--step-us",
            "10000",
        ])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    common::Reaped::new(c.spawn().expect("starting ep")).wait_output(Duration::from_secs(600))
}

/// The `ranks gone` lines of `stdout`, as (rank, phase, the set as printed).
fn decisions(stdout: &str) -> Vec<(u32, usize, String)> {
    stdout
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("[rank ")?;
            let (rank, rest) = rest.split_once("] phase ")?;
            let (phase, rest) = rest.split_once(": ranks gone: ")?;
            let set = rest.split(" (").next()?.to_string();
            Some((rank.parse().ok()?, phase.parse().ok()?, set))
        })
        .collect()
}

/// Asserts that exactly `survivors` printed that `gone` is gone in `phase`,
/// each once, and that no other decision found anyone.
fn assert_agreed(o: &Output, phase: usize, survivors: &[u32], gone: &str) {
    let stdout = String::from_utf8_lossy(&o.stdout);
    let mut seen = decisions(&stdout);
    seen.sort();
    let want: Vec<(u32, usize, String)> = (survivors.iter())
        .map(|&r| (r, phase, gone.to_string()))
        .collect();
    assert_eq!(seen, want, "{}", text(o));
}

fn assert_killed_as_planned(o: &Output, who: &str) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("killed as planned") && err.contains(who),
        "the launcher does not name {who} as killed as planned: {}",
        text(o)
    );
}

#[test]
fn upstreams_plans_without_kills_run_unchanged() {
    for (name, joiners) in [
        ("no_expansion", &[][..]),
        ("single_expansion", &[4u32, 5, 6, 7][..]),
    ] {
        let o = run_plan(&fixture(name), &[]);
        assert_eq!(o.status.code(), Some(0), "{name}: {}", text(&o));
        let stdout = String::from_utf8_lossy(&o.stdout);
        assert!(decisions(&stdout).is_empty(), "{name}: {}", text(&o));
        for r in joiners {
            let all = format!("[rank {r}] connected to all 7 other rank(s)");
            assert!(stdout.contains(&all), "{name}: rank {r}: {}", text(&o));
        }
        if !joiners.is_empty() {
            for r in 0..4 {
                let line = format!("[rank {r}] phase 1: connected to 4 joiner(s)");
                assert!(stdout.contains(&line), "{name}: {}", text(&o));
            }
        }
    }
}

/// 5 leaves after phase 1, 6 is killed in phase 2, both ids come back as
/// new processes in phase 3.
#[test]
fn upstreams_expansion_contraction_leaves_kills_and_rejoins() {
    let o = run_plan(&fixture("expansion_contraction"), &[]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_agreed(&o, 2, &[0, 1, 2, 3, 4, 7], "[6]");
    assert_killed_as_planned(&o, "rank 6");
    let stdout = String::from_utf8_lossy(&o.stdout);
    for r in [0, 1, 2, 3, 4, 7] {
        let line = format!("[rank {r}] phase 3: connected to 2 joiner(s)");
        assert!(stdout.contains(&line), "{}", text(&o));
    }
    assert!(
        stdout.contains("[rank 5] connected to rank 6 (ep-rank-6.3)"),
        "{}",
        text(&o)
    );
}

/// Rank 2 is killed mid-phase: the three survivors agree on [2] and the
/// launcher counts the kill as planned, for a rank that dies (KILL) and for
/// one that freezes with its sockets open (STOP).
#[test]
fn a_killed_and_a_frozen_rank_are_agreed_gone_by_every_survivor() {
    for signal in ["KILL", "STOP"] {
        let o = run_plan(
            &fixture("expansion_fault_contraction"),
            &["--kill-signal", signal],
        );
        assert_eq!(o.status.code(), Some(0), "{signal}: {}", text(&o));
        assert_agreed(&o, 2, &[0, 1, 3], "[2]");
        assert_killed_as_planned(&o, "rank 2");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains(&format!("SIG{signal} to rank 2")),
            "{signal}: {}",
            text(&o)
        );
    }
}

/// A killed rank's id is taken by a new process in the very next phase.
#[test]
fn a_rank_id_is_reused_at_once() {
    let plan = TempPlan::new("reuse", "[[0,1,2],[0,1,-2],[0,1,2]]");
    let o = run_plan(&plan.0, &[]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_agreed(&o, 1, &[0, 1], "[2]");
    let stdout = String::from_utf8_lossy(&o.stdout);
    for r in [0, 1] {
        let line = format!("[rank {r}] connected to rank 2 (ep-rank-2.2)");
        assert!(stdout.contains(&line), "{}", text(&o));
    }
    assert!(
        stdout.contains("[rank 2] connected to rank 0 (ep-rank-0.0)"),
        "{}",
        text(&o)
    );
}

/// The lowest rank leads the agreement; killed, it is passed over and the
/// next one decides.
#[test]
fn a_killed_leader_is_passed_over() {
    let plan = TempPlan::new("leader", "[[1,2,3],[-1,2,3]]");
    let o = run_plan(&plan.0, &[]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_agreed(&o, 1, &[2, 3], "[1]");
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("decided by rank 2"),
        "{}",
        text(&o)
    );
}

#[test]
fn bad_plans_exit_2_with_the_reason() {
    for (text_, needle) in [
        ("[[0,1],[0,1,-2]]", "not running when the phase began"),
        ("[[0,1],[]]", "phase 1 is empty"),
        ("[[1],[-1]]", "leaves no rank"),
        ("[[0,70]]", "names rank 70"),
        ("[[0,1]", "not a plan"),
    ] {
        let plan = TempPlan::new("bad", text_);
        let o = run_plan(&plan.0, &[]);
        assert_eq!(o.status.code(), Some(2), "{text_}: {}", text(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains(needle) && err.contains(&*plan.0.to_string_lossy()),
            "{text_}: {}",
            text(&o)
        );
    }
}

/// A kill/rejoin loop whose ranks are frozen (SIGSTOP): rank 1 is killed
/// twice, the second time as a new process while its frozen predecessor
/// still holds the id's old incarnation; each kill is agreed by all.
#[test]
fn a_kill_loop_of_frozen_ranks_stops_each_incarnation() {
    let loop_ = nixl_examples::ranks::plan::Plan::kill_loop(3, 3);
    assert_eq!(
        loop_.to_json(),
        "[[0,1,2],[0,-1,2],[0,1,2],[0,1,-2],[0,1,2],[0,-1,2],[0,1,2]]"
    );
    let plan = TempPlan::new("loop", &loop_.to_json());
    let o = run_plan(&plan.0, &["--kill-signal", "STOP"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let mut seen = decisions(&String::from_utf8_lossy(&o.stdout));
    seen.sort();
    let want = vec![
        (0, 1, "[1]".to_string()),
        (0, 3, "[2]".to_string()),
        (0, 5, "[1]".to_string()),
        (1, 3, "[2]".to_string()),
        (2, 1, "[1]".to_string()),
        (2, 5, "[1]".to_string()),
    ];
    assert_eq!(seen, want, "{}", text(&o));
    assert_killed_as_planned(&o, "rank 1 (started in phase 2)");
}

/// Any rank may die at any moment, rank 0 too, and the plan need not say
/// so: a test kills a rank by pid at a moment it draws, SIGKILL or
/// SIGSTOP, while four ranks run steps of agreement (each step sleeps 2 ms
/// first, so 400 steps last at least 0.8 s: a kill drawn within 0.3 s of
/// the ranks being connected lands inside the phase). Every survivor
/// names the dead rank exactly once, the launcher lists it as died and the
/// others went on, and the run exits 0. The cases are drawn from a fixed
/// seed (printed), the victim among all ranks with rank 0 and the highest
/// always included.
#[test]
fn any_rank_killed_by_pid_at_a_random_moment_is_survived() {
    let mut rng = nixl_examples::rng::SplitMix64::new(2611);
    let mut cases: Vec<(u32, i32)> = vec![(0, 9), (3, 19)];
    cases.push((
        (rng.next_u64() % 4) as u32,
        [9, 19][(rng.next_u64() % 2) as usize],
    ));
    for (victim, sig) in cases {
        let delay = Duration::from_micros(rng.next_u64() % 300_000);
        let mut c = ep_launcher();
        c.args([
            "--ranks",
            "4",
            "--elastic",
            "--check-connection",
            "--iters",
            "400",
        ])
        .args(["--timeout", "120", "--fault-timeout", "3000"]);
        let (code, all) =
            common::kill_rank_once_connected(c, victim, sig, delay, Duration::from_secs(300));
        let case = format!("victim {victim}, signal {sig}, {delay:?} after connecting");
        assert_eq!(code, Some(0), "{case}:\n{all}");
        let mut seen = decisions(&all);
        seen.sort();
        let want: Vec<(u32, usize, String)> = (0..4)
            .filter(|&r| r != victim)
            .map(|r| (r, 0, format!("[{victim}]")))
            .collect();
        assert_eq!(seen, want, "{case}:\n{all}");
        assert!(
            all.contains(&format!(
                "died unplanned, the others went on: rank {victim}"
            )),
            "{case}:\n{all}"
        );
    }
}

/// The launcher of `ep`, none of torchrun's variables inherited.
fn ep_launcher() -> Command {
    common::launcher(env!("CARGO_BIN_EXE_ep"))
}
