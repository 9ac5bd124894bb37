//! What checking a slot finds, and how payload bytes are compared with the
//! pattern: shared by the in-place (DRAM) and staged (VRAM) checks.

use std::ops::Range;

use super::SlotJob;
use crate::pattern::{self, Mismatch};

/// What [`SlotRing::check_queued`](super::SlotRing::check_queued) found in one slot: its header, and when
/// the header is the expected sequence, the first payload mismatch in the
/// checked ranges (`None`: all match). When the header is not the
/// expected sequence the payload is not checked (`mismatch` is `None`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlotCheck {
    pub slot: usize,
    pub seq: u64,
    pub header: u64,
    pub mismatch: Option<Mismatch>,
}

impl SlotCheck {
    /// The check of `job`'s slot whose header reads `header`, `payload(r)`
    /// giving the bytes of each checked payload range (read only when the
    /// header is the expected sequence).
    pub(super) fn of<'a>(
        job: &SlotJob,
        seed: u64,
        header: u64,
        payload: impl Fn(&Range<usize>) -> &'a [u8],
    ) -> Self {
        let mismatch = (header == job.seq)
            .then(|| verify_ranges(&job.ranges, seed, job.seq, payload))
            .flatten();
        SlotCheck {
            slot: job.slot,
            seq: job.seq,
            header,
            mismatch,
        }
    }
}

/// The first mismatch of the payload `ranges` against pattern (`seed`,
/// `seq`), `bytes(r)` giving each range's bytes; the count covers all.
pub(super) fn verify_ranges<'a>(
    ranges: &[Range<usize>],
    seed: u64,
    seq: u64,
    bytes: impl Fn(&Range<usize>) -> &'a [u8],
) -> Option<Mismatch> {
    let mut first: Option<Mismatch> = None;
    let mut count = 0;
    for r in ranges {
        if let Some(m) = verify_at(bytes(r), r.start as u64, seed, seq) {
            count += m.count;
            first.get_or_insert(m);
        }
    }
    first.map(|m| Mismatch { count, ..m })
}

/// [`pattern::verify`] for bytes that sit at `start` of the pattern: the
/// pattern module checks from offset 0, so check a copy laid out from 0
/// only when `start` is not 0.
pub(super) fn verify_at(bytes: &[u8], start: u64, seed: u64, seq: u64) -> Option<Mismatch> {
    if start == 0 {
        return pattern::verify(bytes, seed, seq);
    }
    let mut expect = vec![0u8; bytes.len()];
    pattern::fill_at(&mut expect, start, seed, seq);
    // The common case first: one memcmp rather than two byte-wise scans.
    if bytes == expect.as_slice() {
        return None;
    }
    let count = bytes.iter().zip(&expect).filter(|(a, b)| a != b).count() as u64;
    let i = bytes.iter().zip(&expect).position(|(a, b)| a != b)?;
    Some(Mismatch {
        offset: start + i as u64,
        expected: expect[i],
        actual: bytes[i],
        count,
    })
}
