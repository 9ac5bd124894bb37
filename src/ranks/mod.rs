//! The layer every N-rank program stands on (`ep`, `collectives`,
//! `pipeline`): who a
//! rank is, how the ranks meet over the store, who is a member of each
//! phase and who is gone, and the launcher that starts (and, as a plan
//! says, kills) them. It knows nothing of what the ranks compute.
//!
//! The modules, bottom up:
//!
//! - [`env`](mod@env): torchrun's environment (or our launcher's) and the
//!   [`env::Program`] the ranks run, which names its key
//!   namespace;
//! - [`keys`], [`group`]: the membership's store keys, and one rank's handle
//!   on the run's [`crate::group`] (heartbeats, probes, aborts, barriers,
//!   teardown), with the store opened where the launcher, torchrun or rank 0
//!   hosts it;
//! - [`plan`]: upstream NIXL EP's plan files (who runs in each phase) and
//!   their arithmetic; a fixed run is the plan of one phase;
//! - [`membership`]: the members of each phase and the agreement on who is
//!   gone, after every step and at each phase's open and end. It knows no
//!   plan of deaths: any member may die or freeze at any moment, and the
//!   survivors name it, agree and go on (or stop, naming it). Only the
//!   driver uses it;
//! - [`driver`], [`rank`]: the one phase loop every program runs (begin a
//!   phase, connect, open, steps each followed by the agreement, end) over
//!   the program's [`driver::PhaseWork`], and the one entry that starts a
//!   rank (store, Ctrl-C, the stall watchdog, group, membership);
//! - [`check`]: `--check-connection`, the wiring and the membership without
//!   a GPU;
//! - [`launch`]: `--ranks N` / `--plan FILE`: hosts the store, starts each
//!   phase's ranks, kills the plan's victims at random moments, and writes a
//!   notice for every death it sees; [`args`]: the flags that choose and
//!   steer an elastic run, the same in every program;
//! - [`info`], [`nccl`], [`sm_share`]: what N-rank GPU programs share: what
//!   a rank tells the others about its GPU, loading NCCL for their same-run
//!   baseline, and ranks sharing one GPU's SMs.

pub mod args;
pub mod check;
pub mod driver;
pub mod env;
pub mod group;
pub mod info;
pub mod keys;
pub mod launch;
pub mod membership;
pub mod nccl;
pub mod plan;
pub mod rank;
pub mod sm_share;

pub use env::{Program, RankEnv};
pub use group::Group;
pub use membership::{Membership, OnDeath};
