//! Expert-parallel (MoE) dispatch and combine between N ranks over NIXL's
//! device API: the `ep` program's library.
//!
//! One MoE step with DeepEP's semantics: each rank holds `tokens` tokens of
//! `hidden` bf16 values, each routed to `topk` of `experts` experts
//! (`experts / ranks` per rank). Dispatch sends each token once to every
//! rank hosting any of its experts; a known per-expert transform stands in
//! for the experts; combine sends the outputs back and sums them at the
//! origin. Counts are signalled after the data, every wait has a GPU-side
//! timeout, and every value is checked. `docs/EP.md` explains the design.
//!
//! The modules, bottom up:
//!
//! - [`config`]: modes, shapes and their limits, the memory window layout,
//!   the launch grid;
//! - [`rng`], [`routing`], [`layout`], [`mask`], [`reference`](mod@reference), [`model`]: the CPU
//!   model — the data and routing every rank can regenerate, where each
//!   token lands, the bytes moved, the set of masked ranks, the combine
//!   reference (with and without a mask) and its bf16 bound, and what one
//!   rank precomputes from them;
//! - [`keys`]: `ep`'s store keys, beside the membership's — the ranks, how
//!   they meet, the membership and the launcher are [`crate::ranks`]';
//! - [`kernels`], [`rig`], [`setup`], [`session`], [`run`]: the GPU
//!   run — the kernels of `cuda/ep.cu`, the
//!   rank's device memory, the setup all ranks follow, its session with the
//!   others (iterations and checks), and the entry that decides GPU, memory
//!   and setup;
//! - [`nccl`]: the same-run NCCL all-to-all baseline;
//! - [`report`]: results as lines, a table (ratios to NCCL and to simple_write's put), JSON and CSV;
//! - [`phase_report`]: an elastic run's per-phase table.

/// `ep` as the ranks layer names it: keys under `nixl_ep/`, `[ep]` lines,
/// agents `ep-rank-<r>.<inc>`.
pub const PROGRAM: crate::ranks::Program = crate::ranks::Program {
    name: "ep",
    namespace: "nixl_ep",
};

pub mod config;
pub mod kernels;
pub mod keys;
pub mod layout;
pub mod mask;
pub mod model;
pub mod nccl;
pub mod phase_report;
pub mod phases;
pub mod reference;
pub mod report;
pub mod rig;
pub mod rng;
pub mod routing;
pub mod run;
pub mod session;
pub mod setup;
pub mod steps;
