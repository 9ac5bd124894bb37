//! One way to wait: poll until something happens or a deadline passes.
//!
//! Every host-side wait in this project (a peer's metadata, a transfer's
//! completion, a notification, a store key, a port that starts answering, a
//! child process) is a loop of the same shape: try, and if it is not there
//! yet, pause and try again until the deadline. [`poll`] is that loop, so
//! none of them can forget the deadline, and [`Pace`] says how it pauses:
//! busy loops on a two-core machine steal the core the peer needs.

use std::time::{Duration, Instant};

/// How a polling loop pauses between tries that found nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pace {
    /// `yield_now` for the first 64 idle tries, then 20 µs sleeps: for
    /// waits that usually end within microseconds (a transfer, a
    /// notification) on a machine that may have only two cores. Spinning
    /// alone measured up to 30% lower streaming throughput on two cores;
    /// sleeping alone adds 20 µs to every short wait.
    Yield,
    /// A fixed sleep between tries: for waits that take milliseconds or
    /// more (a peer's metadata, a port, a process).
    Every(Duration),
}

impl Pace {
    /// Pauses after the `idle`-th try in a row that found nothing.
    fn pause(self, idle: u32) {
        match self {
            Pace::Yield if idle < 64 => std::thread::yield_now(),
            Pace::Yield => std::thread::sleep(Duration::from_micros(20)),
            Pace::Every(d) => std::thread::sleep(d),
        }
    }
}

/// Calls `step` until it returns `Ok(Some(value))`, pausing per `pace`
/// between tries that return `Ok(None)`. An error from `step` ends the
/// wait at once. When `limit` passes first, returns the error that
/// `timed_out` builds from the time waited; that message should name what
/// never happened, the likely cause and the fix.
///
/// `step` is called at least once, even with a zero `limit`.
pub fn poll<T>(
    limit: Duration,
    pace: Pace,
    mut step: impl FnMut() -> anyhow::Result<Option<T>>,
    timed_out: impl FnOnce(Duration) -> anyhow::Error,
) -> anyhow::Result<T> {
    let (start, mut idle) = (Instant::now(), 0u32);
    loop {
        if let Some(v) = step()? {
            return Ok(v);
        }
        if start.elapsed() >= limit {
            return Err(timed_out(start.elapsed()));
        }
        pace.pause(idle);
        idle = idle.saturating_add(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn returns_the_first_value() {
        let mut n = 0;
        let v = poll(
            Duration::from_secs(5),
            Pace::Yield,
            || {
                n += 1;
                Ok((n == 3).then_some(n))
            },
            |_| anyhow::anyhow!("never"),
        );
        assert_eq!(v.unwrap(), 3);
    }

    #[test]
    fn times_out_with_the_callers_message() {
        let e = poll::<()>(
            Duration::from_millis(30),
            Pace::Every(Duration::from_millis(5)),
            || Ok(None),
            |waited| anyhow::anyhow!("nothing after {waited:?}"),
        )
        .unwrap_err();
        assert!(e.to_string().starts_with("nothing after"), "{e}");
    }

    #[test]
    fn errors_end_the_wait_at_once() {
        let e = poll::<()>(
            Duration::from_secs(60),
            Pace::Yield,
            || anyhow::bail!("broken"),
            |_| anyhow::anyhow!("timed out"),
        )
        .unwrap_err();
        assert_eq!(e.to_string(), "broken");
    }
}
