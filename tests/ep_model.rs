//! The CPU model of `ep`: routing, the send/receive layout, byte counts,
//! and the combine reference with its bf16 bound, with and without a mask
//! of departed ranks. These are what the GPU kernels are checked against,
//! so they are checked here first.

use nixl_examples::ep::config::{Mode, Path, RoutingKind, RunConfig, Shape, meta_record};
use nixl_examples::ep::layout::{self, SendEntry};
use nixl_examples::ep::mask::Mask;
use nixl_examples::ep::model::Model;
use nixl_examples::ep::reference::{self, CombinedToken, Mismatch};
use nixl_examples::ep::rng::{self, bf16_to_f32};
use nixl_examples::ep::routing::{self, Routing};

fn shape(tokens: u32, topk: u32, experts: u32, ranks: u32) -> Shape {
    Shape {
        tokens,
        hidden: 64,
        topk,
        experts,
        ranks,
    }
}

#[test]
fn hashes_match_the_values_pinned_for_the_cuda_side() {
    // cuda/ep_common.cuh implements the same functions; these values (from
    // an independent Python implementation) pin both.
    assert_eq!(rng::mix64(0), 0xe220a8397b1dcdaf);
    assert_eq!(rng::token_key(1, 0, 0, 0), 0xb18a02f46d8d86c3);
    assert_eq!(rng::x_bits(rng::token_key(1, 0, 0, 0), 0), 0x3dd6);
}

#[test]
fn top_k_experts_are_distinct_in_range_and_deterministic_per_seed() {
    let s = shape(500, 8, 64, 4);
    for kind in [RoutingKind::Uniform, RoutingKind::Skewed] {
        let a = routing::generate(&s, kind, 42, 1);
        assert_eq!(
            a,
            routing::generate(&s, kind, 42, 1),
            "{kind:?} not deterministic"
        );
        assert_ne!(
            a,
            routing::generate(&s, kind, 43, 1),
            "{kind:?} ignores the seed"
        );
        assert_ne!(
            a,
            routing::generate(&s, kind, 42, 2),
            "{kind:?} ignores the rank"
        );
        for t in 0..s.tokens {
            let mut e = a.experts_of(t).to_vec();
            assert!(e.iter().all(|&x| x < s.experts));
            e.sort();
            e.dedup();
            assert_eq!(e.len(), 8, "token {t}: {:?}", a.experts_of(t));
            assert!(a.weights_of(t).iter().all(|&w| w > 0.0 && w <= 1.0));
        }
    }
    // Every expert can be drawn even when a token takes them all.
    let all = routing::generate(&shape(3, 16, 16, 2), RoutingKind::Skewed, 1, 0);
    let mut e = all.experts_of(0).to_vec();
    e.sort();
    assert_eq!(e, (0..16).collect::<Vec<_>>());
}

fn expert_load(r: &Routing, experts: u32) -> Vec<f64> {
    let mut load = vec![0f64; experts as usize];
    r.experts.iter().for_each(|&e| load[e as usize] += 1.0);
    load
}

#[test]
fn uniform_spreads_load_and_skewed_concentrates_it() {
    let s = shape(8192, 8, 256, 2);
    let n = f64::from(s.tokens * s.topk) / 256.0; // expected picks per expert
    let uniform = expert_load(&routing::generate(&s, RoutingKind::Uniform, 7, 0), 256);
    // Each expert: 256 expected picks, standard deviation ≈ 16; allow 6σ.
    for (e, &c) in uniform.iter().enumerate() {
        assert!(
            (c - n).abs() < 6.0 * n.sqrt(),
            "expert {e}: {c} picks, expected ≈ {n}"
        );
    }
    let skewed = expert_load(&routing::generate(&s, RoutingKind::Skewed, 7, 0), 256);
    assert!(
        skewed[0] > 3.0 * n,
        "hottest expert only {} picks",
        skewed[0]
    );
    assert!(skewed[0] > skewed[255] * 5.0);
    let rank0: f64 = skewed[..128].iter().sum();
    assert!(
        rank0 > 0.6 * f64::from(s.tokens * s.topk),
        "rank 0 gets {rank0}"
    );
}

#[test]
fn every_token_goes_once_to_each_rank_hosting_one_of_its_experts() {
    let s = shape(300, 6, 24, 3);
    let all = routing::generate_all(&s, RoutingKind::Skewed, 5);
    for (src, r) in all.iter().enumerate() {
        let send = layout::send_layout(&s, r);
        // Destinations of each token = ranks of its experts; each copy once.
        for t in 0..s.tokens {
            let mut want: Vec<u32> = r.experts_of(t).iter().map(|&e| s.rank_of(e)).collect();
            want.sort();
            want.dedup();
            let got: Vec<u32> = send
                .entries
                .iter()
                .filter(|e| e.token == t)
                .map(|e| e.dest)
                .collect();
            assert_eq!(got, want, "source {src} token {t}");
        }
        // Slots on each destination are 0..count in token order.
        for d in 0..s.ranks {
            let slots: Vec<u32> = (0..s.tokens).filter_map(|t| send.slot_of(d, t)).collect();
            assert_eq!(slots, (0..send.count[d as usize]).collect::<Vec<_>>());
        }
        // The receiver's view agrees with the sender's, slot by slot.
        for d in 0..s.ranks {
            let recv = layout::recv_layout(&s, &all, d);
            let from_src = &recv.tokens_from[src];
            assert_eq!(from_src.len() as u32, send.count[d as usize]);
            for (j, &t) in from_src.iter().enumerate() {
                assert!(send.entries.contains(&SendEntry {
                    token: t,
                    dest: d,
                    slot: j as u32
                }));
            }
        }
    }
}

#[test]
fn per_expert_counts_and_bytes_add_up() {
    let s = shape(200, 4, 16, 2);
    let all = routing::generate_all(&s, RoutingKind::Uniform, 9);
    let mut pairs_total = 0u64;
    for me in 0..s.ranks {
        let recv = layout::recv_layout(&s, &all, me);
        let send = layout::send_layout(&s, &all[me as usize]);
        // Per (local expert, source): the (token, k) pairs routed there.
        for (l, per_src) in recv.expert_hits.iter().enumerate() {
            for (src, &c) in per_src.iter().enumerate() {
                let e = me * s.local_experts() + l as u32;
                let want = all[src].experts.iter().filter(|&&x| x == e).count() as u32;
                assert_eq!(c, want, "expert {e} from {src}");
                pairs_total += u64::from(c);
            }
        }
        let d = layout::dispatch_bytes(&s, &recv, me);
        let recv_tokens: u64 = (0..s.ranks).map(|r| u64::from(recv.count(r))).sum();
        assert_eq!(d.deepep, recv_tokens * 128);
        let remote: u64 = (0..s.ranks)
            .filter(|&r| r != me)
            .map(|r| u64::from(recv.count(r)))
            .sum();
        assert_eq!(d.wire, remote * (128 + s.meta_bytes()));
        assert!(d.per_expert >= d.deepep);
        let c = layout::combine_bytes(&s, &send, me);
        assert_eq!(c.deepep, send.entries.len() as u64 * 128);
        let (pd, pc) = layout::pair_bytes(&s, &send, &recv);
        assert_eq!(pd.recv.iter().sum::<u64>(), d.deepep + d.meta);
        assert_eq!(pc.recv.iter().sum::<u64>(), c.deepep);
    }
    assert_eq!(pairs_total, u64::from(s.ranks * s.tokens * s.topk));
}

#[test]
fn metadata_records_are_aligned_and_carry_the_routing() {
    let s = shape(4, 3, 12, 2);
    let rec = meta_record(&s, 1, 2, &[5, 7, 11], &[0.5, 0.25, 1.0]);
    assert_eq!(rec.len() as u64, s.meta_bytes());
    assert_eq!(rec.len() % 16, 0);
    assert_eq!(&rec[..8], &[2, 0, 0, 0, 1, 0, 0, 0]);
    assert_eq!(u32::from_le_bytes(rec[20..24].try_into().unwrap()), 7);
    assert_eq!(f32::from_le_bytes(rec[28..32].try_into().unwrap()), 0.5);
}

/// Runs the pipeline for every element of every token, on the CPU, as the
/// GPUs do it, and hands each token to `check`.
fn each_combined_token(
    s: &Shape,
    seed: u64,
    mut check: impl FnMut(&[f32], &Routing, u32, &[Vec<u16>], &[u16]),
) {
    let r = routing::generate(s, RoutingKind::Uniform, seed, 0);
    for t in 0..s.tokens {
        let key = rng::token_key(seed, 0, 3, t);
        let x: Vec<f32> = (0..s.hidden)
            .map(|h| bf16_to_f32(rng::x_bits(key, h)))
            .collect();
        let mut parts = vec![Vec::new(); s.ranks as usize];
        let mut out = Vec::new();
        for &xv in &x {
            let (p, o) = reference::pipeline(s, xv, r.experts_of(t), r.weights_of(t));
            for (rank, y) in p.into_iter().enumerate() {
                if let Some(y) = y {
                    parts[rank].push(y);
                }
            }
            out.push(o);
        }
        check(&x, &r, t, &parts, &out);
    }
}

#[test]
fn the_bf16_bound_holds_for_random_tokens_against_exact_arithmetic() {
    let s = Shape {
        tokens: 64,
        hidden: 256,
        topk: 8,
        experts: 64,
        ranks: 4,
    };
    let mut worst = 0f64;
    each_combined_token(&s, 11, |x, r, t, parts, out| {
        let (e, w) = (r.experts_of(t), r.weights_of(t));
        for (h, &xv) in x.iter().enumerate() {
            let exact: f64 = e
                .iter()
                .zip(w)
                .map(|(&e, &w)| {
                    f64::from(w)
                        * (f64::from(reference::expert_scale(e)) * f64::from(xv)
                            + f64::from(reference::expert_bias(e)))
                })
                .sum();
            let (_, abs) = reference::weighted(xv, e, w, |_| true);
            let err = (f64::from(bf16_to_f32(out[h])) - exact).abs();
            let bound = f64::from(reference::combined_bound(abs, s.topk, s.ranks));
            assert!(err <= bound, "token {t} h {h}: error {err} > bound {bound}");
            worst = worst.max(err / f64::from(abs));
        }
        let contributions: Vec<Option<&[u16]>> = parts
            .iter()
            .map(|p| (!p.is_empty()).then_some(p.as_slice()))
            .collect();
        let c = CombinedToken {
            token: t,
            x,
            experts: e,
            weights: w,
            contributions: &contributions,
            out,
        };
        reference::check_combined(&s, 0, &c).unwrap();
    });
    // The bound is tight to a factor of a few, not vacuous: errors reach
    // a good part of 2^-8 relative to the magnitude of the terms.
    assert!(worst > 2f64.powi(-10), "worst relative error only {worst}");
}

#[test]
fn a_perturbed_value_is_caught_and_named() {
    let s = shape(16, 4, 16, 2);
    each_combined_token(&s, 3, |x, r, t, parts, out| {
        if t != 5 {
            return;
        }
        let (e, w) = (r.experts_of(t), r.weights_of(t));
        let from = (0..2).find(|&i| !parts[i].is_empty()).unwrap();
        // One contribution off by 4 ulps of bf16 at h = 9.
        let mut bad = parts.to_vec();
        bad[from][9] = bad[from][9].wrapping_add(4);
        let contributions: Vec<Option<&[u16]>> = bad
            .iter()
            .map(|p| (!p.is_empty()).then_some(p.as_slice()))
            .collect();
        let c = CombinedToken {
            token: t,
            x,
            experts: e,
            weights: w,
            contributions: &contributions,
            out,
        };
        let err = reference::check_combined(&s, 1, &c).unwrap_err();
        let Mismatch::Contribution {
            rank,
            from_rank,
            token,
            experts,
            h,
            ..
        } = &err
        else {
            panic!("{err:?}");
        };
        assert_eq!((*rank, *from_rank as usize, *token, *h), (1, from, 5, 9));
        assert!(experts.iter().all(|&x| s.rank_of(x) == from as u32) && !experts.is_empty());
        let text = err.to_string();
        assert!(
            text.contains("token 5")
                && text.contains("rank 1")
                && text.contains(&format!("{:?}", experts)),
            "{text}"
        );

        // The output off by 4 ulps while the contributions are right.
        let good: Vec<Option<&[u16]>> = parts
            .iter()
            .map(|p| (!p.is_empty()).then_some(p.as_slice()))
            .collect();
        let mut out2 = out.to_vec();
        out2[3] = out2[3].wrapping_add(4);
        let c = CombinedToken {
            token: t,
            x,
            experts: e,
            weights: w,
            contributions: &good,
            out: &out2,
        };
        let err = reference::check_combined(&s, 1, &c).unwrap_err();
        assert!(
            matches!(err, Mismatch::Combined { token: 5, h: 3, .. }),
            "{err:?}"
        );
        assert!(err.to_string().contains("experts"), "{err}");
    });
}

// ------------------------------------------------------------ under a mask

/// Runs the masked pipeline for every element of every token of rank 0 and
/// hands each token to `check` with its exact (f64) masked reference.
fn each_masked_token(
    s: &Shape,
    seed: u64,
    mask: Mask,
    mut check: impl FnMut(&[f32], &Routing, u32, &[Vec<u16>], &[u16], &[f64]),
) {
    let r = routing::generate(s, RoutingKind::Uniform, seed, 0);
    for t in 0..s.tokens {
        let key = rng::token_key(seed, 0, 3, t);
        let x: Vec<f32> = (0..s.hidden)
            .map(|h| bf16_to_f32(rng::x_bits(key, h)))
            .collect();
        let (e, w) = (r.experts_of(t), r.weights_of(t));
        let mut parts = vec![Vec::new(); s.ranks as usize];
        let (mut out, mut exact) = (Vec::new(), Vec::new());
        for &xv in &x {
            let (p, o) = reference::pipeline_masked(s, xv, e, w, mask);
            for (rank, y) in p.into_iter().enumerate() {
                if let Some(y) = y {
                    parts[rank].push(y);
                }
            }
            out.push(o);
            exact.push(
                e.iter()
                    .zip(w)
                    .filter(|&(&e, _)| !mask.contains(s.rank_of(e)))
                    .map(|(&e, &w)| {
                        f64::from(w)
                            * (f64::from(reference::expert_scale(e)) * f64::from(xv)
                                + f64::from(reference::expert_bias(e)))
                    })
                    .sum(),
            );
        }
        check(&x, &r, t, &parts, &out, &exact);
    }
}

fn rows(parts: &[Vec<u16>]) -> Vec<Option<&[u16]>> {
    parts
        .iter()
        .map(|p| (!p.is_empty()).then_some(p.as_slice()))
        .collect()
}

#[test]
fn masked_ranks_contribute_nothing_and_the_bound_holds_over_the_kept_terms() {
    let s = Shape {
        tokens: 64,
        hidden: 128,
        topk: 8,
        experts: 64,
        ranks: 4,
    };
    for mask in [Mask::of([1]), Mask::of([2, 3]), Mask::of([1, 2, 3])] {
        let mut differs = 0;
        each_masked_token(&s, 17, mask, |x, r, t, parts, out, exact| {
            let (e, w) = (r.experts_of(t), r.weights_of(t));
            for (r, p) in parts.iter().enumerate() {
                assert!(
                    p.is_empty() || !mask.contains(r as u32),
                    "masked rank {r} contributed"
                );
            }
            for (h, &xv) in x.iter().enumerate() {
                let (_, abs) = reference::masked_reference(&s, xv, e, w, mask);
                let err = (f64::from(bf16_to_f32(out[h])) - exact[h]).abs();
                let bound = f64::from(reference::combined_bound(abs, s.topk, s.ranks));
                assert!(
                    err <= bound,
                    "{mask} token {t} h {h}: error {err} > bound {bound}"
                );
            }
            let contributions = rows(parts);
            let c = CombinedToken {
                token: t,
                x,
                experts: e,
                weights: w,
                contributions: &contributions,
                out,
            };
            reference::check_combined_masked(&s, 0, &c, mask).unwrap();
            // Checked without the mask, a token that lost a term fails.
            if e.iter().any(|&x| mask.contains(s.rank_of(x))) {
                assert!(
                    reference::check_combined(&s, 0, &c).is_err(),
                    "{mask} token {t}"
                );
                differs += 1;
            }
        });
        assert!(
            differs > 0,
            "{mask}: no token had an expert on a masked rank"
        );
    }
}

#[test]
fn a_token_whose_experts_are_all_masked_combines_to_exactly_zero() {
    let s = shape(1, 2, 8, 4);
    // Experts 2 and 3 live on rank 1, which is masked; rank 0 has none.
    let (e, w) = ([2u32, 3], [0.5f32, 0.25]);
    let mask = Mask::of([1]);
    let x = [0.75f32, -0.5];
    let (parts, o) = reference::pipeline_masked(&s, x[0], &e, &w, mask);
    assert!(parts.iter().all(Option::is_none));
    assert_eq!(o, 0);
    assert_eq!(
        reference::masked_reference(&s, x[1], &e, &w, mask),
        (0.0, 0.0)
    );
    let contributions = vec![None; 4];
    let ok = [0u16, 0];
    let c = CombinedToken {
        token: 0,
        x: &x,
        experts: &e,
        weights: &w,
        contributions: &contributions,
        out: &ok,
    };
    reference::check_combined_masked(&s, 0, &c, mask).unwrap();
    // The smallest non-zero output is already wrong (the bound is 0).
    let bad = [0u16, 1];
    let c = CombinedToken { out: &bad, ..c };
    let err = reference::check_combined_masked(&s, 0, &c, mask).unwrap_err();
    assert!(matches!(err, Mismatch::Combined { h: 1, .. }), "{err:?}");
}

#[test]
fn a_wrong_contribution_of_an_unmasked_rank_is_still_caught_under_a_mask() {
    let s = shape(16, 4, 16, 4);
    let mask = Mask::of([3]);
    each_masked_token(&s, 5, mask, |x, r, t, parts, out, _| {
        let Some(from) = (1..3).find(|&i| !parts[i].is_empty()) else {
            return;
        };
        let mut bad = parts.to_vec();
        bad[from][2] = bad[from][2].wrapping_add(4);
        let contributions = rows(&bad);
        let c = CombinedToken {
            token: t,
            x,
            experts: r.experts_of(t),
            weights: r.weights_of(t),
            contributions: &contributions,
            out,
        };
        let err = reference::check_combined_masked(&s, 0, &c, mask).unwrap_err();
        assert!(
            matches!(err, Mismatch::Contribution { from_rank, h: 2, .. } if from_rank as usize == from),
            "{err:?}"
        );
    });
}

fn run_config(shape: Shape) -> RunConfig {
    RunConfig {
        mode: Mode::Ll,
        shape,
        routing: RoutingKind::Skewed,
        paths: vec![Path::Store],
        iters: 1,
        warmup: 0,
        seed: 7,
        timeout_ns: 1_000_000_000,
        fault_timeout_ns: nixl_examples::ep::config::DEFAULT_FAULT_TIMEOUT_NS,
        blocks: None,
        baseline: false,
        combine_senders: None,
        graph: false,
        on_death: nixl_examples::ranks::membership::OnDeath::Fail,
    }
}

#[test]
fn expected_counts_and_expert_hits_leave_out_masked_sources() {
    let s = shape(200, 4, 16, 4);
    let cfg = run_config(s);
    let all = routing::generate_all(&s, cfg.routing, cfg.seed);
    for me in 0..s.ranks {
        let m = Model::new(&cfg, me);
        let mask = Mask::of([(me + 1) % 4, (me + 2) % 4]);
        let counts = m.expected_counts(mask);
        let hits = m.expert_hits(mask);
        for src in 0..s.ranks {
            let want = all[src as usize]
                .experts
                .chunks(s.topk as usize)
                .filter(|e| e.iter().any(|&x| s.rank_of(x) == me))
                .count() as u32;
            let got = counts[src as usize];
            if mask.contains(src) {
                assert_eq!(got, None, "rank {me}: masked source {src} is checked");
            } else {
                assert_eq!(got, Some(want), "rank {me}: tokens from {src}");
            }
        }
        assert_eq!(m.expected_counts(Mask::NONE).iter().flatten().count(), 4);
        for (l, &h) in hits.iter().enumerate() {
            let e = me * s.local_experts() + l as u32;
            let want = (0..s.ranks)
                .filter(|&src| !mask.contains(src))
                .map(|src| {
                    all[src as usize]
                        .experts
                        .iter()
                        .filter(|&&x| x == e)
                        .count() as u32
                })
                .sum::<u32>();
            assert_eq!(h, want, "rank {me} expert {e}");
        }
    }
}
