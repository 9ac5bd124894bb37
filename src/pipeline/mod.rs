//! A streaming pipeline the GPUs drive themselves: N ranks form a chain
//! 0 → 1 → … → N−1; stage 0's kernel produces chunks, every middle stage's
//! kernel transforms and forwards each one as soon as it lands, the last
//! stage's kernel verifies every byte. Per link a ring of slots in the
//! receiver's memory, a ready word per slot that the sender raises after
//! the data, and credits the receiver returns into the sender's memory, so
//! a slow stage holds its producer back and nothing is ever overwritten.
//! The `pipeline` program's library; docs/PIPELINE.md explains the
//! design.
//!
//! The modules, bottom up:
//!
//! - [`ring`], [`data`]: the ring arithmetic (window layout, slots,
//!   sequence numbers, credits, slices) and the data (pattern, transform,
//!   what the last stage expects), each as the kernels compute it;
//! - [`kernels`]: `cuda/pipeline.cu`'s structs and its launcher;
//! - [`config`]: the cases and what cannot work (exit 2);
//! - [`run`]: one rank's run on the ranks layer ([`crate::ranks`]);
//! - [`nccl`]: the same-run baseline, NCCL's send/recv through the chain;
//! - [`report`]: rows, the table, JSON and CSV.

/// `pipeline` as the ranks layer names it: keys under `nixl_pipe/`,
/// `[pipeline]` lines, agents `pipeline-rank-<r>.0`.
pub const PROGRAM: crate::ranks::Program = crate::ranks::Program {
    name: "pipeline",
    namespace: "nixl_pipe",
};

pub mod config;
pub mod data;
pub mod kernels;
pub mod nccl;
pub mod report;
pub mod ring;
pub mod run;
