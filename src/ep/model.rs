//! Everything one rank computes on the host before its GPU run: every
//! rank's routing, its own send and receive layouts, the byte counts, and
//! the tables the kernels read, as the bytes uploaded.

use super::config::{RunConfig, Shape, meta_record};
use super::layout::{self, PairBytes, PhaseBytes, RecvLayout, SendLayout};
use super::mask::Mask;
use super::routing::{self, Routing};

/// One rank's view of the run.
pub struct Model {
    pub shape: Shape,
    pub rank: u32,
    /// Every rank's routing, by rank.
    pub routing: Vec<Routing>,
    pub send: SendLayout,
    pub recv: RecvLayout,
    pub dispatch_bytes: PhaseBytes,
    pub combine_bytes: PhaseBytes,
    /// Per-peer bytes of dispatch and combine, for the NCCL baseline.
    pub pairs: (PairBytes, PairBytes),
}

impl Model {
    pub fn new(cfg: &RunConfig, rank: u32) -> Self {
        let shape = cfg.shape;
        let routing = routing::generate_all(&shape, cfg.routing, cfg.seed);
        let send = layout::send_layout(&shape, &routing[rank as usize]);
        let recv = layout::recv_layout(&shape, &routing, rank);
        Self {
            dispatch_bytes: layout::dispatch_bytes(&shape, &recv, rank),
            combine_bytes: layout::combine_bytes(&shape, &send, rank),
            pairs: layout::pair_bytes(&shape, &send, &recv),
            shape,
            rank,
            routing,
            send,
            recv,
        }
    }

    /// `[n_entries]` × (token, dest, slot) u32.
    pub fn entries_bytes(&self) -> Vec<u8> {
        self.send
            .entries
            .iter()
            .flat_map(|e| [e.token, e.dest, e.slot])
            .flat_map(u32::to_le_bytes)
            .collect()
    }

    /// `[ranks][tokens]` i32 slots.
    pub fn send_slot_bytes(&self) -> Vec<u8> {
        self.send
            .slot
            .iter()
            .flat_map(|s| s.to_le_bytes())
            .collect()
    }

    /// `[ranks][tokens]` u32: source token per (source, slot), zero padded.
    pub fn expect_tokens_bytes(&self) -> Vec<u8> {
        let t = self.shape.tokens as usize;
        let mut out = vec![0u32; self.shape.ranks as usize * t];
        for (s, toks) in self.recv.tokens_from.iter().enumerate() {
            out[s * t..s * t + toks.len()].copy_from_slice(toks);
        }
        out.into_iter().flat_map(u32::to_le_bytes).collect()
    }

    /// `[ranks]` u32: tokens expected from each source.
    pub fn expect_count_bytes(&self) -> Vec<u8> {
        (0..self.shape.ranks)
            .flat_map(|s| self.recv.count(s).to_le_bytes())
            .collect()
    }

    /// Tokens expected from each source under `mask` (the mask after the
    /// step), as `ep_verify_dispatch` checks them: `None` for a masked
    /// source (not checked: it sent nothing, or not all of it).
    pub fn expected_counts(&self, mask: Mask) -> Vec<Option<u32>> {
        (0..self.shape.ranks)
            .map(|s| (!mask.contains(s)).then(|| self.recv.count(s)))
            .collect()
    }

    /// Per local expert of this rank: the (token, k) pairs routed to it
    /// from unmasked sources (DeepEP low-latency's per-expert counts; what
    /// NIXL EP's elastic test checks).
    pub fn expert_hits(&self, mask: Mask) -> Vec<u32> {
        self.recv
            .expert_hits
            .iter()
            .map(|per_src| {
                per_src
                    .iter()
                    .enumerate()
                    .filter(|&(s, _)| !mask.contains(s as u32))
                    .map(|(_, &c)| c)
                    .sum()
            })
            .collect()
    }

    /// `[ranks][tokens][topk]` u32 expert ids and f32 weights of every rank.
    pub fn routing_bytes(&self) -> (Vec<u8>, Vec<u8>) {
        let experts = self
            .routing
            .iter()
            .flat_map(|r| &r.experts)
            .flat_map(|e| e.to_le_bytes())
            .collect();
        let weights = self
            .routing
            .iter()
            .flat_map(|r| &r.weights)
            .flat_map(|w| w.to_le_bytes())
            .collect();
        (experts, weights)
    }

    /// This rank's `[tokens][meta]` metadata records.
    pub fn meta_bytes(&self) -> Vec<u8> {
        let r = &self.routing[self.rank as usize];
        (0..self.shape.tokens)
            .flat_map(|t| meta_record(&self.shape, self.rank, t, r.experts_of(t), r.weights_of(t)))
            .collect()
    }

    /// Bytes of device memory outside the window: tables, state, output.
    pub fn side_bytes(&self) -> u64 {
        let (n, t, k) = (
            u64::from(self.shape.ranks),
            u64::from(self.shape.tokens),
            u64::from(self.shape.topk),
        );
        12 * self.send.entries.len() as u64
            + 4 * n * t * 2
            + 8 * n * t * k
            + t * self.shape.token_bytes()
            + (1 << 20)
    }
}
