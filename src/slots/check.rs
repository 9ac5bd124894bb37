//! The receiver's side of the ring: checking slots' headers and payloads,
//! queued in batches (VRAM: one stream synchronisation per batch) or one at
//! a time.

use std::ops::Range;

use anyhow::Result;

use super::staging::{check_staged, spans};
use super::verify::{SlotCheck, verify_at, verify_ranges};
use super::{HEADER_BYTES, Region, SlotJob, SlotRing, Staged, read_header};
use crate::pattern::Mismatch;

impl SlotRing {
    /// Queues a check of each job's slot: its header, and the payload
    /// bytes in its ranges against pattern (`seed`, `seq`), done by
    /// [`check_queued`](Self::check_queued). DRAM: nothing to do yet (the
    /// slot is read in place then). VRAM: queues the D2H copies of header
    /// and ranges into pinned staging, without waiting. Read a slot only
    /// after a notification says its data landed.
    ///
    /// Errors if the staging cannot hold this batch while earlier checks
    /// are still queued (reserve enough with
    /// [`reserve_staging`](Self::reserve_staging)).
    pub fn queue_checks(&mut self, jobs: Vec<SlotJob>) -> Result<()> {
        for j in &jobs {
            self.check_job(j);
        }
        let checks_queued = !self.queued.is_empty();
        let pieces = match &mut self.region {
            Region::Host(_) => vec![Vec::new(); jobs.len()],
            Region::Device(d) => {
                let spans: Vec<_> = jobs.iter().map(|j| (j.slot, spans(&j.ranges))).collect();
                d.queue_reads(&spans, checks_queued)?.pieces
            }
        };
        self.queued.extend(
            jobs.into_iter()
                .zip(pieces)
                .map(|(job, pieces)| Staged { job, pieces }),
        );
        Ok(())
    }

    /// Slots queued for checking.
    pub fn queued_checks(&self) -> usize {
        self.queued.len()
    }

    /// Waits for the queued checks' copies (one stream synchronisation for
    /// the whole batch); no-op for DRAM or when none are pending.
    pub fn wait_queued(&mut self) -> Result<()> {
        if let Region::Device(d) = &mut self.region {
            d.reads_wait()?;
        }
        Ok(())
    }

    /// Checks every queued slot, in queue order, and empties the queue.
    /// Waits for the copies first if [`wait_queued`](Self::wait_queued) has
    /// not. A slot's payload is checked only when its header holds the
    /// expected sequence.
    pub fn check_queued(&mut self, seed: u64) -> Result<Vec<SlotCheck>> {
        self.wait_queued()?;
        let (slot_len, slots) = (self.slot_len(), self.slots);
        let queued = std::mem::take(&mut self.queued);
        let out = match &mut self.region {
            Region::Host(b) => queued
                .iter()
                .map(|s| check_in_place(b.as_slice(), slot_len, slots, &s.job, seed))
                .collect(),
            Region::Device(d) => {
                let staging = d.read_staging();
                let out = queued
                    .iter()
                    .map(|s| check_staged(staging, &s.pieces, &s.job, seed))
                    .collect();
                d.reads_done();
                out
            }
        };
        Ok(out)
    }

    /// Checks the payload bytes in `ranges` of `slot` against pattern
    /// (`seed`, `seq`); the first mismatch (offsets relative to the payload).
    /// VRAM: one copy and a wait per range.
    pub fn verify(
        &mut self,
        slot: usize,
        seed: u64,
        seq: u64,
        ranges: &[Range<usize>],
    ) -> Result<Option<Mismatch>> {
        let payload_at = self.offset(slot) + HEADER_BYTES;
        match &mut self.region {
            Region::Host(b) => {
                let bytes = &b.as_slice()[payload_at..payload_at + self.payload];
                Ok(verify_ranges(ranges, seed, seq, |r| &bytes[r.clone()]))
            }
            Region::Device(d) => {
                let (mut first, mut count): (Option<Mismatch>, u64) = (None, 0);
                for r in ranges {
                    let mut piece = vec![0u8; r.len()];
                    d.read_at(payload_at + r.start, &mut piece)?;
                    if let Some(m) = verify_at(&piece, r.start as u64, seed, seq) {
                        count += m.count;
                        first.get_or_insert(m);
                    }
                }
                Ok(first.map(|m| Mismatch { count, ..m }))
            }
        }
    }
}

/// Checks `job`'s slot where it lies in a DRAM `region` of `slots` slots.
///
/// A peer that does not wait for the receiver (send_recv's
/// `--no-backpressure`) may rewrite the slot while it is being checked:
/// one WRITE carries header and payload with no order between their
/// bytes, so the header can still read `job.seq` over a payload that is
/// already partly a later sequence's. Such a check is reported with the
/// later sequence as its header (an overrun, not a mismatch): the header
/// read again after the payload, or the later sequence whose pattern the
/// wrong bytes hold.
fn check_in_place(
    region: &[u8],
    slot_len: usize,
    slots: usize,
    job: &SlotJob,
    seed: u64,
) -> SlotCheck {
    let off = job.slot * slot_len;
    let bytes = &region[off + HEADER_BYTES..off + slot_len];
    let mut check = SlotCheck::of(job, seed, read_header(region, off), |r| &bytes[r.clone()]);
    if let Some(m) = check.mismatch.filter(|_| check.header == job.seq) {
        let later = match read_header(region, off) {
            h if h != job.seq => Some(h),
            _ => later_sequence_at(bytes, m.offset as usize, job.seq, slots as u64, seed),
        };
        if let Some(h) = later {
            check.header = h;
            check.mismatch = None;
        }
    }
    check
}

/// How many later sequences of a slot [`later_sequence_at`] tries: a
/// sender that ignores backpressure can be this many laps ahead at most
/// before the check notices (far more than a run's transfers / slots).
const LAPS: u64 = 4096;

/// The later sequence of the same slot (`seq + k·slots`, k ≥ 1) whose
/// pattern the 8 payload bytes around `at` (the first wrong byte) hold
/// now, if any. Fewer than 8 bytes would match by chance too often.
fn later_sequence_at(payload: &[u8], at: usize, seq: u64, slots: u64, seed: u64) -> Option<u64> {
    if payload.len() < 8 {
        return None;
    }
    let start = at.min(payload.len() - 8);
    let aligned = start & !7;
    let mut now = [0u8; 8];
    // SAFETY: in bounds (start + 8 <= len); the peer writes these bytes
    // behind the compiler's back, so read them volatile, once.
    now.copy_from_slice(&unsafe {
        std::ptr::read_volatile(payload[start..start + 8].as_ptr() as *const [u8; 8])
    });
    let mut expect = [0u8; 16];
    (1..=LAPS).map(|k| seq + k * slots).find(|&later| {
        crate::pattern::fill_at(&mut expect, aligned as u64, seed, later);
        expect[start - aligned..start - aligned + 8] == now
    })
}

#[cfg(test)]
// Single ranges are what the callers pass for a whole payload.
#[allow(clippy::single_range_in_vec_init)]
mod tests {
    use super::super::EMPTY;
    use super::*;

    #[test]
    fn host_ring_fills_and_verifies_in_pieces() {
        let mut r = SlotRing::host(3, 4096);
        assert_eq!(r.header(2).unwrap(), EMPTY);
        r.fill(1, 5, 42, &[0..4096]).unwrap();
        assert_eq!(r.header(1).unwrap(), 42);
        assert_eq!(r.verify(1, 5, 42, &[0..4096]).unwrap(), None);
        assert_eq!(r.verify(1, 5, 42, &[1024..2048, 4000..4096]).unwrap(), None);
        assert!(
            r.verify(1, 5, 41, &[0..64]).unwrap().is_some(),
            "stale sequence must fail"
        );
        let m = r.verify(0, 5, 42, &[4088..4096]).unwrap().unwrap();
        assert_eq!((m.offset, m.count > 0), (4088, true));
        assert_eq!(r.descs().descs.len(), 3);
        assert_eq!(r.descs().descs[1].addr - r.descs().descs[0].addr, 4104);
        assert_eq!(r.whole().descs[0].len, 3 * 4104);
    }

    #[test]
    fn host_ring_queued_checks_classify_like_header_and_verify() {
        let mut r = SlotRing::host(2, 4096);
        r.fill(0, 5, 10, &[0..4096]).unwrap();
        r.fill(1, 5, 13, &[0..4096]).unwrap();
        let jobs = vec![
            SlotJob {
                slot: 0,
                seq: 10,
                ranges: vec![0..4096],
            },
            SlotJob {
                slot: 1,
                seq: 11,
                ranges: vec![0..4096],
            },
        ];
        r.queue_checks(jobs).unwrap();
        assert_eq!(r.queued_checks(), 2);
        let c = r.check_queued(5).unwrap();
        assert_eq!(r.queued_checks(), 0);
        assert_eq!(
            c[0],
            SlotCheck {
                slot: 0,
                seq: 10,
                header: 10,
                mismatch: None
            }
        );
        // A later sequence in the header: reported as found, payload not checked.
        assert_eq!(
            c[1],
            SlotCheck {
                slot: 1,
                seq: 11,
                header: 13,
                mismatch: None
            }
        );
        assert!(r.copy_stats().is_none());
    }

    #[test]
    fn a_slot_rewritten_while_checked_is_an_overrun_not_a_mismatch() {
        let mut r = SlotRing::host(2, 4096);
        // Sequence 10 arrived; sequence 12 (the same slot, one lap later) is
        // half written over it, its header not yet.
        r.fill(0, 5, 10, &[0..4096]).unwrap();
        r.fill(0, 5, 12, &[1024..2048]).unwrap();
        r.set_header(0, 10).unwrap();
        r.fill(1, 5, 11, &[0..4096]).unwrap();
        let whole = |slot, seq| SlotJob {
            slot,
            seq,
            ranges: vec![0..4096],
        };
        r.queue_checks(vec![whole(0, 10)]).unwrap();
        let c = r.check_queued(5).unwrap();
        assert_eq!((c[0].header, c[0].mismatch), (12, None), "{c:?}");
        // Bytes of no later sequence of the slot (11 + 2k) stay a mismatch.
        r.fill(1, 5, 100, &[0..8]).unwrap();
        r.set_header(1, 11).unwrap();
        r.queue_checks(vec![whole(1, 11)]).unwrap();
        let c = r.check_queued(5).unwrap();
        assert_eq!(c[0].header, 11);
        assert_eq!(c[0].mismatch.map(|m| (m.offset, m.count)), Some((0, 8)));
    }
}
