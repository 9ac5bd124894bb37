//! Collectives the GPU drives itself — allreduce (one-shot and two-shot),
//! allgather and reduce-scatter between N ranks over NIXL's device API —
//! verified element by element and timed beside NCCL's own: the
//! `collectives` program's library. docs/COLLECTIVES.md explains
//! the algorithms and why every signal carries a sequence number.
//!
//! The modules, bottom up:
//!
//! - [`layout`]: algorithms, paths, types; the index arithmetic (chunks and
//!   slices) the kernels share; the window; nccl-tests' sweep of sizes;
//! - [`reference`](mod@reference), [`nccl`]: what the operations stand on:
//!   every rank's input and a CPU model of all ranks' windows; NCCL's
//!   communicator and one call's arguments;
//! - [`ops`]: the operations, one file each (allreduce and its algorithms,
//!   allgather, reduce-scatter): counts, in-place offsets, bus factor, CPU
//!   model and reference, NCCL call, kernel entries; and the table of them;
//! - [`case`]: one call of the sweep and what the harness derives from its
//!   operation (count, size, grid, offsets, its CPU run);
//! - [`plan`]: the run every rank agrees on, case by case;
//! - [`member`]: how ranks meet (a [`crate::group`] member, with the rank
//!   environment, store and launcher of [`crate::ranks`]);
//! - [`kernels`], [`session`], [`run`]: the GPU run — the kernels of
//!   `cuda/collectives.cu`, the rank's registered window and views, the
//!   cases and their checks beside NCCL's same calls, the entry;
//! - [`report`]: rows, the table, JSON and CSV;
//! - [`elastic`]: runs that survive a rank's death: steps, agreement,
//!   shrink, the per-phase report.

/// `collectives` as the ranks layer names it: keys under `nixl_coll/`,
/// `[collectives]` lines.
pub const PROGRAM: crate::ranks::Program = crate::ranks::Program {
    name: "collectives",
    namespace: "nixl_coll",
};

pub mod case;
pub mod elastic;
pub mod kernels;
pub mod layout;
pub mod member;
pub mod nccl;
pub mod ops;
pub mod plan;
pub mod reference;
pub mod report;
pub mod run;
pub mod session;
pub mod tune;
