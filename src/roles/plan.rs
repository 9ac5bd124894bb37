//! What a `simple_write` run does, agreed through the store.
//!
//! The initiator decides the plan and publishes it first (key
//! [`super::keys::RUN_PLAN`]); the target reads it before allocating, so
//! both sides always agree on sizes, levels and iteration counts. Upstream
//! made the user pass the same `--size` to both processes instead.

use std::time::Duration;

use anyhow::{Context, Result, bail};

use crate::gpu::kernels::{Level, active_groups, slice_for};

/// One measured configuration: a size at a level with a grid shape.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Round {
    /// Bytes per iteration.
    pub size: u64,
    pub level: Level,
    pub blocks: u32,
    pub threads: u32,
    /// Untimed iterations before the timed ones.
    pub warmup: u32,
    /// Timed iterations.
    pub iters: u32,
}

impl Round {
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

    /// Signals the target receives per iteration: one per group with data.
    pub fn signals_per_iter(&self) -> u64 {
        active_groups(self.size, self.slice())
    }

    /// Acknowledgements the target sends in this round.
    pub fn acks(&self) -> u64 {
        if self.warmup > 0 { 2 } else { 1 }
    }

    /// Pattern variant the target's buffer holds after the round: the
    /// parity of the round's last global iteration.
    pub fn final_variant(&self, first_iter: u32) -> u64 {
        ((first_iter + self.warmup + self.iters - 1) & 1) as u64
    }
}

/// The whole run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunPlan {
    /// Seed of the data pattern, fresh per run, so data left over from an
    /// earlier run can never verify.
    pub seed: u64,
    /// Timeout of every wait (store, GPU spin, view preparation).
    pub timeout: Duration,
    pub rounds: Vec<Round>,
}

impl RunPlan {
    /// Largest size of any round: the buffers' size.
    pub fn max_size(&self) -> u64 {
        self.rounds.iter().map(|r| r.size).max().unwrap_or(0)
    }

    /// Text form for the store: a header line, then one line per round.
    pub fn encode(&self) -> Vec<u8> {
        let mut s = format!("simple_write/1 seed={} timeout_ms={}\n", self.seed, self.timeout.as_millis());
        for r in &self.rounds {
            s += &format!(
                "round size={} level={} blocks={} threads={} warmup={} iters={}\n",
                r.size, r.level, r.blocks, r.threads, r.warmup, r.iters
            );
        }
        s.into_bytes()
    }

    /// Parses [`RunPlan::encode`]'s output.
    pub fn decode(bytes: &[u8]) -> Result<Self> {
        let text = std::str::from_utf8(bytes).context("run plan is not UTF-8")?;
        let mut lines = text.lines();
        let header = lines.next().context("empty run plan")?;
        let mut words = header.split_whitespace();
        if words.next() != Some("simple_write/1") {
            bail!("run plan from an incompatible simple_write version: {header:?}");
        }
        let kv = |words: std::str::SplitWhitespace<'_>| -> Result<std::collections::HashMap<String, String>> {
            words
                .map(|w| w.split_once('=').map(|(k, v)| (k.to_string(), v.to_string())).context("bad run plan field"))
                .collect()
        };
        let h = kv(words)?;
        let num = |m: &std::collections::HashMap<String, String>, k: &str| -> Result<u64> {
            m.get(k).with_context(|| format!("run plan lacks {k}"))?.parse().with_context(|| format!("run plan field {k}"))
        };
        let mut rounds = Vec::new();
        for line in lines {
            let mut w = line.split_whitespace();
            if w.next() != Some("round") {
                bail!("bad run plan line {line:?}");
            }
            let m = kv(w)?;
            let level: Level = m.get("level").context("run plan lacks level")?.parse().map_err(anyhow::Error::msg)?;
            rounds.push(Round {
                size: num(&m, "size")?,
                level,
                blocks: num(&m, "blocks")? as u32,
                threads: num(&m, "threads")? as u32,
                warmup: num(&m, "warmup")? as u32,
                iters: num(&m, "iters")? as u32,
            });
        }
        Ok(Self { seed: num(&h, "seed")?, timeout: Duration::from_millis(num(&h, "timeout_ms")?), rounds })
    }
}

/// Default timed iterations for a size and level: as many as fit a rough
/// per-round byte budget (a single thread copies at tens of MB/s, a block at
/// tens of GB/s), between 1 and 100.
pub fn auto_iters(size: u64, level: Level, blocks: u32) -> u32 {
    let budget: u64 = match level {
        Level::Thread => 32 << 20,
        Level::Warp => 1 << 30,
        Level::Block => (16u64 << 30) * blocks.max(1) as u64,
    };
    (budget / size.max(1)).clamp(1, 100) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_round_trips() {
        let p = RunPlan {
            seed: 0xdead_beef,
            timeout: Duration::from_secs(30),
            rounds: vec![
                Round { size: 8, level: Level::Thread, blocks: 1, threads: 1, warmup: 10, iters: 100 },
                Round { size: 1 << 26, level: Level::Block, blocks: 132, threads: 1024, warmup: 0, iters: 5 },
            ],
        };
        assert_eq!(RunPlan::decode(&p.encode()).unwrap(), p);
    }

    #[test]
    fn signals_count_only_groups_with_data() {
        let r = Round { size: 8, level: Level::Warp, blocks: 2, threads: 64, warmup: 0, iters: 1 };
        assert_eq!(r.groups(), 4);
        assert_eq!(r.signals_per_iter(), 1);
        let r = Round { size: 1 << 20, level: Level::Block, blocks: 4, threads: 256, warmup: 1, iters: 1 };
        assert_eq!(r.signals_per_iter(), 4);
    }
}
