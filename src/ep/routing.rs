//! Which experts each token goes to, and with what gate weight.
//!
//! In a model the router computes this; here it is drawn from a seed, per
//! rank, so that every rank can recompute every other rank's routing and
//! therefore knows exactly what it should receive.

use super::config::{RoutingKind, Shape};
use super::rng::{SplitMix64, mix64};

/// Salt that separates routing draws from the activation hashes.
const ROUTING_SALT: u64 = 0x524f_5554_494e_4721; // "ROUTING!"

/// One rank's routing: for token `t`, `experts[t*topk..][..topk]` are its
/// distinct global expert ids (in draw order, as a router's top-k) and
/// `weights[..]` the matching gate weights, each in (0, 1] and exactly
/// representable (k/256), not normalised: the check does not need it.
#[derive(Clone, Debug, PartialEq)]
pub struct Routing {
    pub rank: u32,
    pub tokens: u32,
    pub topk: u32,
    pub experts: Vec<u32>,
    pub weights: Vec<f32>,
}

impl Routing {
    /// Token `t`'s experts.
    pub fn experts_of(&self, t: u32) -> &[u32] {
        let k = self.topk as usize;
        &self.experts[t as usize * k..][..k]
    }

    /// Token `t`'s gate weights.
    pub fn weights_of(&self, t: u32) -> &[f32] {
        let k = self.topk as usize;
        &self.weights[t as usize * k..][..k]
    }
}

/// Draws rank `rank`'s routing: a pure function of `(seed, rank, shape,
/// kind)`. Each token's experts are drawn without replacement, each draw
/// proportional to the expert's popularity among those not yet taken
/// (uniform: all equal; skewed: 1/(e+1)).
pub fn generate(shape: &Shape, kind: RoutingKind, seed: u64, rank: u32) -> Routing {
    let e = shape.experts as usize;
    let popularity: Vec<f64> = (0..e)
        .map(|i| match kind {
            RoutingKind::Uniform => 1.0,
            RoutingKind::Skewed => 1.0 / (i as f64 + 1.0),
        })
        .collect();
    let total: f64 = popularity.iter().sum();
    let k = shape.topk as usize;
    let mut experts = Vec::with_capacity(shape.tokens as usize * k);
    let mut weights = Vec::with_capacity(shape.tokens as usize * k);
    let mut taken = vec![false; e];
    for t in 0..shape.tokens {
        let mut rng =
            SplitMix64::new(mix64(mix64(seed ^ ROUTING_SALT) ^ u64::from(rank)) ^ u64::from(t));
        let first = experts.len();
        let mut left = total;
        for _ in 0..k {
            let pick = draw(&popularity, &taken, left, rng.next_f64());
            taken[pick] = true;
            left -= popularity[pick];
            experts.push(pick as u32);
            weights.push((1 + rng.next_u64() % 256) as f32 / 256.0);
        }
        for &x in &experts[first..] {
            taken[x as usize] = false;
        }
    }
    Routing {
        rank,
        tokens: shape.tokens,
        topk: shape.topk,
        experts,
        weights,
    }
}

/// One weighted draw among the experts not `taken`; `left` is their total
/// popularity and `u` a uniform number in [0, 1).
fn draw(popularity: &[f64], taken: &[bool], left: f64, u: f64) -> usize {
    let mut target = u * left;
    let mut last = None;
    for (i, (&p, &t)) in popularity.iter().zip(taken).enumerate() {
        if t {
            continue;
        }
        last = Some(i);
        if target < p {
            return i;
        }
        target -= p;
    }
    // Rounding can leave a sliver past the last free expert: take it.
    last.expect("top-k larger than the number of experts")
}

/// Every rank's routing, indexed by rank (each rank needs all of them to
/// know what it will receive).
pub fn generate_all(shape: &Shape, kind: RoutingKind, seed: u64) -> Vec<Routing> {
    (0..shape.ranks)
        .map(|r| generate(shape, kind, seed, r))
        .collect()
}
