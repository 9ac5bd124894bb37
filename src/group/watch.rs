//! What the probe remembers between calls: when it may next ask the store,
//! the reason it found, our own beats, and each member's heartbeat as last
//! seen (`liveness.rs` drives it).

use std::time::{Duration, Instant};

use super::{SILENT_AFTER, SILENT_BEATS};

/// What the probe remembers between calls.
pub(super) struct Watch {
    /// When the probe may next send requests.
    pub(super) next: Instant,
    /// A reason found once is the answer from then on.
    pub(super) found: Option<String>,
    /// Our own beats so far, and when the last went out.
    pub(super) beats: u64,
    pub(super) last_beat: Option<Instant>,
    /// Whose silence the probe reports, as (member, name in keys); `None`:
    /// every other member under its roster name.
    pub(super) watched: Option<Vec<(usize, String)>>,
    /// Per member: its heartbeat as last read, when it moved, and our beat
    /// count then.
    seen: Vec<Option<Seen>>,
}

#[derive(Clone)]
struct Seen {
    /// The name whose heartbeat this is (a new process under the same
    /// member index beats under a new name and starts afresh).
    name: String,
    value: i64,
    at: Instant,
    our_beats: u64,
}

impl Watch {
    pub(super) fn new(size: usize) -> Self {
        Self {
            next: Instant::now(),
            found: None,
            beats: 0,
            last_beat: None,
            watched: None,
            seen: vec![None; size],
        }
    }
}

impl Watch {
    /// How long member `i`'s heartbeat has stood still, as far as seen.
    pub(super) fn quiet(&self, i: usize) -> Duration {
        self.seen[i]
            .as_ref()
            .map_or(Duration::ZERO, |s| s.at.elapsed())
    }

    /// Records member `i`'s heartbeat `value`, read under `name`; once it
    /// has stood still for [`SILENT_AFTER`] and [`SILENT_BEATS`] of ours,
    /// returns for how long.
    pub(super) fn judge(&mut self, i: usize, name: &str, value: i64) -> Option<Duration> {
        match &self.seen[i] {
            Some(s) if s.value == value && s.name == name => {
                let quiet = s.at.elapsed();
                let missed = self.beats - s.our_beats;
                (quiet >= SILENT_AFTER && missed >= SILENT_BEATS).then_some(quiet)
            }
            _ => {
                self.seen[i] = Some(Seen {
                    name: name.to_string(),
                    value,
                    at: Instant::now(),
                    our_beats: self.beats,
                });
                None
            }
        }
    }
}

/// A heartbeat counter's value (decimal ASCII, as `ADD` stores it).
pub(super) fn parse(raw: &[u8]) -> Option<i64> {
    std::str::from_utf8(raw).ok()?.parse().ok()
}
