//! `simple_write`: a kernel in the initiator puts a buffer into the
//! target's GPU memory and raises a signal there; the target's kernel waits
//! for it, acknowledges, and every byte is verified.
//!
//! - [`protocol`]: every key the two roles exchange through the store, its
//!   type, and who writes and reads it when;
//! - the roles meet as the two members of a [`crate::group`]: its waits
//!   notice a peer that gave up, died or froze;
//! - [`kernels`]: the kernels' levels, paths, parameters and launches;
//! - [`plan`]: the rounds (sizes, levels, grids, iterations) the initiator
//!   decides and the target follows;
//! - [`initiator_role`] (and its rounds); [`target_role`] (and its receiving):
//!   the roles, each a short sequence of phases (not folders named `target/`,
//!   which tools that skip cargo's build folder would skip too);
//! - [`baseline`]: the copy engine and NIXL's host API in the same run;
//! - [`connection`]: `--check-connection`, the exchange without a GPU;
//! - [`report`]: tables, JSON and CSV.
//!
//! The shortest complete form of the pattern is `examples/put_and_signal.rs`;
//! this is the same pattern as a benchmark.

pub mod baseline;
pub mod connection;
pub mod initiator_role;
pub mod kernels;
pub mod plan;
pub mod protocol;
pub mod report;
pub mod target_role;
