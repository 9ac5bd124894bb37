//! The stand-in experts, the combine reference, and the bound the combined
//! output must meet.
//!
//! Expert `e` is the affine map `x ↦ a_e·x + b_e` with `a_e`, `b_e` exact
//! in f32 ([`expert_scale`], [`expert_bias`]): cheap, different per expert,
//! so an output that went to or came from the wrong expert shows. A rank
//! hosting some of a token's experts returns their gate-weighted sum,
//! computed in f32 and stored as bf16; the origin adds the contributions of
//! all ranks in f32 and stores bf16 (DeepEP normal-mode semantics: the
//! expert side weights, the origin sums).
//!
//! ## The bound
//!
//! With `u = 2⁻²⁴` (f32) and bf16's unit roundoff `2⁻⁸`, and
//! `S = Σₖ |wₖ·(aₖ·x + bₖ)|` over the token's experts (`S_r` over those on
//! rank `r`):
//!
//! - a contribution `y_r` is an f32 fused-multiply-add chain (error at most
//!   `(K+1)·u·S_r`) rounded once to bf16 (at most `2⁻⁸·|value|`); the
//!   checker's own f32 reference carries another `(K+1)·u·S_r`, so
//!   `|y_r − ref_r| ≤ S_r·(2⁻⁸ + (2K+8)·u)` ([`partial_bound`]);
//! - the output adds the `N` contributions in f32 and rounds once more:
//!   `|out − ref| ≤ S·(2⁻⁷ + 2⁻¹⁶ + (2K+N+8)·u)` ([`combined_bound`]),
//!   i.e. two bf16 roundings of the magnitude of the terms.
//!
//! The slack constants (`+8`) cover the f32 rounding of `S` itself.
//!
//! ## Under a mask
//!
//! A token's contributions from experts on masked ranks are dropped
//! ([`super::mask`]; docs/EP.md §13): the reference is the sum over the
//! top-k experts whose owner is unmasked (the token's own rank included),
//! 0 when none is left ([`masked_reference`], `ep_masked_reference` in
//! `cuda/ep_common.cuh`). The derivation above holds term by term, so the
//! bound is the same formula over the kept terms: `S` becomes the sum over
//! kept experts and the origin adds at most `N` contributions
//! ([`check_combined_masked`]). With nothing kept `S = 0`: the output must
//! be exactly 0.

use std::fmt;

use super::config::Shape;
use super::mask::Mask;
use super::rng::{bf16_to_f32, f32_to_bf16};

/// `a_e`: 1 + (e mod 16)/32, in [1, 1.47].
pub fn expert_scale(e: u32) -> f32 {
    1.0 + (e % 16) as f32 / 32.0
}

/// `b_e`: ((e mod 7) − 3)/128, in [−3/128, 3/128].
pub fn expert_bias(e: u32) -> f32 {
    ((e % 7) as f32 - 3.0) / 128.0
}

/// Gate-weighted expert output of the experts `keep` selects, for one
/// element `x`: `Σ wₖ·(aₖ·x + bₖ)` as f32 fused multiply-adds in top-k
/// order (what `ep_expert` computes), and `Σ |wₖ·(aₖ·x + bₖ)|` for the
/// bound.
pub fn weighted(
    x: f32,
    experts: &[u32],
    weights: &[f32],
    keep: impl Fn(u32) -> bool,
) -> (f32, f32) {
    let (mut acc, mut abs) = (0.0f32, 0.0f32);
    for (&e, &w) in experts.iter().zip(weights) {
        if keep(e) {
            let t = expert_scale(e).mul_add(x, expert_bias(e));
            acc = w.mul_add(t, acc);
            abs += (w * t).abs();
        }
    }
    (acc, abs)
}

/// The bound on one rank's contribution; see the module docs.
pub fn partial_bound(abs_sum: f32, topk: u32) -> f32 {
    abs_sum * (2f32.powi(-8) + (2 * topk + 8) as f32 * 2f32.powi(-24))
}

/// The bound on the combined output; see the module docs.
pub fn combined_bound(abs_sum: f32, topk: u32, ranks: u32) -> f32 {
    abs_sum * (2f32.powi(-7) + 2f32.powi(-16) + (2 * topk + ranks + 8) as f32 * 2f32.powi(-24))
}

/// The combine reference of one element under `mask`: `weighted` over the
/// experts whose owner rank is not masked, with the sum of the kept terms'
/// magnitudes for [`combined_bound`]. `(0, 0)` when none is kept.
/// `ep_masked_reference` in `cuda/ep_common.cuh` computes the same, bit for
/// bit (`tests/ep_abi.rs`).
pub fn masked_reference(
    shape: &Shape,
    x: f32,
    experts: &[u32],
    weights: &[f32],
    mask: Mask,
) -> (f32, f32) {
    weighted(x, experts, weights, |e| !mask.contains(shape.rank_of(e)))
}

/// What the pipeline produces for one element, step by step as the GPUs
/// do it: each rank's contribution rounded to bf16, the origin's f32 sum
/// over ranks in rank order, rounded to bf16. Returns (contributions by
/// rank — `None` where the token has no expert —, output).
pub fn pipeline(
    shape: &Shape,
    x: f32,
    experts: &[u32],
    weights: &[f32],
) -> (Vec<Option<u16>>, u16) {
    pipeline_masked(shape, x, experts, weights, Mask::NONE)
}

/// [`pipeline`] under `mask`: masked ranks contribute nothing (`None`),
/// the origin adds the others' contributions.
pub fn pipeline_masked(
    shape: &Shape,
    x: f32,
    experts: &[u32],
    weights: &[f32],
    mask: Mask,
) -> (Vec<Option<u16>>, u16) {
    let mut sum = 0.0f32;
    let parts: Vec<Option<u16>> = (0..shape.ranks)
        .map(|r| {
            if mask.contains(r) || !experts.iter().any(|&e| shape.rank_of(e) == r) {
                return None;
            }
            let (p, _) = weighted(x, experts, weights, |e| shape.rank_of(e) == r);
            let y = f32_to_bf16(p);
            sum += bf16_to_f32(y);
            Some(y)
        })
        .collect();
    (parts, f32_to_bf16(sum))
}

/// A value that failed its check, with everything needed to find it.
#[derive(Clone, Debug, PartialEq)]
pub enum Mismatch {
    /// A dispatched token arrived wrong (count, metadata or activations).
    Dispatch {
        /// The receiving rank.
        rank: u32,
        src_rank: u32,
        token: u32,
        slot: u32,
        /// The first of the token's experts hosted by the receiver.
        expert: u32,
        what: String,
    },
    /// One expert rank's contribution to a token, checked at the origin.
    Contribution {
        rank: u32,
        from_rank: u32,
        token: u32,
        experts: Vec<u32>,
        h: u32,
        got: f32,
        reference: f32,
        bound: f32,
    },
    /// The combined output of a token at its origin.
    Combined {
        rank: u32,
        token: u32,
        experts: Vec<u32>,
        h: u32,
        got: f32,
        reference: f32,
        bound: f32,
    },
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Mismatch::Dispatch {
                rank,
                src_rank,
                token,
                slot,
                expert,
                what,
            } => write!(
                f,
                "rank {rank}: token {token} of rank {src_rank} (slot {slot}, for expert {expert}) arrived wrong: {what}"
            ),
            Mismatch::Contribution {
                rank,
                from_rank,
                token,
                experts,
                h,
                got,
                reference,
                bound,
            } => write!(
                f,
                "rank {rank}: the output of rank {from_rank}'s expert(s) {experts:?} for token {token} is {got} at h={h}, \
                 expected {reference} ± {bound:e}"
            ),
            Mismatch::Combined {
                rank,
                token,
                experts,
                h,
                got,
                reference,
                bound,
            } => write!(
                f,
                "rank {rank}: combined output of token {token} (experts {experts:?}) is {got} at h={h}, expected {reference} ± {bound:e}"
            ),
        }
    }
}

/// Whether `got` is within `bound` of `reference`; never for NaN.
fn within(got: f32, reference: f32, bound: f32) -> bool {
    (got - reference).abs() <= bound
}

/// The data of one token at its origin after combine: its activations
/// (as f32), routing, each rank's contribution row (bf16, `None` where the
/// token has no expert) and the output row.
pub struct CombinedToken<'a> {
    pub token: u32,
    pub x: &'a [f32],
    pub experts: &'a [u32],
    pub weights: &'a [f32],
    pub contributions: &'a [Option<&'a [u16]>],
    pub out: &'a [u16],
}

/// Checks one token as `ep_verify_combine` does: every contribution within
/// [`partial_bound`] of its f32 reference (a wrong one names the rank and
/// its experts), then the output within [`combined_bound`].
pub fn check_combined(shape: &Shape, me: u32, c: &CombinedToken) -> Result<(), Mismatch> {
    check_combined_masked(shape, me, c, Mask::NONE)
}

/// [`check_combined`] under `mask` (the mask as it is after the step): the
/// contributions of masked ranks are not checked (they may be partial or
/// absent), the output is checked against [`masked_reference`] with the
/// bound over the kept terms.
pub fn check_combined_masked(
    shape: &Shape,
    me: u32,
    c: &CombinedToken,
    mask: Mask,
) -> Result<(), Mismatch> {
    let on = |r: u32| {
        c.experts
            .iter()
            .copied()
            .filter(move |&e| shape.rank_of(e) == r)
    };
    for (h, &x) in c.x.iter().enumerate() {
        for (r, row) in c.contributions.iter().enumerate() {
            let Some(row) = row else { continue };
            if mask.contains(r as u32) {
                continue;
            }
            let (reference, abs) =
                weighted(x, c.experts, c.weights, |e| shape.rank_of(e) == r as u32);
            let got = bf16_to_f32(row[h]);
            let bound = partial_bound(abs, shape.topk);
            if !within(got, reference, bound) {
                return Err(Mismatch::Contribution {
                    rank: me,
                    from_rank: r as u32,
                    token: c.token,
                    experts: on(r as u32).collect(),
                    h: h as u32,
                    got,
                    reference,
                    bound,
                });
            }
        }
        let (reference, abs) = masked_reference(shape, x, c.experts, c.weights, mask);
        let got = bf16_to_f32(c.out[h]);
        let bound = combined_bound(abs, shape.topk, shape.ranks);
        if !within(got, reference, bound) {
            return Err(Mismatch::Combined {
                rank: me,
                token: c.token,
                experts: c.experts.to_vec(),
                h: h as u32,
                got,
                reference,
                bound,
            });
        }
    }
    Ok(())
}
