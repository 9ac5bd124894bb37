//! The stall watchdog: a rank that makes no progress for its run's
//! `--timeout` stops with exit 1, naming where it stood (the phase, the
//! step and what it waited on), instead of waiting in silence.
//!
//! Every wait in the project has a deadline of its own, but a chain of
//! them does not: a step whose kernels each wait up to the timeout, then an
//! agreement round that waits up to it again, can hold a rank for several
//! timeouts while nothing moves. The watchdog bounds the whole chain. Code
//! says where it stands ([`at`]), what it waits on ([`waiting_on`]) and when
//! it moved on ([`progressed`]); once [`watch`] has started it, a thread
//! looks every 100 ms, and when the limit passed since the last progress it
//! raises the stall. Every wait's probe ([`crate::group::Member::probe`])
//! returns it, so the kernels are cancelled, memory is released and keys
//! are deleted on the normal error path; a process that has not exited
//! [`GRACE`] later is ended from the watchdog's thread, with the same
//! message.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long the normal error path may take to end the process once the
/// stall is raised, before the watchdog exits it itself (status 1).
pub const GRACE: Duration = Duration::from_secs(5);

/// Where a watched process stands.
struct Watch {
    who: String,
    limit: Duration,
    last: Instant,
    phase: Option<usize>,
    step: Option<String>,
    waiting: String,
    waiting_since: Instant,
    stalled: Option<(String, Instant)>,
}

static STATE: Mutex<Option<Watch>> = Mutex::new(None);

fn with<T>(f: impl FnOnce(&mut Watch) -> T) -> Option<T> {
    let mut st = STATE.lock().unwrap_or_else(|p| p.into_inner());
    st.as_mut().map(f)
}

/// Ends the watch when dropped (the thread stops at its next look).
pub struct Guard(());

impl Drop for Guard {
    fn drop(&mut self) {
        *STATE.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }
}

/// Starts watching this process (`who` names it in the message, e.g.
/// `rank 2`): no progress for `limit` raises the stall. One watch per
/// process; a second call restarts it. The thread lives until the guard
/// drops.
pub fn watch(who: &str, limit: Duration) -> Guard {
    let fresh = STATE.lock().unwrap_or_else(|p| p.into_inner()).is_none();
    *STATE.lock().unwrap_or_else(|p| p.into_inner()) = Some(Watch::new(who, limit));
    if fresh {
        std::thread::spawn(look_every_100ms);
    }
    Guard(())
}

fn look_every_100ms() {
    loop {
        std::thread::sleep(Duration::from_millis(100));
        let raised = with(|w| w.raise_if_due());
        match raised {
            None => return,
            Some(Some((why, at))) if at.elapsed() > GRACE => {
                crate::eline!(
                    "[{}] {why} (it did not stop within {GRACE:?}: exiting now)",
                    { with(|w| w.who.clone()).unwrap_or_default() }
                );
                std::process::exit(1);
            }
            _ => {}
        }
    }
}

impl Watch {
    fn new(who: &str, limit: Duration) -> Self {
        Self {
            who: who.into(),
            limit,
            last: Instant::now(),
            phase: None,
            step: None,
            waiting: "the run to start".into(),
            waiting_since: Instant::now(),
            stalled: None,
        }
    }

    /// Raises the stall once the limit passed since the last progress;
    /// the stall raised, if any, with when.
    fn raise_if_due(&mut self) -> Option<(String, Instant)> {
        if self.stalled.is_none() && self.last.elapsed() > self.limit {
            self.stalled = Some((self.describe(), Instant::now()));
        }
        self.stalled.clone()
    }

    /// The stall in words: `no progress for 20 s in phase 0 at step 1234 of
    /// 2000: waiting on …`.
    fn describe(&self) -> String {
        let mut at = String::new();
        if let Some(p) = self.phase {
            at.push_str(&format!(" in phase {p}"));
        }
        if let Some(s) = &self.step {
            at.push_str(&format!(" at {s}"));
        }
        format!(
            "no progress for {:.0?}{at}: waiting on {} (for {:.1?}); the limit is --timeout",
            self.last.elapsed(),
            self.waiting,
            self.waiting_since.elapsed()
        )
    }

    fn progressed(&mut self) {
        self.last = Instant::now();
    }

    fn at(&mut self, phase: usize, step: String) {
        (self.phase, self.step, self.last) = (Some(phase), Some(step), Instant::now());
    }

    fn waiting_on(&mut self, what: String) {
        (self.waiting, self.waiting_since) = (what, Instant::now());
    }
}

/// The process moved on: a step ended, a round was decided, a peer
/// connected, a phase the process waits for made a round.
pub fn progressed() {
    with(Watch::progressed);
}

/// Where the process stands now: phase `phase`, `step` (e.g. `step 12 of
/// 400`). Counts as progress.
pub fn at(phase: usize, step: impl Into<String>) {
    with(|w| w.at(phase, step.into()));
}

/// What the process waits on from now (e.g. `the decision after round 12,
/// led by rank 0`); not progress.
pub fn waiting_on(what: impl Into<String>) {
    with(|w| w.waiting_on(what.into()));
}

/// The stall, once raised: the reason every wait stops for.
pub fn stalled() -> Option<String> {
    with(|w| w.stalled.as_ref().map(|s| s.0.clone())).flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A watch of its own, not the process's: a stall raised here must not
    /// stop the other tests' waits, which run in this process.
    #[test]
    fn a_watch_raises_the_stall_where_progress_stops_and_names_the_wait() {
        let mut w = Watch::new("rank 7", Duration::from_millis(300));
        w.at(2, "step 5 of 9".into());
        w.waiting_on("the decision after round 5, led by rank 0".into());
        // Progress keeps it quiet however long the whole takes.
        for _ in 0..6 {
            std::thread::sleep(Duration::from_millis(100));
            w.progressed();
            assert_eq!(w.raise_if_due(), None);
        }
        std::thread::sleep(Duration::from_millis(400));
        let (why, _) = w.raise_if_due().expect("the stall was raised");
        assert!(why.contains("in phase 2 at step 5 of 9"), "{why}");
        assert!(
            why.contains("waiting on the decision after round 5, led by rank 0"),
            "{why}"
        );
    }
}
