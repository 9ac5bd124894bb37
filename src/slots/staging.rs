//! How a batch of staged copies is laid out: which contiguous pieces of
//! each slot move (the header and the ranges), where each sits in staging,
//! and which copy calls move them, pieces at the same offset of
//! consecutive slots sharing one 2D copy. Pure functions, so the layout is
//! tested on the host (the tests emulate the copies with memcpy); only
//! `device.rs` talks to the driver.

use std::ops::Range;

use super::verify::SlotCheck;
use super::{HEADER_BYTES, SlotJob};
use crate::pattern;

/// A slot and the spans of it (offset in the slot, length) a job moves.
pub(super) type SlotSpans = (usize, Vec<(usize, usize)>);

/// A contiguous piece of a slot (`at`: offset from the slot's start,
/// header included) and where it sits in staging.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Piece {
    pub(super) at: usize,
    pub(super) len: usize,
    pub(super) staging: usize,
}

/// One copy call: `rows` pieces of `len` bytes at offset `at` of the
/// consecutive slots `first_slot..first_slot + rows` (rows a slot apart on
/// the device), packed back to back in staging from `staging`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct CopyOp {
    pub(super) first_slot: usize,
    pub(super) at: usize,
    pub(super) len: usize,
    pub(super) rows: usize,
    pub(super) staging: usize,
}

pub(super) struct Plan {
    pub(super) copies: Vec<CopyOp>,
    /// Per slot of the batch, its pieces in order of `at`.
    pub(super) pieces: Vec<Vec<Piece>>,
    /// The staging offset after the batch.
    pub(super) end: usize,
}

/// The spans (offset in the slot, length) a job moves: the header and the
/// payload `ranges`, sorted, overlapping or touching ones merged, empty
/// ones dropped. Merging only touching spans moves no byte outside them.
pub(super) fn spans(ranges: &[Range<usize>]) -> Vec<(usize, usize)> {
    let mut v: Vec<(usize, usize)> = std::iter::once((0, HEADER_BYTES))
        .chain(
            ranges
                .iter()
                .filter(|r| !r.is_empty())
                .map(|r| (HEADER_BYTES + r.start, HEADER_BYTES + r.end)),
        )
        .collect();
    v.sort_unstable();
    let mut merged: Vec<(usize, usize)> = Vec::with_capacity(v.len());
    for (s, e) in v {
        match merged.last_mut() {
            Some(last) if s <= last.1 => last.1 = last.1.max(e),
            _ => merged.push((s, e)),
        }
    }
    merged.into_iter().map(|(s, e)| (s, e - s)).collect()
}

/// The copies that move `slots` (each a slot and its spans, in batch order)
/// with staging laid out from `base`. With `coalesce`, a span at the same
/// offset and of the same length in the slots of consecutive batch entries
/// that are consecutive slots joins one 2D copy, a row per slot.
pub(super) fn plan(slots: &[SlotSpans], base: usize, coalesce: bool) -> Plan {
    let mut copies: Vec<CopyOp> = Vec::new();
    // Per entry, per span: (copy, row).
    let mut rows: Vec<Vec<(usize, usize)>> = Vec::with_capacity(slots.len());
    for (i, (slot, spans)) in slots.iter().enumerate() {
        let follows = coalesce && i > 0 && slots[i - 1].0 + 1 == *slot;
        let mut mine = Vec::with_capacity(spans.len());
        for &(at, len) in spans {
            // The copy the previous entry's identical span went into: its
            // last row is the previous slot, so this slot is its next row.
            let ext = if follows {
                rows[i - 1]
                    .iter()
                    .map(|&(c, _)| c)
                    .find(|&c| copies[c].at == at && copies[c].len == len)
            } else {
                None
            };
            match ext {
                Some(c) => {
                    debug_assert_eq!(copies[c].first_slot + copies[c].rows, *slot);
                    mine.push((c, copies[c].rows));
                    copies[c].rows += 1;
                }
                None => {
                    mine.push((copies.len(), 0));
                    copies.push(CopyOp {
                        first_slot: *slot,
                        at,
                        len,
                        rows: 1,
                        staging: 0,
                    });
                }
            }
        }
        rows.push(mine);
    }
    let mut end = base;
    for c in &mut copies {
        c.staging = end;
        end += c.len * c.rows;
    }
    let pieces = slots
        .iter()
        .zip(&rows)
        .map(|((_, spans), mine)| {
            spans
                .iter()
                .zip(mine)
                .map(|(&(at, len), &(c, r))| Piece {
                    at,
                    len,
                    staging: copies[c].staging + r * len,
                })
                .collect()
        })
        .collect();
    Plan {
        copies,
        pieces,
        end,
    }
}

/// The staging offset of slot bytes `at..at + len`, which one piece holds.
fn locate(pieces: &[Piece], at: usize, len: usize) -> usize {
    let p = pieces
        .iter()
        .find(|p| p.at <= at && at + len <= p.at + p.len)
        .unwrap_or_else(|| panic!("slot bytes {at}+{len} are in no staged piece: {pieces:?}"));
    p.staging + (at - p.at)
}

/// Writes `job`'s header and pattern where its `pieces` sit in `staging`.
pub(super) fn stage_fill(staging: &mut [u8], pieces: &[Piece], job: &SlotJob, seed: u64) {
    let h = locate(pieces, 0, HEADER_BYTES);
    staging[h..h + HEADER_BYTES].copy_from_slice(&job.seq.to_le_bytes());
    for r in job.ranges.iter().filter(|r| !r.is_empty()) {
        let at = locate(pieces, HEADER_BYTES + r.start, r.len());
        pattern::fill_at(
            &mut staging[at..at + r.len()],
            r.start as u64,
            seed,
            job.seq,
        );
    }
}

/// Checks `job`'s slot from the copies of its `pieces` in `staging`.
pub(super) fn check_staged(
    staging: &[u8],
    pieces: &[Piece],
    job: &SlotJob,
    seed: u64,
) -> SlotCheck {
    let h = locate(pieces, 0, HEADER_BYTES);
    let header = u64::from_le_bytes(staging[h..h + HEADER_BYTES].try_into().expect("8 bytes"));
    SlotCheck::of(job, seed, header, |r| {
        if r.is_empty() {
            return &[];
        }
        let at = locate(pieces, HEADER_BYTES + r.start, r.len());
        &staging[at..at + r.len()]
    })
}

#[cfg(test)]
// Single ranges are what the callers pass for a whole payload.
#[allow(clippy::single_range_in_vec_init)]
mod tests {
    use super::super::{Region, SlotRing};
    use super::*;
    use crate::gpu::pinned::Direction;

    #[test]
    fn spans_join_the_header_and_touching_ranges_only() {
        assert_eq!(spans(&[0..4096]), vec![(0, 4104)]);
        assert_eq!(spans(&[]), vec![(0, 8)]);
        assert_eq!(spans(&[8192..12288, 0..4096, 4096..8192]), vec![(0, 12296)]);
        assert_eq!(
            spans(&[4096..8192, 100..100, 16384..20000]),
            vec![(0, 8), (4104, 4096), (16392, 3616)]
        );
        assert_eq!(spans(&[0..64, 32..128]), vec![(0, 136)]);
    }

    #[test]
    fn plans_coalesce_identical_pieces_of_consecutive_slots() {
        let same = |slot| (slot, vec![(0, 4104), (65544, 4096)]);
        // Slots 6, 7, then the ring wraps to 0, 1.
        let batch = vec![
            same(6),
            same(7),
            same(0),
            (1, vec![(0, 4104), (8200, 4096), (65544, 4096)]),
        ];
        let p = plan(&batch, 100, true);
        let shape: Vec<_> = p
            .copies
            .iter()
            .map(|c| (c.first_slot, c.at, c.rows))
            .collect();
        assert_eq!(
            shape,
            vec![
                (6, 0, 2),
                (6, 65544, 2),
                (0, 0, 2),
                (0, 65544, 2),
                (1, 8200, 1)
            ]
        );
        assert_eq!(p.end, 100 + 4 * 4104 + 4 * 4096 + 4096);
        assert_eq!(p.copies[0].staging, 100);
        assert_eq!(
            p.pieces[1][0],
            Piece {
                at: 0,
                len: 4104,
                staging: 100 + 4104
            }
        );
        assert_eq!(
            p.pieces[1][1],
            Piece {
                at: 65544,
                len: 4096,
                staging: 100 + 2 * 4104 + 4096
            }
        );
        let flat = plan(&batch, 0, false);
        assert!(flat.copies.iter().all(|c| c.rows == 1));
        assert_eq!(flat.copies.len(), 9);
        assert_eq!(flat.end, p.end - 100);
        // Staging pieces never overlap.
        let mut all: Vec<_> = p
            .pieces
            .iter()
            .flatten()
            .map(|x| (x.staging, x.staging + x.len))
            .collect();
        all.sort_unstable();
        assert!(all.windows(2).all(|w| w[0].1 <= w[1].0));
    }

    /// What the driver does with a plan, done with memcpy on host memory.
    fn emulate(
        copies: &[CopyOp],
        dir: Direction,
        region: &mut [u8],
        slot_len: usize,
        staging: &mut [u8],
    ) {
        for op in copies {
            for r in 0..op.rows {
                let d = (op.first_slot + r) * slot_len + op.at;
                let h = op.staging + r * op.len;
                match dir {
                    Direction::HostToDevice => {
                        region[d..d + op.len].copy_from_slice(&staging[h..h + op.len])
                    }
                    Direction::DeviceToHost => {
                        staging[h..h + op.len].copy_from_slice(&region[d..d + op.len])
                    }
                }
            }
        }
    }

    /// The first, a sequence-dependent and the last 4 KiB block, as the
    /// streaming example samples (including picks next to the others).
    fn sample(payload: usize, seq: u64) -> Vec<Range<usize>> {
        let blocks = payload / 4096;
        let pick = (seq as usize * 5) % blocks;
        let last = (payload - 4096) & !7;
        let mut v = vec![0..4096, pick * 4096..(pick + 1) * 4096, last..payload];
        v.sort_by_key(|r| r.start);
        v.dedup_by(|b, a| b.start < a.end);
        v
    }

    /// Reads `jobs`' slots out of `image` the staged way (copies emulated,
    /// staging laid out from an offset as behind earlier batches) and
    /// checks them there.
    fn check_through_staging(
        image: &mut [u8],
        jobs: &[SlotJob],
        slot_len: usize,
        seed: u64,
        coalesce: bool,
    ) -> Vec<SlotCheck> {
        let spans: Vec<_> = jobs.iter().map(|j| (j.slot, spans(&j.ranges))).collect();
        let p = plan(&spans, 77, coalesce);
        let mut staging = vec![0u8; p.end];
        emulate(
            &p.copies,
            Direction::DeviceToHost,
            image,
            slot_len,
            &mut staging,
        );
        jobs.iter()
            .zip(&p.pieces)
            .map(|(j, pieces)| check_staged(&staging, pieces, j, seed))
            .collect()
    }

    /// The staged (VRAM) path, its copies emulated, leaves the same bytes
    /// and finds the same problems as the in-place (DRAM) path.
    #[test]
    fn staged_fill_and_check_agree_with_the_in_place_ring() {
        let (n, payload, seed) = (5usize, 6 * 4096 + 24, 9u64);
        let slot_len = HEADER_BYTES + payload;
        for coalesce in [false, true] {
            let mut reference = SlotRing::host(n, payload);
            let mut image = reference.host_bytes().to_vec();
            for first in [0u64, 3, 8, 16] {
                // A batch: consecutive sequences, distinct slots, wrapping.
                let jobs: Vec<SlotJob> = (first..first + n as u64)
                    .map(|seq| SlotJob {
                        slot: seq as usize % n,
                        seq,
                        ranges: sample(payload, seq),
                    })
                    .collect();
                for j in &jobs {
                    reference.fill(j.slot, seed, j.seq, &j.ranges).unwrap();
                }
                let spans: Vec<_> = jobs.iter().map(|j| (j.slot, spans(&j.ranges))).collect();
                let p = plan(&spans, 0, coalesce);
                let mut staging = vec![0u8; p.end];
                for (j, pieces) in jobs.iter().zip(&p.pieces) {
                    stage_fill(&mut staging, pieces, j, seed);
                }
                let to_device = Direction::HostToDevice;
                emulate(&p.copies, to_device, &mut image, slot_len, &mut staging);
                assert!(
                    image == reference.host_bytes(),
                    "staged fill differs (first {first}, coalesce {coalesce})"
                );
                if coalesce {
                    assert!(p.copies.len() < spans.iter().map(|s| s.1.len()).sum::<usize>());
                }

                // Damage: a payload byte of one slot, the header of another
                // (overwritten by the sequence a lap later).
                let (bad, lapped) = (jobs[1].slot, jobs[3].slot);
                let byte = bad * slot_len + HEADER_BYTES + jobs[1].ranges.last().unwrap().start + 5;
                let hdr = lapped * slot_len;
                image[byte] ^= 0x40;
                image[hdr..hdr + 8].copy_from_slice(&(jobs[3].seq + n as u64).to_le_bytes());
                let mut damaged = SlotRing::host(n, payload);
                if let Region::Host(b) = &mut damaged.region {
                    b.as_mut_slice().copy_from_slice(&image);
                }

                let staged = check_through_staging(&mut image, &jobs, slot_len, seed, coalesce);
                damaged.queue_checks(jobs.clone()).unwrap();
                assert_eq!(staged, damaged.check_queued(seed).unwrap());
                assert!(
                    staged[1].mismatch.is_some_and(|m| m.count == 1),
                    "{:?}",
                    staged[1]
                );
                assert_eq!(staged[3].header, jobs[3].seq + n as u64);
                assert!(
                    staged.iter().enumerate().all(|(i, c)| i == 1
                        || i == 3
                        || (c.header == c.seq && c.mismatch.is_none()))
                );

                // Undo the damage for the next round.
                image[byte] ^= 0x40;
                image[hdr..hdr + 8].copy_from_slice(&jobs[3].seq.to_le_bytes());
            }
        }
    }
}
