//! What a run measured, as lines for people and JSON for programs.

use crate::roles::plan::Round;

/// A data verification failure. Binaries exit with [`EXIT_MISMATCH`] for it,
/// so scripts can tell wrong data from other failures.
#[derive(Debug, thiserror::Error)]
#[error("data mismatch: {0}")]
pub struct DataMismatch(pub String);

/// Exit status for a run whose data did not verify.
pub const EXIT_MISMATCH: i32 = 3;

/// One round as the initiator measured it.
#[derive(Clone, Debug)]
pub struct RoundResult {
    pub round: usize,
    pub size: u64,
    pub level: &'static str,
    pub blocks: u32,
    pub threads: u32,
    pub warmup: u32,
    pub iters: u32,
    /// GPU time of the timed iterations, from the first put to the moment
    /// the initiator's GPU saw the target's final acknowledgement, ns
    /// (`%globaltimer`). Includes one acknowledgement latency.
    pub gpu_ns: u64,
    /// CUDA-event time of the whole kernel, warm-up and launch included, µs.
    pub kernel_event_us: f64,
    /// The target's verdict line (`ok <checksum>` / `mismatch ...`).
    pub verdict: String,
}

impl RoundResult {
    pub fn new(round: usize, r: &Round, gpu_ns: u64, kernel_event_us: f64, verdict: &str) -> Self {
        Self {
            round,
            size: r.size,
            level: r.level.name(),
            blocks: r.blocks,
            threads: r.threads,
            warmup: r.warmup,
            iters: r.iters,
            gpu_ns,
            kernel_event_us,
            verdict: verdict.to_string(),
        }
    }

    /// Mean time per timed iteration, µs.
    pub fn us_per_iter(&self) -> f64 {
        self.gpu_ns as f64 / 1e3 / self.iters.max(1) as f64
    }

    /// Bytes delivered per second over the timed iterations, GB/s (1e9 B/s).
    pub fn gbps(&self) -> f64 {
        if self.gpu_ns == 0 {
            return 0.0;
        }
        self.size as f64 * self.iters as f64 / self.gpu_ns as f64
    }

    /// One human line.
    pub fn line(&self) -> String {
        format!(
            "{} B, {} level, {}×{} threads, {} iterations ({} warm-up): {:.2} µs/iteration, {:.2} GB/s \
             (GPU time to the target's acknowledgement)",
            self.size, self.level, self.blocks, self.threads, self.iters, self.warmup, self.us_per_iter(), self.gbps()
        )
    }

    /// One JSON object (no external serializer needed for flat numbers).
    pub fn json(&self) -> String {
        format!(
            "{{\"round\":{},\"size_bytes\":{},\"level\":\"{}\",\"blocks\":{},\"threads\":{},\"warmup\":{},\"iters\":{},\
             \"gpu_ns\":{},\"us_per_iter\":{:.4},\"gb_per_s\":{:.4},\"kernel_event_us\":{:.2},\"verified\":{}}}",
            self.round,
            self.size,
            self.level,
            self.blocks,
            self.threads,
            self.warmup,
            self.iters,
            self.gpu_ns,
            self.us_per_iter(),
            self.gbps(),
            self.kernel_event_us,
            self.verdict.starts_with("ok")
        )
    }
}

/// Prints a line to stdout and flushes it, so the two processes' lines
/// interleave in order when both write to one terminal or pipe.
#[macro_export]
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, $($arg)*);
        let _ = out.flush();
    }};
}
