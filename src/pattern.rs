//! The data the examples send, and its verification.
//!
//! A constant fill (upstream's 42) cannot tell a misplaced byte from a right
//! one, and cannot tell this iteration's data from the last one's. Every
//! byte here depends on its offset, on a per-run seed and on a variant
//! number (the examples use the iteration's parity, or a slot's sequence
//! number), so shifted, truncated, stale or foreign data all fail.

/// SplitMix64 (Steele, Lea, Flood 2014): a fast, well-mixed 64-bit hash.
#[inline]
fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Words per base block: the pattern repeats a random 64 KiB block, each
/// repetition XORed with its own key.
const BLOCK_WORDS: u64 = 8192;

thread_local! {
    /// The base block of the last seed used on this thread.
    static BASE: std::cell::RefCell<(u64, Vec<u64>)> = const { std::cell::RefCell::new((0, Vec::new())) };
}

/// The key XORed into block `block` of variant `variant`: every word of a
/// block changes with the variant and with the block's position.
#[inline]
fn block_key(seed: u64, variant: u64, block: u64) -> u64 {
    splitmix64(
        seed ^ variant.wrapping_mul(0xD6E8_FEB8_6659_FD93)
            ^ block.wrapping_mul(0xA076_1D64_78BD_642F),
    )
}

/// Runs `f` with the base block for `seed` (computed once per seed and thread).
fn with_base<R>(seed: u64, f: impl FnOnce(&[u64]) -> R) -> R {
    BASE.with(|b| {
        let mut b = b.borrow_mut();
        if b.1.is_empty() || b.0 != seed {
            let words = (0..BLOCK_WORDS)
                .map(|i| splitmix64(seed.rotate_left(17) ^ i.wrapping_mul(0x9FB2_1C65_1E98_DF25)))
                .collect();
            *b = (seed, words);
        }
        f(&b.1)
    })
}

/// Fills `buf` with pattern (`seed`, `variant`); byte `i` is the same
/// whatever the buffer's length.
///
/// Word `j` (8 bytes, little-endian) is `base[j mod 8192] ^ key(seed,
/// variant, j / 8192)`: one load and one XOR per word, so filling and
/// checking run at memory speed (a hash per word ran at ≈2.8 GB/s and made
/// the streaming example CPU-bound), while every word still depends on its
/// position, the seed and the variant.
pub fn fill(buf: &mut [u8], seed: u64, variant: u64) {
    fill_at(buf, 0, seed, variant);
}

/// Fills `buf` as bytes `start..start+buf.len()` of the pattern, so a large
/// pattern can be produced (or checked) in pieces. `start` must be a
/// multiple of 8.
pub fn fill_at(buf: &mut [u8], start: u64, seed: u64, variant: u64) {
    debug_assert_eq!(start % 8, 0);
    with_base(seed, |base| {
        let mut j = start / 8;
        let mut rest = buf;
        while !rest.is_empty() {
            let block = j / BLOCK_WORDS;
            let key = block_key(seed, variant, block);
            let from = (j % BLOCK_WORDS) as usize;
            let words = (BLOCK_WORDS as usize - from).min(rest.len().div_ceil(8));
            let bytes = (words * 8).min(rest.len());
            let (head, tail) = rest.split_at_mut(bytes);
            let mut chunks = head.chunks_exact_mut(8);
            for (c, &b) in (&mut chunks).zip(&base[from..from + words]) {
                c.copy_from_slice(&(b ^ key).to_le_bytes());
            }
            let rem = chunks.into_remainder();
            if !rem.is_empty() {
                let w = (base[from + words - 1] ^ key).to_le_bytes();
                let n = rem.len();
                rem.copy_from_slice(&w[..n]);
            }
            j += words as u64;
            rest = tail;
        }
    });
}

/// The first byte that differs from the pattern.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mismatch {
    /// Byte offset in the buffer.
    pub offset: u64,
    pub expected: u8,
    pub actual: u8,
    /// How many bytes differ in total.
    pub count: u64,
}

impl std::fmt::Display for Mismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} byte(s) wrong; first at offset {} (expected 0x{:02x}, got 0x{:02x})",
            self.count, self.offset, self.expected, self.actual
        )
    }
}

/// Compares `buf` with pattern (`seed`, `variant`); `None` when every byte matches.
pub fn verify(buf: &[u8], seed: u64, variant: u64) -> Option<Mismatch> {
    verify_at(buf, 0, seed, variant)
}

/// Compares `buf` with bytes `start..start+buf.len()` of pattern (`seed`,
/// `variant`), as [`fill_at`] writes them (`start` a multiple of 8); a
/// mismatch's offset is the pattern's (`start` + the index in `buf`).
pub fn verify_at(buf: &[u8], start: u64, seed: u64, variant: u64) -> Option<Mismatch> {
    const CHUNK: usize = 1 << 20;
    let mut expect = vec![0u8; CHUNK.min(buf.len())];
    let mut first: Option<Mismatch> = None;
    let mut count = 0u64;
    for (ci, chunk) in buf.chunks(CHUNK).enumerate() {
        let start = start + (ci * CHUNK) as u64;
        let e = &mut expect[..chunk.len()];
        fill_at(e, start, seed, variant);
        if e != chunk {
            for (i, (&a, &x)) in chunk.iter().zip(e.iter()).enumerate() {
                if a != x {
                    count += 1;
                    first.get_or_insert(Mismatch {
                        offset: start + i as u64,
                        expected: x,
                        actual: a,
                        count: 0,
                    });
                }
            }
        }
    }
    first.map(|m| Mismatch { count, ..m })
}

/// Sum of all bytes, the checksum upstream's `simple_write` prints.
pub fn byte_sum(buf: &[u8]) -> u64 {
    buf.iter().map(|&b| b as u64).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_agree_with_whole() {
        let mut whole = vec![0u8; 1000];
        fill(&mut whole, 7, 1);
        let mut piece = vec![0u8; 1000 - 96];
        fill_at(&mut piece, 96, 7, 1);
        assert_eq!(&whole[96..], &piece[..]);
    }

    #[test]
    fn a_piece_verifies_where_it_sits_in_the_pattern() {
        let mut whole = vec![0u8; 3 << 20];
        fill(&mut whole, 7, 1);
        let (start, len) = (1 << 20 | 256, 5000);
        let piece = &whole[start..start + len];
        assert_eq!(verify_at(piece, start as u64, 7, 1), None);
        assert!(
            verify_at(piece, 0, 7, 1).is_some(),
            "the piece is not the pattern's start"
        );
        assert!(
            verify_at(piece, start as u64, 7, 0).is_some(),
            "another variant"
        );
        let mut bad = piece.to_vec();
        bad[10] ^= 1;
        let m = verify_at(&bad, start as u64, 7, 1).unwrap();
        assert_eq!((m.offset, m.count), (start as u64 + 10, 1));
    }

    #[test]
    fn detects_shift_staleness_and_single_bytes() {
        let mut buf = vec![0u8; 4096 + 5];
        fill(&mut buf, 1, 0);
        assert_eq!(verify(&buf, 1, 0), None);
        assert!(
            verify(&buf, 1, 1).is_some(),
            "other variant (stale iteration) must fail"
        );
        assert!(
            verify(&buf, 2, 0).is_some(),
            "other seed (foreign run) must fail"
        );
        let mut shifted = buf.clone();
        shifted.rotate_right(1);
        assert!(verify(&shifted, 1, 0).is_some());
        buf[4099] ^= 0x10;
        let m = verify(&buf, 1, 0).unwrap();
        assert_eq!((m.offset, m.count), (4099, 1));
    }
}
