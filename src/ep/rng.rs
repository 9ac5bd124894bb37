//! Deterministic numbers shared by the host and the GPU.
//!
//! Every value the benchmark sends is a pure function of `(seed, rank,
//! iteration, token, h)`, so a receiver regenerates what it should have
//! received and compares bit for bit, and the origin recomputes the expected
//! combine output without any data travelling for the check. `cuda/ep.cu`
//! implements the same functions (`mix64`, `token_key`, `x_bits`); the
//! constants here and there must stay equal (`tests/ep_model.rs` pins a few
//! values so a change on one side only is caught by review of both).

pub use crate::rng::{SplitMix64, mix64};

/// The key of one token's activations: distinct for every
/// `(src_rank, iteration, token)` under one seed (iteration and token each
/// fit 32 bits, so the last word is injective).
pub const fn token_key(seed: u64, src_rank: u32, iteration: u32, token: u32) -> u64 {
    mix64(mix64(mix64(seed) ^ src_rank as u64) ^ ((iteration as u64) << 32 | token as u64))
}

/// Element `h` of a token's activations, as bf16 bits. Always a normal
/// number with magnitude in [2⁻⁶, 1): sign, exponent 121..=126 and seven
/// mantissa bits straight from the hash, so no float rounding is involved
/// and the host and the GPU agree bit for bit.
pub const fn x_bits(key: u64, h: u32) -> u16 {
    let r = mix64(key.wrapping_add(h as u64));
    let mantissa = (r & 0x7f) as u16;
    let exponent = 121 + (((r >> 7) & 7) % 6) as u16;
    let sign = ((r >> 12) & 1) as u16;
    sign << 15 | exponent << 7 | mantissa
}

/// bf16 bits → f32 (exact: bf16 is the top half of an f32).
pub fn bf16_to_f32(b: u16) -> f32 {
    f32::from_bits((b as u32) << 16)
}

/// f32 → bf16 bits, rounding to nearest even, as CUDA's
/// `__float2bfloat16_rn` does (NaN stays NaN, overflow goes to infinity).
pub fn f32_to_bf16(f: f32) -> u16 {
    let b = f.to_bits();
    if f.is_nan() {
        return ((b >> 16) | 0x40) as u16;
    }
    let round = 0x7fff + ((b >> 16) & 1);
    (b.wrapping_add(round) >> 16) as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_rounds_to_nearest_even() {
        assert_eq!(f32_to_bf16(1.0), 0x3f80);
        // 1 + 2^-8 is exactly half way between 1 and 1 + 2^-7: ties to even (1).
        assert_eq!(f32_to_bf16(1.0 + 1.0 / 256.0), 0x3f80);
        // 1 + 3·2^-8 is half way between 1 + 2^-7 (odd) and 1 + 2^-6: up.
        assert_eq!(f32_to_bf16(1.0 + 3.0 / 256.0), 0x3f82);
        assert_eq!(f32_to_bf16(f32::INFINITY), 0x7f80);
        assert_eq!(f32_to_bf16(f32::MAX), 0x7f80);
        assert!(bf16_to_f32(f32_to_bf16(f32::NAN)).is_nan());
        for b in [0x3f80u16, 0xbf80, 0x0001, 0x7f7f] {
            assert_eq!(f32_to_bf16(bf16_to_f32(b)), b);
        }
    }

    #[test]
    fn activations_are_normal_and_bounded() {
        let key = token_key(7, 1, 2, 3);
        for h in 0..10_000 {
            let v = bf16_to_f32(x_bits(key, h)).abs();
            assert!((1.0 / 64.0..1.0).contains(&v), "h {h}: {v}");
        }
    }
}
