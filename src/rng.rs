//! splitmix64 (Steele, Lea, Flood, "Fast splittable pseudorandom number
//! generators", OOPSLA 2014): the one generator of the crate's seeded draws.
//! `cuda/ep.cu`'s `mix64` is the same function, bit for bit.

/// The splitmix64 output function with its increment (Steele, Lea, Flood,
/// "Fast splittable pseudorandom number generators", OOPSLA 2014): a
/// bijection on u64 whose outputs for consecutive inputs look independent.
pub const fn mix64(z: u64) -> u64 {
    let mut z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A small splitmix64 stream, for the host's draws (an
/// EP run's routing, the launcher's kill moments).
#[derive(Clone, Debug)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A stream starting from `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        // mix64 adds the increment itself: this is splitmix64's next().
        let z = self.0;
        self.0 = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix64(z)
    }

    /// A uniform f64 in [0, 1) with 53 random bits.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}
