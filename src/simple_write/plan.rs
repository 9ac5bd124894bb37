//! What a `simple_write` run does, agreed through the store.
//!
//! The initiator decides the plan and publishes it first
//! ([`super::protocol::run_plan`]); the target reads it before allocating,
//! so both sides always agree on sizes, levels and iteration counts.
//! Upstream made the user pass the same `--size` to both processes instead.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::kernels::{Level, Path, WritePath, signals_per_iter, slice_for};
use crate::gpu::GpuInfo;
use crate::gpu::ll;

/// One measured configuration: a size at a level with a grid shape.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Round {
    /// Bytes per iteration.
    pub size: u64,
    pub level: Level,
    /// How the data moves (`nixlPut`, stores or LL lines through
    /// `nixlGetPtr`), or the floor's bare flag.
    pub path: WritePath,
    /// 0: each group moves one contiguous slice; else chunks of this many
    /// bytes dealt round-robin to the groups.
    pub chunk: u64,
    pub blocks: u32,
    pub threads: u32,
    /// Untimed iterations before the timed ones.
    pub warmup: u32,
    /// Timed iterations.
    pub iters: u32,
    /// Latency mode: one group, and the target acknowledges every
    /// iteration before the next is sent (round trips are timed).
    pub pingpong: bool,
    /// `--hbm`: iteration `i` (global) reads and writes slot `i % slots`
    /// of sources and destination that span at least twice the L2 cache
    /// ([`slots_for`]); 1 (every iteration the same bytes) otherwise.
    #[serde(default = "one_slot")]
    pub slots: u32,
}

fn one_slot() -> u32 {
    1
}

impl Round {
    /// Bytes from one slot to the next (`--hbm`): the size rounded up to
    /// 256 bytes, so every slot starts aligned for vector access.
    pub fn slot_bytes(&self) -> u64 {
        self.size.next_multiple_of(256)
    }

    /// Bytes of each source (and, on the put and store paths, of the
    /// destination) the round cycles through: the size, or all its slots.
    pub fn span(&self) -> u64 {
        match self.slots {
            0 | 1 => self.size,
            n => n as u64 * self.slot_bytes(),
        }
    }

    /// Threads that make one collective call.
    pub fn group_size(&self) -> u32 {
        self.level.group_size(self.threads)
    }

    /// Groups in the grid.
    pub fn groups(&self) -> u64 {
        (self.blocks as u64 * self.threads as u64) / self.group_size() as u64
    }

    /// Bytes each group puts.
    pub fn slice(&self) -> u64 {
        slice_for(self.size, self.groups())
    }

    /// Signals the target receives per iteration: one per group with data;
    /// none on the LL and LL128 paths (the lines are the signal); one flag on the
    /// flag path.
    pub fn signals_per_iter(&self) -> u64 {
        match self.path {
            WritePath::Data(Path::Ll | Path::Ll128) => 0,
            WritePath::Flag => 1,
            WritePath::Data(Path::Put | Path::Store) => {
                signals_per_iter(self.size, self.groups(), self.chunk)
            }
        }
    }

    /// Bytes the round occupies in the target's buffer: the payload, or
    /// on the LL path its lines (about twice as many), on the LL128 path
    /// its lines (16/15 as many, whole lines).
    pub fn wire_size(&self) -> u64 {
        match self.path {
            WritePath::Data(Path::Ll) => ll::LL.wire_bytes(self.size),
            WritePath::Data(Path::Ll128) => ll::LL128.wire_bytes(self.size),
            _ => self.size,
        }
    }

    /// Bytes the round may write in the target's buffer: its wire size,
    /// or with `--hbm` every slot ([`Round::span`]); on the LL128 path its
    /// lines and, after them, the copy the target's wait kernel makes of
    /// the last iteration's lines as it read them ([`Round::seen_copy`]).
    pub fn wire_span(&self) -> u64 {
        let copy = self.seen_copy().map_or(0, |(_, n)| n);
        self.wire_size().max(self.span()) + copy
    }

    /// LL128: where in the target's buffer (offset, bytes) its wait kernel
    /// copies the last iteration's lines as it read them, each line's data
    /// from the same load as its current flag; the host checks that copy,
    /// which the initiator never writes, so a line whose data lagged its
    /// flag cannot be repaired by bytes that land later. None elsewhere.
    pub fn seen_copy(&self) -> Option<(u64, u64)> {
        (self.path == Path::Ll128).then(|| (self.wire_size(), self.wire_size()))
    }

    /// Acknowledgements the target sends in this round.
    pub fn acks(&self) -> u64 {
        if self.pingpong {
            (self.warmup + self.iters) as u64
        } else if self.warmup > 0 {
            2
        } else {
            1
        }
    }

    /// Short name of the mode, as in reports.
    pub fn mode(&self) -> &'static str {
        if self.pingpong {
            "pingpong"
        } else {
            "bandwidth"
        }
    }

    /// `--hbm`: each slot the round wrote, with the pattern variant its
    /// last writer left there (that iteration's parity), as `(slot,
    /// variant)`. The round's last `slots` iterations are each slot's last
    /// writer; fewer iterations leave the other slots unwritten.
    pub fn slot_writers(&self, first_iter: u32) -> Vec<(u64, u64)> {
        let end = first_iter as u64 + (self.warmup + self.iters) as u64;
        let from = end
            .saturating_sub(self.slots.max(1) as u64)
            .max(first_iter as u64);
        (from..end)
            .map(|g| (g % self.slots.max(1) as u64, g & 1))
            .collect()
    }

    /// Pattern variant the target's buffer holds after the round: the
    /// parity of the round's last global iteration.
    pub fn final_variant(&self, first_iter: u32) -> u64 {
        ((first_iter + self.warmup + self.iters - 1) & 1) as u64
    }
}

/// A round as the user asked for it: what is unset is chosen by
/// [`RoundSpec::resolve`] on the initiator's GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RoundSpec {
    pub size: u64,
    pub level: Level,
    pub path: WritePath,
    pub chunk: Option<u64>,
    pub blocks: Option<u32>,
    pub threads: Option<u32>,
    pub warmup: Option<u32>,
    pub iters: Option<u32>,
    pub pingpong: bool,
    /// `--hbm`: rotate through buffers of at least twice the L2 cache.
    pub hbm: bool,
    /// `--slots N`: rotate through N slots ([`odd_slots`]), the footprint
    /// of a ring of N slots of the size (the pipeline's); `None`: as
    /// `hbm` says.
    pub slots: Option<u32>,
}

impl RoundSpec {
    /// Fills the defaults: threads per level, blocks ([`auto_blocks`] at
    /// BLOCK level in bandwidth mode, else 1), iterations ([`auto_iters`])
    /// and warm-up ([`auto_warmup`]), and with `--hbm` the slots
    /// ([`slots_for`] the GPU's `l2_bytes`). `max_resident(path, level,
    /// threads)` is the most blocks the round may have resident at once.
    pub fn resolve(
        &self,
        l2_bytes: u64,
        max_resident: impl Fn(WritePath, Level, u32) -> u32,
    ) -> Round {
        // Ping-pong times one group; wide blocks only add barrier cost there.
        let threads = self
            .threads
            .unwrap_or(match (self.level, self.pingpong, self.path) {
                (Level::Block, false, WritePath::Data(Path::Put)) => 256,
                (Level::Block, false, _) => 512,
                (Level::Block, true, _) => 256,
                (l, _, _) => l.default_threads(),
            });
        let blocks = match (self.blocks, self.level, self.pingpong) {
            (_, _, true) => 1,
            (Some(b), _, _) => b,
            (None, Level::Block, false) => {
                auto_blocks(self.size, max_resident(self.path, self.level, threads))
            }
            (None, _, false) => 1,
        };
        let iters = self
            .iters
            .unwrap_or_else(|| auto_iters(self.size, self.level, blocks, self.pingpong));
        let groups = (blocks as u64 * threads as u64) / self.level.group_size(threads) as u64;
        Round {
            size: self.size,
            level: self.level,
            path: self.path,
            chunk: self.chunk.unwrap_or_else(|| auto_chunk(self.size, groups)),
            blocks,
            threads,
            warmup: self.warmup.unwrap_or_else(|| auto_warmup(iters)),
            iters,
            pingpong: self.pingpong,
            slots: match (self.slots, self.hbm) {
                (Some(n), _) => odd_slots(n),
                (None, true) => slots_for(self.size, l2_bytes),
                (None, false) => 1,
            },
        }
    }
}

/// Slots a `--hbm` round of `size` bytes rotates through: the fewest that
/// span at least twice the L2 cache (`l2_bytes`), so a slot has been
/// evicted by the time it comes round again; made odd, so a slot's pattern
/// variant (the iteration's parity) alternates from one visit to the next
/// and a visit that did not land cannot pass as the one before. 1 when one
/// slot already spans that much (or the L2 size is unknown).
pub fn slots_for(size: u64, l2_bytes: u64) -> u32 {
    let stride = size.max(1).next_multiple_of(256);
    let need = 2 * l2_bytes;
    if stride >= need {
        return 1;
    }
    let n = need.div_ceil(stride);
    (n | 1).min(u32::MAX as u64) as u32
}

/// Slots a `--slots N` round rotates through: N made odd (N + 1 when N is
/// even), so a slot's pattern variant (the iteration's parity) alternates
/// from one visit to the next, as [`slots_for`]'s; 1 stays 1.
pub fn odd_slots(n: u32) -> u32 {
    n.max(1) | 1
}

/// The whole run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunPlan {
    /// Seed of the data pattern, fresh per run, so data left over from an
    /// earlier run can never verify.
    pub seed: u64,
    /// Timeout of every wait (store, GPU spin, view preparation), ms.
    pub timeout_ms: u64,
    /// The initiator's GPU, so the target knows whether they share one.
    pub initiator_gpu: GpuInfo,
    pub rounds: Vec<Round>,
}

impl RunPlan {
    /// Largest span of any round ([`Round::span`]): the sources' size.
    pub fn max_size(&self) -> u64 {
        self.rounds.iter().map(Round::span).max().unwrap_or(0)
    }

    /// Largest buffer any round needs on the target ([`Round::wire_span`]).
    pub fn max_wire_size(&self) -> u64 {
        self.rounds.iter().map(Round::wire_span).max().unwrap_or(0)
    }

    /// The timeout of every wait.
    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms)
    }
}

/// Rough delivery rate of one round, GB/s, for choosing iteration counts:
/// one thread copies at tens of MB/s, one warp at about a GB/s, each block
/// at tens of GB/s up to what a link carries (measured on H100/H200:
/// 0.025, 1.3–2.9 and 38–45 GB/s per block, about 370 GB/s over NVLink).
fn estimated_gbps(level: Level, blocks: u32) -> f64 {
    match level {
        Level::Thread => 0.025,
        Level::Warp => 1.3,
        Level::Block => (40.0 * blocks.max(1) as f64).min(350.0),
    }
}

/// Default timed iterations: enough for about a quarter second of data at
/// the level's typical rate, between 1 (a single thread moving 64 MiB
/// takes seconds) or 5 (block level, ping-pong) and 1000, so small
/// ping-pongs get 1000 round trips and their p99 means something.
pub fn auto_iters(size: u64, level: Level, blocks: u32, pingpong: bool) -> u32 {
    let want = 0.25e9 * estimated_gbps(level, blocks) / size.max(1) as f64;
    let lo = if pingpong || level == Level::Block {
        5.0
    } else {
        1.0
    };
    want.clamp(lo, 1000.0).round() as u32
}

/// Default untimed iterations: a tenth of the timed ones, at least one.
pub fn auto_warmup(iters: u32) -> u32 {
    (iters / 10).max(1)
}

/// Default grid for the BLOCK level in bandwidth mode: one block per 16 KiB
/// of data, at least 32 (one per 4 SMs), at most as many as can be
/// resident at once (the kernel's blocks wait on each other). THREAD and
/// WARP stay single-group: they teach.
///
/// From `bench/tune-grid.sh` on two H200s over NVLink (blocks 33–264,
/// threads 256–1024): from 64 KiB to 1 MiB the best grids had 33–132
/// blocks, the worst of them within 15% (33 blocks of 256 threads: 14.6 GB/s
/// at 64 KiB, 155 at 1 MiB on the put path); from 2 MiB the most blocks won
/// (264×256: 233 GB/s at 2 MiB, 312 at 4 MiB). The put path did best with
/// 256-thread blocks, the store path with 512 ([`RoundSpec::resolve`]).
pub fn auto_blocks(size: u64, max_resident: u32) -> u32 {
    let max = max_resident.max(1);
    (size.div_ceil(16 << 10) as u32).max(32).min(max)
}

/// Default layout: contiguous slices (0) while each group's slice is at
/// most 256 KiB, else 64 KiB chunks dealt round-robin. Measured on two
/// H200s over NVLink, 264×512 and 132×512/1024 grids: contiguous slices
/// held 371–372 GB/s while each block's slice was ≤ 256 KiB and fell to
/// 349–355 GB/s from 0.5–1 MiB per block (128 MiB and up), where every
/// block streams through its own far-apart region; 64 KiB and 1 MiB chunks
/// held 372–373 GB/s at every size to 1 GiB, on both paths.
pub fn auto_chunk(size: u64, groups: u64) -> u64 {
    if groups > 1 && slice_for(size, groups) > 256 << 10 {
        64 << 10
    } else {
        0
    }
}

/// Sizes from `min` to `max` (inclusive), each `factor` times the last, as
/// nccl-tests' `-b -e -f`.
pub fn size_sweep(min: u64, max: u64, factor: u64) -> Vec<u64> {
    let mut v = vec![min];
    while let Some(next) = v.last().and_then(|&last| last.checked_mul(factor.max(2))) {
        if next > max {
            break;
        }
        v.push(next);
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signals_count_only_groups_with_data() {
        let r = Round {
            size: 8,
            level: Level::Warp,
            path: Path::Put.into(),
            chunk: 0,
            blocks: 2,
            threads: 64,
            warmup: 0,
            iters: 1,
            pingpong: false,
            slots: 1,
        };
        assert_eq!(r.groups(), 4);
        assert_eq!(r.signals_per_iter(), 1);
        let r = Round {
            size: 1 << 20,
            level: Level::Block,
            path: Path::Put.into(),
            chunk: 0,
            blocks: 4,
            threads: 256,
            warmup: 1,
            iters: 1,
            pingpong: false,
            slots: 1,
        };
        assert_eq!(r.signals_per_iter(), 4);
    }

    #[test]
    fn ll_rounds_send_no_signal_and_need_twice_the_buffer() {
        let round = |path, size| Round {
            size,
            level: Level::Block,
            path,
            chunk: 0,
            blocks: 4,
            threads: 256,
            warmup: 1,
            iters: 1,
            pingpong: false,
            slots: 1,
        };
        assert_eq!(round(Path::Ll.into(), 1 << 20).signals_per_iter(), 0);
        assert_eq!(round(Path::Ll.into(), 1 << 20).wire_size(), 2 << 20);
        assert_eq!(round(Path::Ll.into(), 12345).wire_size(), 1544 * 16);
        assert_eq!(round(Path::Ll128.into(), 1 << 20).signals_per_iter(), 0);
        // 1 MiB in 8,739 lines of 128 bytes; 12,345 bytes in 103.
        assert_eq!(round(Path::Ll128.into(), 1 << 20).wire_size(), 8739 * 128);
        assert_eq!(round(Path::Ll128.into(), 12345).wire_size(), 103 * 128);
        // The lines, then the wait kernel's copy of them.
        assert_eq!(round(Path::Ll128.into(), 12345).wire_span(), 2 * 103 * 128);
        assert_eq!(
            round(Path::Ll128.into(), 12345).seen_copy(),
            Some((103 * 128, 103 * 128))
        );
        assert_eq!(round(Path::Ll.into(), 12345).seen_copy(), None);
        assert_eq!(round(WritePath::Flag, 0).signals_per_iter(), 1);
        assert_eq!(round(Path::Store.into(), 1 << 20).wire_size(), 1 << 20);
        let plan = RunPlan {
            seed: 1,
            timeout_ms: 1,
            initiator_gpu: GpuInfo {
                ordinal: 0,
                name: String::new(),
                uuid: String::new(),
                mps: false,
                l2_bytes: 0,
            },
            rounds: vec![
                round(Path::Put.into(), 1 << 20),
                round(Path::Ll.into(), 1 << 20),
            ],
        };
        assert_eq!((plan.max_size(), plan.max_wire_size()), (1 << 20, 2 << 20));
    }

    #[test]
    fn given_slots_are_made_odd_so_a_stale_slot_cannot_verify() {
        assert_eq!(
            (odd_slots(16), odd_slots(17), odd_slots(1), odd_slots(0)),
            (17, 17, 1, 1)
        );
    }

    #[test]
    fn hbm_slots_span_twice_the_l2_in_an_odd_count() {
        let l2 = 60 << 20;
        for size in [8u64, 4096, 65536, 1 << 20, 5 << 20, 16 << 20] {
            let n = slots_for(size, l2);
            let stride = size.next_multiple_of(256);
            assert_eq!(n % 2, 1, "size {size}");
            assert!(n as u64 * stride >= 2 * l2, "size {size}");
            assert!(
                (n as u64 - 2) * stride < 2 * l2,
                "size {size}: more slots than needed"
            );
        }
        // One slot already twice the L2, or the L2 unknown: no rotation.
        assert_eq!(slots_for(128 << 20, l2), 1);
        assert_eq!(slots_for(1 << 20, 0), 1);
        let round = Round {
            size: 1000,
            level: Level::Block,
            path: Path::Store.into(),
            chunk: 0,
            blocks: 1,
            threads: 256,
            warmup: 1,
            iters: 1,
            pingpong: false,
            slots: 3,
        };
        assert_eq!(
            (round.slot_bytes(), round.span(), round.wire_span()),
            (1024, 3072, 3072)
        );
        assert_eq!(Round { slots: 1, ..round }.span(), 1000);
        // Iterations 10 and 11 (warm-up 1, 1 timed) write slots 1 and 2
        // of 3; slot 0 is left unwritten.
        assert_eq!(round.slot_writers(10), vec![(1, 0), (2, 1)]);
        // Seven iterations from 10: the last three, 14-16, are the last
        // writers of slots 2, 0, 1.
        let seven = Round {
            warmup: 2,
            iters: 5,
            ..round
        };
        assert_eq!(seven.slot_writers(10), vec![(2, 0), (0, 1), (1, 0)]);
    }

    #[test]
    fn sweeps_like_nccl_tests() {
        assert_eq!(size_sweep(8, 64, 2), vec![8, 16, 32, 64]);
        assert_eq!(size_sweep(1 << 20, 1 << 20, 2), vec![1 << 20]);
        assert_eq!(size_sweep(8, 100, 4), vec![8, 32]);
        assert_eq!(size_sweep(1, u64::MAX, 1 << 40).len(), 2);
    }
}
