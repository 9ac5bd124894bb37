//! The sender's side of the ring: writing sequences into slots, queued in
//! batches (VRAM: async copies out of pinned staging, one wait per batch)
//! or one at a time.

use std::ops::Range;

use anyhow::Result;

use super::staging::{spans, stage_fill};
use super::{HEADER_BYTES, Region, SlotJob, SlotRing};
use crate::pattern;

impl SlotRing {
    /// Writes sequence `seq` into `slot`: the header, and the payload bytes
    /// in `ranges` (byte ranges of the payload, each starting at a multiple
    /// of 8) as pattern (`seed`, `seq`). Bytes outside `ranges` keep
    /// whatever they held. Done when it returns (VRAM: one batch and a
    /// wait, see [`fill_queue`](Self::fill_queue)).
    pub fn fill(
        &mut self,
        slot: usize,
        seed: u64,
        seq: u64,
        ranges: &[Range<usize>],
    ) -> Result<()> {
        let off = self.offset(slot);
        let slot_len = self.slot_len();
        match &mut self.region {
            Region::Host(b) => {
                let s = &mut b.as_mut_slice()[off..off + slot_len];
                s[..HEADER_BYTES].copy_from_slice(&seq.to_le_bytes());
                for r in ranges {
                    pattern::fill_at(
                        &mut s[HEADER_BYTES + r.start..HEADER_BYTES + r.end],
                        r.start as u64,
                        seed,
                        seq,
                    );
                }
                Ok(())
            }
            Region::Device(_) => {
                let job = SlotJob {
                    slot,
                    seq,
                    ranges: ranges.to_vec(),
                };
                self.fill_queue(seed, &[job])?;
                self.fill_wait()
            }
        }
    }

    /// Fills every job's slot as [`fill`](Self::fill) does. DRAM: in
    /// place, done on return. VRAM: writes headers and pattern into pinned
    /// staging and queues the H2D copies without waiting; call
    /// [`fill_wait`](Self::fill_wait) before anything reads these slots (a
    /// NIXL WRITE from them: UCX copies on its own stream, which is not
    /// ordered after ours, so only a host-side wait orders them). A
    /// previous batch still pending is waited for first, since its staging
    /// is about to be overwritten. The jobs' slots must be distinct.
    pub fn fill_queue(&mut self, seed: u64, jobs: &[SlotJob]) -> Result<()> {
        for j in jobs {
            self.check_job(j);
        }
        let d = match &mut self.region {
            Region::Host(_) => {
                for j in jobs {
                    self.fill(j.slot, seed, j.seq, &j.ranges)?;
                }
                return Ok(());
            }
            Region::Device(d) => d,
        };
        let spans: Vec<_> = jobs.iter().map(|j| (j.slot, spans(&j.ranges))).collect();
        d.queue_fills(&spans, |staging, plan| {
            for (j, pieces) in jobs.iter().zip(&plan.pieces) {
                stage_fill(staging, pieces, j, seed);
            }
        })
    }

    /// Whether VRAM fills are queued and not yet waited for.
    pub fn fill_pending(&self) -> bool {
        matches!(&self.region, Region::Device(d) if d.fill_pending())
    }

    /// Waits for the queued fills (one stream synchronisation). No-op when
    /// none are pending.
    pub fn fill_wait(&mut self) -> Result<()> {
        if let Region::Device(d) = &mut self.region {
            d.fill_wait()?;
        }
        Ok(())
    }
}
