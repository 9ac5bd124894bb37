//! The phase driver without a GPU, through `--check-connection --elastic`
//! of both programs that stand on it (`ep`, `collectives`): a long phase
//! (thousands of steps, each a `--step-us` pause standing in for a GPU
//! step, then the agreement), and a rank killed by pid at a moment the
//! test draws, rank 0 included. Every survivor names the dead rank once,
//! finishes every step, and prints that none of its steps after the
//! decision waited on the dead rank (the driver's own count, not a clock);
//! the launcher lists the death and exits 0. And a stall, a rank that stops
//! at a step with its heartbeat going (nothing proves it dead), ends every
//! rank with exit 1 naming the phase, the step and what it waited on.
//!
//! Nothing here depends on a clock: the deadlines are backstops only.

mod common;

use std::time::Duration;

/// Steps of the long phase, and each step's pause (µs).
const STEPS: u64 = 3000;
const STEP_US: &str = "500";

/// `program --ranks 4 --elastic --check-connection` with a long phase; the
/// rank `victim` gets `sig` by pid once every rank connected and a drawn
/// `delay` passed (well inside the phase: its steps alone take 1.5 s).
fn killed_in_a_long_phase(
    bin: &str,
    victim: u32,
    sig: i32,
    delay: Duration,
) -> (Option<i32>, String) {
    let mut c = common::launcher(bin);
    c.args(["--ranks", "4", "--elastic", "--check-connection"])
        .args(["--iters", &STEPS.to_string(), "--step-us", STEP_US])
        .args(["--timeout", "120", "--fault-timeout", "3000"]);
    common::kill_rank_once_connected(c, victim, sig, delay, Duration::from_secs(600))
}

/// Checks a survived run: exit 0, every survivor's decision names `victim`
/// once, and its phase line says it finished every step and that no step
/// after the decision waited on the dead rank.
fn assert_survived(case: &str, (code, all): &(Option<i32>, String), victim: u32) {
    assert_eq!(*code, Some(0), "{case}:\n{all}");
    for r in (0..4).filter(|&r| r != victim) {
        let decided = format!("[rank {r}] phase 0: ranks gone: [{victim}] (");
        assert_eq!(all.matches(&decided).count(), 1, "{case}: rank {r}:\n{all}");
        let done = format!(
            "[rank {r}] phase 0 done: {STEPS} steps, 0 lost; gone: [{victim}] (rank {victim} "
        );
        let line = (all.lines())
            .find(|l| l.starts_with(&done))
            .unwrap_or_else(|| panic!("{case}: no phase line of rank {r}:\n{all}"));
        assert!(
            line.contains("steps after a decision that waited on a rank already gone: 0"),
            "{case}: {line}"
        );
    }
    assert!(
        all.contains(&format!(
            "died unplanned, the others went on: rank {victim}"
        )) || all.contains(&format!("gone, the others went on: rank {victim}")),
        "{case}:\n{all}"
    );
}

/// Drawn cases (fixed seed, printed with each): rank 0 and one other drawn
/// victim, SIGKILL or SIGSTOP, at a drawn moment; for each program.
#[test]
fn a_long_phase_goes_on_at_its_pace_after_any_rank_is_killed_by_pid() {
    let mut rng = nixl_examples::rng::SplitMix64::new(2711);
    for bin in [env!("CARGO_BIN_EXE_ep"), env!("CARGO_BIN_EXE_collectives")] {
        let other = 1 + (rng.next_u64() % 3) as u32;
        for victim in [0, other] {
            let sig = [9, 19][(rng.next_u64() % 2) as usize];
            let delay = Duration::from_micros(rng.next_u64() % 1_000_000);
            let case = format!("{bin}: victim {victim}, signal {sig}, {delay:?} after connecting");
            let out = killed_in_a_long_phase(bin, victim, sig, delay);
            assert_survived(&case, &out, victim);
        }
    }
}

/// The agreement's leader (rank 0, the lowest) stops at step 200 with its
/// heartbeat going: alive, so nothing proves it dead, and no decision
/// comes. No rank waits in silence: each exits 1 within the run's timeout
/// naming phase 0 and what it waited on (the leader its own stall, or the
/// others' abort; the others the decision it leads), and so does the
/// launcher.
#[test]
fn a_stalled_leader_is_a_named_failure_on_every_rank() {
    let mut c = common::launcher(env!("CARGO_BIN_EXE_ep"));
    c.args(["--ranks", "4", "--elastic", "--check-connection"])
        .args(["--iters", "1000", "--step-us", STEP_US, "--timeout", "8"])
        .args(["--inject", "stall-at-step=0@200"]);
    let (code, all) = common::Streamed::start(c).finish(Duration::from_secs(600));
    assert_eq!(code, Some(1), "{all}");
    // The leader names its own stall, or, when another rank's wait for its
    // decision ran out first, that rank's giving up or the abort, which
    // name the round and the leader (whichever watchdog fires first).
    let leader = (all.lines())
        .find(|l| l.starts_with("[rank 0] error: "))
        .unwrap_or_else(|| panic!("rank 0 named nothing:\n{all}"));
    assert!(
        leader.contains("in phase 0 at step 200 of 1000: waiting on an injected stall at step 200")
            || (leader.contains("round 200 of phase 0")
                && (leader.contains("rank 0 leads it") || leader.contains("led by rank 0"))),
        "rank 0: {leader}"
    );
    for r in 1..4 {
        let line = (all.lines())
            .find(|l| l.starts_with(&format!("[rank {r}] error: ")))
            .unwrap_or_else(|| panic!("rank {r} named nothing:\n{all}"));
        assert!(
            line.contains("round 200 of phase 0")
                || line.contains("in phase 0 at step 200 of 1000"),
            "rank {r}: {line}"
        );
        assert!(
            line.contains("rank 0"),
            "rank {r} does not name the leader: {line}"
        );
    }
    assert!(all.contains("[ep] error: 4 of 4 processes failed"), "{all}");
}
