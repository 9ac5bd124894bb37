//! Which payload bytes a streaming loop writes and checks.

use std::ops::Range;

/// Bytes of each sampled block.
pub const SAMPLE_BLOCK: usize = 4096;

/// How much of each payload is written and checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Coverage {
    /// Every payload byte.
    Full,
    /// The first, the last and one sequence-dependent [`SAMPLE_BLOCK`] of
    /// each payload (the header is always checked); the rest of a slot
    /// keeps older bytes. For measuring the transfer pipeline without the
    /// cost of generating and checking every byte.
    Sample,
}

impl Coverage {
    pub const ALL: [Self; 2] = [Self::Full, Self::Sample];

    /// The name on the command line and in reports: `full`, `sample`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Full => "full",
            Self::Sample => "sample",
        }
    }

    /// The byte ranges of a `payload`-byte payload that sequence `seq`
    /// fills and the receiver checks: sorted, disjoint, each starting at a
    /// multiple of 8, as [`SlotJob`](super::SlotJob) wants.
    #[allow(clippy::single_range_in_vec_init)] // one range: the whole payload
    pub fn ranges(self, payload: usize, seq: u64) -> Vec<Range<usize>> {
        if self == Self::Full || payload <= 3 * SAMPLE_BLOCK {
            return vec![0..payload];
        }
        // A block chosen by the sequence number, so over a run every part of
        // the payload gets looked at somewhere.
        let blocks = payload / SAMPLE_BLOCK;
        let pick = (seq.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) as usize % blocks;
        let last = (payload - SAMPLE_BLOCK) & !7;
        let mut v = vec![
            0..SAMPLE_BLOCK,
            pick * SAMPLE_BLOCK..(pick + 1) * SAMPLE_BLOCK,
            last..payload,
        ];
        v.sort_by_key(|r| r.start);
        v.dedup_by(|b, a| b.start < a.end);
        v
    }

    /// The most payload bytes [`ranges`](Self::ranges) gives one slot (a
    /// bound for sizing staging).
    pub fn max_bytes(self, payload: usize) -> usize {
        if self == Self::Full || payload <= 3 * SAMPLE_BLOCK {
            payload
        } else {
            // Two blocks, and the last one, which also takes the payload's
            // tail after the last multiple of 8 (under 8 bytes).
            3 * SAMPLE_BLOCK + 8
        }
    }
}

/// clap's names and help for `--coverage`.
impl clap::ValueEnum for Coverage {
    fn value_variants<'a>() -> &'a [Self] {
        &Self::ALL
    }
    fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
        let help = match self {
            Coverage::Full => "every payload byte is written and checked",
            Coverage::Sample => {
                "header plus the first, the last and one sequence-dependent 4 KiB block of each payload; \
                 the rest of a slot keeps older bytes. For measuring the transfer pipeline without the \
                 cost of generating and checking every byte"
            }
        };
        Some(clap::builder::PossibleValue::new(self.name()).help(help))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sampled_ranges_stay_within_the_bound() {
        for payload in [64, 3 * SAMPLE_BLOCK, 3 * SAMPLE_BLOCK + 1, 16 << 20, 65541] {
            for seq in 0..50 {
                let r = Coverage::Sample.ranges(payload, seq);
                let bytes: usize = r.iter().map(|r| r.len()).sum();
                assert!(bytes <= Coverage::Sample.max_bytes(payload));
                assert!(r.iter().all(|r| r.start % 8 == 0 && r.end <= payload));
                assert!(r.windows(2).all(|w| w[0].end <= w[1].start), "{r:?}");
            }
        }
        assert_eq!(Coverage::Full.ranges(100, 3), vec![0..100]);
    }
}
