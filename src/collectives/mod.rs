//! Collectives the GPU drives itself — allreduce (one-shot and two-shot),
//! allgather and reduce-scatter between N ranks over NIXL's device API —
//! verified element by element and timed beside NCCL's own: the
//! `collectives` program's library. KERNEL_GUIDE.md ("Collectives") explains
//! the algorithms and why every signal carries a sequence number.
//!
//! The modules, bottom up:
//!
//! - [`layout`]: operations, algorithms, paths, types; the index arithmetic
//!   (chunks and slices) the kernels share; the window; nccl-tests' sizes,
//!   counts and bus bandwidth;
//! - [`reference`](mod@reference): every input and expected output, and a
//!   CPU model of each algorithm over the same offsets (tests the index
//!   arithmetic without a GPU);
//! - [`plan`]: the run every rank agrees on, case by case;
//! - [`member`]: how ranks meet (a [`crate::group`] member, with the rank
//!   environment, store and launcher of [`crate::ranks`]);
//! - [`kernels`], [`session`], [`nccl`], [`run`]: the GPU run — the kernels
//!   of `cuda/collectives.cu`, the rank's registered window and views, the
//!   cases and their checks, NCCL's same calls, the entry;
//! - [`report`]: rows, the table, JSON and CSV;
//! - [`elastic`]: runs that survive a rank's death: steps, agreement,
//!   shrink, the per-phase report.

/// `collectives` as the ranks layer names it: keys under `nixl_coll/`,
/// `[collectives]` lines.
pub const PROGRAM: crate::ranks::Program = crate::ranks::Program {
    name: "collectives",
    namespace: "nixl_coll",
};

pub mod elastic;
pub mod kernels;
pub mod layout;
pub mod member;
pub mod nccl;
pub mod plan;
pub mod reference;
pub mod report;
pub mod run;
pub mod session;
