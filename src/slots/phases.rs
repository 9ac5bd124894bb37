//! Where a streaming loop's time goes: accumulated host time per named
//! phase, printed as a breakdown and written as JSON.

use std::time::{Duration, Instant};

use serde_json::json;

/// Accumulated time per phase of a loop, in order of first use.
#[derive(Default)]
pub struct Phases(Vec<(&'static str, Duration)>);

impl Phases {
    /// Adds `d` to phase `name`.
    pub fn add(&mut self, name: &'static str, d: Duration) {
        match self.0.iter_mut().find(|(n, _)| *n == name) {
            Some((_, t)) => *t += d,
            None => self.0.push((name, d)),
        }
    }

    /// Runs `f`, adding its time to phase `name`.
    pub fn time<T>(&mut self, name: &'static str, f: impl FnOnce() -> T) -> T {
        let t = Instant::now();
        let r = f();
        self.add(name, t.elapsed());
        r
    }

    /// The time of phase `name` (zero if never used).
    pub fn get(&self, name: &str) -> Duration {
        self.0
            .iter()
            .find(|(n, _)| *n == name)
            .map_or(Duration::ZERO, |p| p.1)
    }

    /// Takes `d` off phase `name` (to leave out a wait that the loop's
    /// total does not cover).
    pub fn discount(&mut self, name: &str, d: Duration) {
        if let Some((_, t)) = self.0.iter_mut().find(|(n, _)| *n == name) {
            *t = t.saturating_sub(d);
        }
    }

    /// Prints to stdout `[who] Timing breakdown …`, then a line
    /// `  name  12.34 ms (5.6%)  12.3 µs/transfer` per phase, then what the
    /// phases do not cover of `total`.
    pub fn print(&self, who: &str, total: Duration, transfers: u64) {
        crate::say!(
            "[{who}] Timing breakdown (of {:.3} s, {transfers} transfers):",
            total.as_secs_f64()
        );
        let per = |d: Duration| d.as_secs_f64() * 1e6 / transfers.max(1) as f64;
        let mut covered = Duration::ZERO;
        for (n, d) in &self.0 {
            covered += *d;
            crate::say!(
                "  {n:<46} {:>10.2} ms ({:>5.1}%) {:>9.2} µs/transfer",
                ms(*d),
                pct(*d, total),
                per(*d)
            );
        }
        let other = total.saturating_sub(covered);
        crate::say!(
            "  {:<46} {:>10.2} ms ({:>5.1}%) {:>9.2} µs/transfer",
            "other",
            ms(other),
            pct(other, total),
            per(other)
        );
    }

    /// `{"name": ms, …}`.
    pub fn json(&self) -> serde_json::Value {
        serde_json::Value::Object(
            self.0
                .iter()
                .map(|(n, d)| (n.to_string(), json!(ms(*d))))
                .collect(),
        )
    }
}

/// Milliseconds.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// `d` as a percentage of `total` (0 when `total` is zero).
pub fn pct(d: Duration, total: Duration) -> f64 {
    if total.is_zero() {
        0.0
    } else {
        100.0 * d.as_secs_f64() / total.as_secs_f64()
    }
}
