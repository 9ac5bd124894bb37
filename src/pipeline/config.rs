//! A run's configuration: what every rank must agree on (the cases, the
//! chunk counts, the slow stage), checked before any network or GPU work;
//! what cannot work is a usage error (exit 2) that names the fix.

use serde::{Deserialize, Serialize};

use super::kernels::{Level, PATHS, Path, has_kernel};
use super::ring;
use crate::cli::{UsageError, fmt_bytes};

/// One configuration for the whole run (rank 0's; the others must match).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Config {
    /// Stages, one rank each.
    pub stages: u32,
    /// Payload bytes per chunk, each a case.
    pub chunk_sizes: Vec<u64>,
    /// Slots per ring, each a case.
    pub slots: Vec<u32>,
    /// The most chunks one handshake covers, each a case (1 ..=
    /// [`MAX_BATCH`]); empty: [`auto_batch`].
    #[serde(default)]
    pub batches: Vec<u32>,
    pub paths: Vec<Path>,
    pub levels: Vec<Level>,
    /// Chunks per case (the warm-up included), and the untimed first ones.
    pub chunks: u64,
    pub warmup: u64,
    /// Bytes of one slot; `None`: what a chunk needs.
    pub slot_bytes: Option<u64>,
    pub blocks: Option<u32>,
    pub threads: Option<u32>,
    /// The slow stage and its delay per chunk, µs.
    pub slow_stage: Option<u32>,
    pub delay_us: u64,
    /// Every GPU wait's limit (a dead or frozen neighbour), ns.
    pub fault_timeout_ns: u64,
    /// Test hook: this stage garbles word 0 of the first timed chunk.
    pub corrupt_stage: Option<u32>,
    /// Run the copy-engine baseline.
    pub baseline: bool,
}

crate::json_value!(Config => "pipeline configuration");

/// The most chunks one handshake may cover (`PIPE_BATCH` in
/// `cuda/pipeline.cu`; the consumer's leader polls their ready words eight
/// at a time). On an H200, 8 over 16 slots moved 1 MiB store chunks about
/// 30% faster than 4, and 16 over 32 slots 10–25% faster than 8 over 16.
pub const MAX_BATCH: u32 = 16;

/// The most chunks one handshake covers when `--batch` is not given: half
/// the ring (so the two ends still overlap, one filling half while the
/// other drains the other), at most [`MAX_BATCH`]; 1 on the line paths
/// (LL, LL128), whose lines are their own ready words.
pub fn auto_batch(path: Path, slots: u32) -> u32 {
    match path {
        Path::Ll | Path::Ll128 => 1,
        _ => (slots / 2).clamp(1, MAX_BATCH),
    }
}

/// One case: a path, a level, a chunk size, a ring size and the most
/// chunks one handshake covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Case {
    pub path: Path,
    pub level: Level,
    pub chunk: u64,
    pub slots: u32,
    /// The most chunks one handshake covers: `--batch` (at most the
    /// slots; 1 on the line paths), or [`auto_batch`].
    pub batch: u32,
}

impl Case {
    /// Bytes of one slot of this case.
    pub fn slot_bytes(&self) -> u64 {
        ring::slot_bytes(self.chunk, self.path.lines())
    }

    /// Threads per block: `--threads`, else 512 on the store and line paths
    /// and 256 on the put path at block level (simple_write's), 256 at
    /// warp and thread level.
    pub fn threads(&self, cfg: &Config) -> u32 {
        cfg.threads.unwrap_or(match (self.level, self.path) {
            (Level::Block, Path::Put) => 256,
            (Level::Block, _) => 512,
            _ => 256,
        })
    }

    /// Blocks: `--blocks`, else one per 16 KiB of chunk (block level) or
    /// per 16 KiB × warps (warp level) or 1 (thread level), at most
    /// `share` (this rank's share of the GPU's SMs).
    pub fn blocks(&self, cfg: &Config, share: u32) -> u32 {
        let per_block = match self.level {
            Level::Block => 16 << 10,
            Level::Warp => u64::from(self.threads(cfg) / 32) * (16 << 10),
            Level::Thread => u64::MAX,
        };
        let want = self.chunk.div_ceil(per_block).max(1) as u32;
        cfg.blocks.unwrap_or(want.min(share)).max(1)
    }

    /// A case in words, for messages.
    pub fn describe(&self) -> String {
        format!(
            "{} path, {} level, {} chunks, {} slots, batches of up to {}",
            self.path.name(),
            self.level.name(),
            fmt_bytes(self.chunk),
            self.slots,
            self.batch
        )
    }
}

impl Config {
    /// Every case, in run order: path, level, chunk size, slots, batch
    /// (batches that come to the same on a case, as every batch on the LL
    /// path, run once).
    pub fn cases(&self) -> Vec<Case> {
        let mut out = Vec::new();
        for &path in &self.paths {
            for &level in &self.levels {
                for &chunk in &self.chunk_sizes {
                    for &slots in &self.slots {
                        for batch in self.batches_for(path, slots) {
                            out.push(Case {
                                path,
                                level,
                                chunk,
                                slots,
                                batch,
                            });
                        }
                    }
                }
            }
        }
        out
    }

    /// The batches a case runs with, in `--batch` order, each once.
    fn batches_for(&self, path: Path, slots: u32) -> Vec<u32> {
        if self.batches.is_empty() || path.lines().is_some() {
            return vec![auto_batch(path, slots)];
        }
        let mut out: Vec<u32> = Vec::new();
        for b in self.batches.iter().map(|&b| b.min(slots)) {
            if !out.contains(&b) {
                out.push(b);
            }
        }
        out
    }

    /// Refuses what cannot work, naming the fix.
    pub fn validate(&self) -> Result<(), UsageError> {
        let bad = |m: String| Err(UsageError(m));
        crate::gpu::path::refuse_missing("pipeline", &PATHS, &self.paths)?;
        if self.paths.contains(&Path::Ll128) {
            if self.levels.iter().any(|&l| !has_kernel(l, Path::Ll128)) {
                return bad("--path ll128 --level thread: eight lanes of a warp write an LL128 line at once, so \
                            the ll128 path runs at warp and block level; drop thread from --level, or use --path ll"
                    .into());
            }
            if let Some(t) = self.threads.filter(|t| t % 32 != 0) {
                return bad(format!(
                    "--threads {t} with --path ll128: a block must be whole warps (an LL128 line is eight lanes' \
                     store); give a multiple of 32"
                ));
            }
        }
        if self.warmup >= self.chunks {
            return bad(format!(
                "--warmup {} must be below --chunks {}: no chunk would be timed",
                self.warmup, self.chunks
            ));
        }
        if self.chunks > u64::from(u32::MAX) {
            return bad(format!(
                "--chunks {}: at most {} (the LL lines' sequence is 32 bits)",
                self.chunks,
                u32::MAX
            ));
        }
        if let Some(k) = self.slow_stage.filter(|&k| k >= self.stages) {
            return bad(format!(
                "--slow-stage {k}: the stages are 0..{}",
                self.stages - 1
            ));
        }
        if let Some(&b) = self.batches.iter().find(|&&b| b == 0 || b > MAX_BATCH) {
            return bad(format!(
                "--batch {b}: a handshake covers 1 to {MAX_BATCH} chunks"
            ));
        }
        if self.slow_stage.is_none() && self.delay_us != 0 {
            return bad("--delay-us needs --slow-stage K (the stage that sleeps)".into());
        }
        if let Some(k) = self.corrupt_stage.filter(|&k| k + 1 >= self.stages) {
            return bad(format!(
                "--inject corrupt={k}: only stages 0..{} write chunks",
                self.stages - 2
            ));
        }
        for case in self.cases() {
            self.check_case(&case)?;
        }
        Ok(())
    }

    /// A case's chunk must be whole vectors (LL: whole lines) and fit a slot.
    fn check_case(&self, c: &Case) -> Result<(), UsageError> {
        let unit = if c.path == Path::Ll { 8 } else { 16 };
        if c.chunk == 0 || c.chunk % unit != 0 {
            return Err(UsageError(format!(
                "--chunk {}: the {} path moves chunks of whole {unit}-byte units; give a multiple of {unit}",
                c.chunk,
                c.path.name()
            )));
        }
        match self.slot_bytes {
            Some(have) if have < c.slot_bytes() => Err(UsageError(format!(
                "a chunk of {} on the {} path needs a slot of {} bytes, but --slot-bytes is {have}: the ring cannot hold \
                 one chunk; raise --slot-bytes to {} or lower --chunk",
                fmt_bytes(c.chunk),
                c.path.name(),
                c.slot_bytes(),
                c.slot_bytes()
            ))),
            _ => Ok(()),
        }
    }

    /// The window every rank registers: the largest any case needs.
    pub fn window_bytes(&self, share: u32) -> u64 {
        (self.cases().iter())
            .map(|c| {
                let channels = c.level.channels(c.blocks(self, share), c.threads(self));
                let stride = ring::slice_stride(
                    self.slot_bytes.unwrap_or(0),
                    c.chunk,
                    channels,
                    c.path.lines(),
                );
                ring::Window::new(c.slots, stride, channels).bytes
            })
            .max()
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(slots: Vec<u32>, batches: Vec<u32>, paths: Vec<Path>) -> Config {
        Config {
            stages: 2,
            chunk_sizes: vec![1 << 20],
            slots,
            batches,
            paths,
            levels: vec![Level::Block],
            chunks: 10,
            warmup: 1,
            slot_bytes: None,
            blocks: None,
            threads: None,
            slow_stage: None,
            delay_us: 0,
            fault_timeout_ns: 1,
            corrupt_stage: None,
            baseline: false,
        }
    }

    fn batches(cfg: &Config) -> Vec<(u32, u32)> {
        cfg.cases().iter().map(|c| (c.slots, c.batch)).collect()
    }

    #[test]
    fn a_batch_is_at_most_the_ring_and_runs_once_per_case() {
        let cfg = config(vec![1, 2, 16], vec![1, 2, 4], vec![Path::Store]);
        assert_eq!(
            batches(&cfg),
            [(1, 1), (2, 1), (2, 2), (16, 1), (16, 2), (16, 4)]
        );
        // Without --batch: half the ring, at most MAX_BATCH; LL always 1.
        let auto = config(vec![1, 2, 6, 16, 32, 64], vec![], vec![Path::Put]);
        assert_eq!(
            batches(&auto),
            [(1, 1), (2, 1), (6, 3), (16, 8), (32, 16), (64, 16)]
        );
        let ll = config(vec![8], vec![2, 4], vec![Path::Ll]);
        assert_eq!(batches(&ll), [(8, 1)]);
        let ll128 = config(vec![8], vec![2, 4], vec![Path::Ll128]);
        assert_eq!(batches(&ll128), [(8, 1)]);
    }

    #[test]
    fn ll128_needs_whole_warps() {
        let mut cfg = config(vec![8], vec![], vec![Path::Ll128]);
        assert!(cfg.validate().is_ok());
        cfg.levels = vec![Level::Warp, Level::Thread];
        let err = cfg.validate().unwrap_err().0;
        assert!(
            err.contains("--level thread") && err.contains("warp and block"),
            "{err}"
        );
        cfg.levels = vec![Level::Block];
        cfg.threads = Some(48);
        let err = cfg.validate().unwrap_err().0;
        assert!(
            err.contains("--threads 48") && err.contains("multiple of 32"),
            "{err}"
        );
        // The other paths keep every level.
        cfg.paths = vec![Path::Ll];
        cfg.levels = vec![Level::Thread];
        assert!(cfg.validate().is_ok());
    }

    #[test]
    fn a_batch_outside_one_to_max_is_a_usage_error() {
        for b in [0, MAX_BATCH + 1] {
            let err = config(vec![8], vec![b], vec![Path::Store]).validate();
            assert!(err.is_err_and(|e| e.0.contains("--batch")), "batch {b}");
        }
    }
}
