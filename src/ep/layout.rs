//! Where every token goes and where it lands, and how many bytes that is.
//!
//! Dispatch sends each token once to every rank hosting any of its experts
//! (DeepEP's normal-mode rule). The receiver keeps one region per source
//! rank, `recv_x[src][slot]`, and a source fills its region's slots
//! `0..count` in token order: slot `j` of source `s` on rank `d` holds the
//! `j`-th token of `s` (by index) that has an expert on `d`. The sender
//! knows its slots from its own routing; the receiver learns the count from
//! the completion counter, which arrives after the data.
//!
//! Combine sends expert outputs back along the same pairs: rank `d` writes
//! its contribution for slot `j` of source `s` into `combine_recv[d][j]` on
//! rank `s`, which finds it again through its own send layout.

use serde::{Deserialize, Serialize};

use super::config::Shape;
use super::routing::Routing;

/// One copy a source makes: its token `token` into slot `slot` of its
/// region on rank `dest`. Mirrors `SendEntry` in cuda/ep.cu (3 × u32).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SendEntry {
    pub token: u32,
    pub dest: u32,
    pub slot: u32,
}

/// A source rank's half of the layout.
#[derive(Clone, Debug)]
pub struct SendLayout {
    pub ranks: u32,
    pub tokens: u32,
    /// `[dest][token]`: the slot of token `t` on rank `dest`, or −1 when
    /// none of its experts lives there.
    pub slot: Vec<i32>,
    /// Tokens sent to each rank (local share included).
    pub count: Vec<u32>,
    /// Every copy, by token, then by destination rank: consecutive entries
    /// alternate destinations, so local and remote copies interleave.
    pub entries: Vec<SendEntry>,
}

impl SendLayout {
    /// The slot of token `t` on rank `dest`, if it goes there.
    pub fn slot_of(&self, dest: u32, t: u32) -> Option<u32> {
        let s = self.slot[(dest * self.tokens + t) as usize];
        (s >= 0).then_some(s as u32)
    }
}

/// Computes `routing`'s send layout.
pub fn send_layout(shape: &Shape, routing: &Routing) -> SendLayout {
    let (n, t) = (shape.ranks, shape.tokens);
    let mut slot = vec![-1i32; (n * t) as usize];
    let mut count = vec![0u32; n as usize];
    let mut entries = Vec::new();
    let mut dests = vec![false; n as usize];
    for tok in 0..t {
        dests.iter_mut().for_each(|d| *d = false);
        for &e in routing.experts_of(tok) {
            dests[shape.rank_of(e) as usize] = true;
        }
        for d in 0..n {
            if dests[d as usize] {
                let s = count[d as usize];
                slot[(d * t + tok) as usize] = s as i32;
                count[d as usize] += 1;
                entries.push(SendEntry {
                    token: tok,
                    dest: d,
                    slot: s,
                });
            }
        }
    }
    SendLayout {
        ranks: n,
        tokens: t,
        slot,
        count,
        entries,
    }
}

/// A receiving rank's half: what each source puts where.
#[derive(Clone, Debug)]
pub struct RecvLayout {
    /// `[src][slot]`: the source's token index held in that slot.
    pub tokens_from: Vec<Vec<u32>>,
    /// `[local expert][src]`: (token, top-k slot) pairs from `src` routed
    /// to that local expert — DeepEP's low-latency receive counts.
    pub expert_hits: Vec<Vec<u32>>,
}

impl RecvLayout {
    /// Tokens arriving from `src`.
    pub fn count(&self, src: u32) -> u32 {
        self.tokens_from[src as usize].len() as u32
    }
}

/// Computes what rank `me` receives, from every rank's routing.
pub fn recv_layout(shape: &Shape, all: &[Routing], me: u32) -> RecvLayout {
    let local = shape.local_experts();
    let first = me * local;
    let mut tokens_from = vec![Vec::new(); shape.ranks as usize];
    let mut expert_hits = vec![vec![0u32; shape.ranks as usize]; local as usize];
    for (src, r) in all.iter().enumerate() {
        for t in 0..r.tokens {
            let mut mine = false;
            for &e in r.experts_of(t) {
                if (first..first + local).contains(&e) {
                    mine = true;
                    expert_hits[(e - first) as usize][src] += 1;
                }
            }
            if mine {
                tokens_from[src].push(t);
            }
        }
    }
    RecvLayout {
        tokens_from,
        expert_hits,
    }
}

/// Bytes one rank receives in one phase, counted four ways.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PhaseBytes {
    /// As DeepEP counts bandwidth: activation bytes received (2·hidden per
    /// token copy), the local share included, metadata excluded.
    pub deepep: u64,
    /// What crosses the wire into this rank: copies from other ranks only,
    /// activations plus metadata.
    pub wire: u64,
    /// Metadata bytes received (local share included), sent beside the
    /// activations as their own small copies.
    pub meta: u64,
    /// What DeepEP's low-latency kernels would move for the same routing:
    /// one activation copy per (token, expert) pair instead of one per
    /// (token, rank).
    pub per_expert: u64,
}

/// Rank `me`'s dispatch bytes (it receives the tokens routed to it).
pub fn dispatch_bytes(shape: &Shape, recv: &RecvLayout, me: u32) -> PhaseBytes {
    let (row, meta) = (shape.token_bytes(), shape.meta_bytes());
    let mut b = PhaseBytes::default();
    for src in 0..shape.ranks {
        let c = u64::from(recv.count(src));
        b.deepep += c * row;
        b.meta += c * meta;
        if src != me {
            b.wire += c * (row + meta);
        }
    }
    b.per_expert = recv
        .expert_hits
        .iter()
        .flatten()
        .map(|&c| u64::from(c))
        .sum::<u64>()
        * row;
    b
}

/// Rank `me`'s combine bytes (it receives one contribution per rank its
/// tokens went to).
pub fn combine_bytes(shape: &Shape, send: &SendLayout, me: u32) -> PhaseBytes {
    let row = shape.token_bytes();
    let mut b = PhaseBytes::default();
    for d in 0..shape.ranks {
        let c = u64::from(send.count[d as usize]);
        b.deepep += c * row;
        if d != me {
            b.wire += c * row;
        }
    }
    b.per_expert = u64::from(shape.tokens) * u64::from(shape.topk) * row;
    b
}

/// Bytes to send to and receive from each rank in one phase, for the NCCL
/// all-to-all that moves the same bytes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PairBytes {
    pub send: Vec<u64>,
    pub recv: Vec<u64>,
}

/// Per-peer bytes of dispatch (activations + metadata, as the kernels move
/// them) and of combine (activations), local pair included.
pub fn pair_bytes(shape: &Shape, send: &SendLayout, recv: &RecvLayout) -> (PairBytes, PairBytes) {
    let (row, meta) = (shape.token_bytes(), shape.meta_bytes());
    let sent = |r: u32| u64::from(send.count[r as usize]);
    let got = |r: u32| u64::from(recv.count(r));
    let ranks = 0..shape.ranks;
    let dispatch = PairBytes {
        send: ranks.clone().map(|r| sent(r) * (row + meta)).collect(),
        recv: ranks.clone().map(|r| got(r) * (row + meta)).collect(),
    };
    let combine = PairBytes {
        send: ranks.clone().map(|r| got(r) * row).collect(),
        recv: ranks.map(|r| sent(r) * row).collect(),
    };
    (dispatch, combine)
}
