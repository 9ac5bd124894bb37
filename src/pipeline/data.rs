//! The data that flows through the chain, on the host: what stage 0
//! produces, what each middle stage does to it, and what the last stage
//! expects (`cuda/pipeline.cu` computes the same on the GPU; the tests here
//! pin the arithmetic).
//!
//! Word `w` (4 bytes, little-endian) of chunk `g` starts as [`word`]`(g, w)`;
//! middle stage `s` maps every word `x` to `3x + s` (wrapping), so the last
//! stage of `n` stages expects `word · 3^(n−2) + Σ s · 3^(n−2−s)`: a chunk
//! that skipped a stage, passed one twice or passed two in the wrong order
//! fails (the maps do not commute); so does a word from another chunk or
//! offset.

/// The step between neighbouring words of a chunk (odd, so no shift of a
/// chunk by fewer than 2³² words maps a word onto another's value).
pub const WORD_STEP: u32 = 0x85EB_CA77;

/// Chunk `g`'s part of its words: a mix of all 64 bits of `g`, a
/// bijection on each half (`pipe_chunk_mix`).
pub fn chunk_mix(g: u64) -> u32 {
    let mut x = (g as u32).wrapping_mul(0x9E37_79B1) ^ ((g >> 32) as u32).wrapping_mul(0xC2B2_AE3D);
    x ^= x >> 15;
    x = x.wrapping_mul(0x2C1B_3C6D);
    x ^= x >> 12;
    x
}

/// Word `w` of chunk `g` as stage 0 produces it (`pipe_word`): the chunk's
/// mix plus `w` steps. A word from another chunk (another lap of a slot)
/// or another offset differs, and checking one costs an add and a compare
/// (the next word is the last plus a step), where a hash of every word
/// cost the last stage a fifth of a 1 MiB link's throughput on an H200.
pub fn word(g: u64, w: u64) -> u32 {
    chunk_mix(g).wrapping_add((w as u32).wrapping_mul(WORD_STEP))
}

/// What stage `stage` writes for the word `input` it received (stage 0
/// receives nothing and produces [`word`]).
pub fn transform(stage: u32, g: u64, w: u64, input: u32) -> u32 {
    match stage {
        0 => word(g, w),
        s => input.wrapping_mul(3).wrapping_add(s),
    }
}

/// The middle stages of `stages` composed, as `(mul, add)`: they map `x`
/// to `x · mul + add` (wrapping), stage 1 first.
pub fn composed(stages: u32) -> (u32, u32) {
    (1..stages.saturating_sub(1)).fold((1u32, 0u32), |(m, a), s| {
        (m.wrapping_mul(3), a.wrapping_mul(3).wrapping_add(s))
    })
}

/// What the last of `stages` stages expects for word `w` of chunk `g`.
pub fn expected(stages: u32, g: u64, w: u64) -> u32 {
    let (m, a) = composed(stages);
    word(g, w).wrapping_mul(m).wrapping_add(a)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A chunk of `words` words through stages `order` (each applies its
    /// transform), as the chain does it.
    fn through(order: &[u32], g: u64, words: u64) -> Vec<u32> {
        let mut v = vec![0u32; words as usize];
        for &s in order {
            for (w, x) in v.iter_mut().enumerate() {
                *x = transform(s, g, w as u64, *x);
            }
        }
        v
    }

    #[test]
    fn every_stage_in_order_gives_what_the_last_expects() {
        for n in 2..=6u32 {
            let order: Vec<u32> = (0..n - 1).collect();
            let got = through(&order, 7, 64);
            for (w, &x) in got.iter().enumerate() {
                assert_eq!(x, expected(n, 7, w as u64), "{n} stages, word {w}");
            }
        }
    }

    #[test]
    fn a_skipped_repeated_or_reordered_stage_or_another_chunk_fails() {
        let wrong = |order: &[u32], n: u32| {
            let v = through(order, 5, 16);
            v.iter()
                .enumerate()
                .all(|(w, &x)| x != expected(n, 5, w as u64))
        };
        assert!(wrong(&[0, 1, 3], 5), "skipped");
        assert!(wrong(&[0, 1, 1, 2], 4), "twice");
        assert!(wrong(&[0, 2, 1], 4), "out of order");
        // Neighbouring chunks and offsets differ in every word tried.
        for w in 0..1000 {
            assert_ne!(word(3, w), word(4, w));
            assert_ne!(word(3, w), word(3, w + 1));
            assert_ne!(word(3, w), word(3 + (1 << 32), w));
        }
    }

    #[test]
    fn a_later_lap_or_a_shifted_slice_differs_in_every_word() {
        // A slot of a ring of S slots holds chunk g, then g + S, g + 2S, ...:
        // a lap read too late (or too early) must fail at every word.
        for slots in [1u64, 2, 3, 8, 16, 31, 64, 1024] {
            for g in [0u64, 1, 977, (1 << 32) - 1] {
                let d = chunk_mix(g + slots).wrapping_sub(chunk_mix(g));
                assert_ne!(d, 0, "chunk {g} and {} share a mix", g + slots);
            }
        }
        // A slice landed k words off (0 < k < 2^32) differs by k steps,
        // never 0 mod 2^32 (the step is odd).
        for k in [1u64, 2, 3, 4, 1 << 16, (1 << 28) + 5, (1 << 32) - 1] {
            assert_ne!(word(9, 100 + k), word(9, 100), "shift {k}");
        }
    }

    #[test]
    fn the_middle_stages_composed() {
        assert_eq!(composed(2), (1, 0));
        assert_eq!(composed(3), (3, 1));
        // (3x + 1) · 3 + 2 = 9x + 5.
        assert_eq!(composed(4), (9, 5));
    }
}
