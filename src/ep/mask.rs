//! The set of masked ranks: ranks a kernel no longer sends to, waits for or
//! counts in (they left, died, or went silent past the fault timeout).
//!
//! On the device it is `int32 mask[capacity]` (1 = masked, the polarity of
//! NIXL EP's `mask_buffer`); on the host a 64-bit set, since capacity ≤ 64
//! ([`super::config`] checks it). docs/EP.md §13 explains what kernels do
//! with it.

use std::collections::BTreeSet;
use std::fmt;

/// A set of ranks below 64, bit `r` = rank `r` masked.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Mask(pub u64);

impl Mask {
    /// Nobody masked: every rank present.
    pub const NONE: Mask = Mask(0);

    /// The set of `ranks`.
    ///
    /// # Panics
    /// On a rank ≥ 64.
    pub fn of(ranks: impl IntoIterator<Item = u32>) -> Self {
        Mask(ranks.into_iter().fold(0, |m, r| {
            assert!(r < 64, "rank {r}: a mask holds ranks 0..64");
            m | 1 << r
        }))
    }

    /// Everyone of `0..capacity` except `members`: the mask at the start of
    /// a phase.
    pub fn all_but(capacity: u32, members: impl IntoIterator<Item = u32>) -> Self {
        let all = if capacity >= 64 {
            u64::MAX
        } else {
            (1u64 << capacity) - 1
        };
        Mask(all & !Mask::of(members).0)
    }

    /// Whether rank `r` is masked (ranks ≥ 64 never are).
    pub fn contains(self, r: u32) -> bool {
        r < 64 && self.0 >> r & 1 == 1
    }

    /// Both sets.
    pub fn union(self, other: Mask) -> Mask {
        Mask(self.0 | other.0)
    }

    /// Whether nobody is masked.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The masked ranks, ascending.
    pub fn ranks(self) -> impl Iterator<Item = u32> {
        (0..64).filter(move |&r| self.contains(r))
    }

    /// The device words for `capacity` ranks (1 = masked), as uploaded.
    pub fn words(self, capacity: u32) -> Vec<i32> {
        (0..capacity).map(|r| i32::from(self.contains(r))).collect()
    }

    /// The set the device words say (any non-zero word is masked).
    pub fn from_words(words: &[i32]) -> Self {
        Mask::of(
            words
                .iter()
                .enumerate()
                .filter(|&(_, &w)| w != 0)
                .map(|(r, _)| r as u32),
        )
    }
}

impl From<&BTreeSet<u32>> for Mask {
    fn from(set: &BTreeSet<u32>) -> Self {
        Mask::of(set.iter().copied())
    }
}

impl From<Mask> for BTreeSet<u32> {
    fn from(m: Mask) -> Self {
        m.ranks().collect()
    }
}

/// `{1, 3}`; `{}` for nobody.
impl fmt::Display for Mask {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let list: Vec<String> = self.ranks().map(|r| r.to_string()).collect();
        write!(f, "{{{}}}", list.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sets_words_and_text_agree() {
        let m = Mask::of([1, 3, 63]);
        assert!(m.contains(3) && !m.contains(2) && !m.contains(64));
        assert_eq!(m.ranks().collect::<Vec<_>>(), [1, 3, 63]);
        assert_eq!(Mask::from_words(&m.words(64)), m);
        assert_eq!(Mask::of([1, 3]).words(5), [0, 1, 0, 1, 0]);
        assert_eq!(m.to_string(), "{1, 3, 63}");
        assert_eq!(Mask::NONE.to_string(), "{}");
        let set: BTreeSet<u32> = m.into();
        assert_eq!(Mask::from(&set), m);
    }

    #[test]
    fn a_phase_masks_everyone_but_its_members() {
        assert_eq!(Mask::all_but(4, [0, 2]), Mask::of([1, 3]));
        assert_eq!(Mask::all_but(64, 0..64), Mask::NONE);
        assert_eq!(Mask::all_but(64, 1..64), Mask::of([0]));
    }
}
