//! How the ranks of a `collectives` run find each other: the small
//! interface this program needs, over `ep`'s rank machinery (torchrun's
//! environment, the store, heartbeats, aborts, barriers, teardown, the
//! `--ranks N` launcher, the connection check) rather than a copy of it.
//!
//! When the project's shared membership module lands, only this file
//! changes: [`run_member`], [`launch_ranks`] and [`check_connection`] keep
//! their signatures.

use std::time::Duration;

use anyhow::Result;

use crate::ep::connect::{Inject, conclude};
pub use crate::ep::env::RankEnv;
pub use crate::ep::group::Group;
use crate::ep::group::open_store;
use crate::ep::keys::Keys;
use crate::launch::RoleExit;

/// This program's keys live under `nixl_coll/` (not `ep`'s `nixl_ep/`), in
/// torchrun's worker namespace when torchrun hosts the store.
pub fn key_prefix(env: &RankEnv) -> String {
    env.key_prefix().replace("nixl_ep/", "nixl_coll/")
}

/// The NIXL agent name of rank `r`.
pub fn agent_name(r: u32) -> String {
    format!("coll-rank-{r}")
}

/// Joins the run's store as `env` says, runs `work` while this rank's
/// heartbeat beats, then leaves with the others (every key deleted). On
/// failure the others are told why (the abort key) and stop at once.
pub fn run_member(
    env: &RankEnv,
    timeout: Duration,
    work: impl FnOnce(&Group) -> Result<()>,
) -> Result<()> {
    let store = open_store(env, timeout)?;
    crate::interrupt::install()?;
    let group = Group::new(
        store.as_ref(),
        Keys::new(key_prefix(env)),
        env.rank,
        env.world,
        timeout,
    );
    let result = group.with_heartbeat(|| work(&group).and_then(|()| group.leave()));
    conclude(&group, env, result)
}

/// `collectives --ranks N`: starts the N ranks here, as torchrun would,
/// and waits for all; a failed rank's peers get `grace` to say why.
pub fn launch_ranks(world: u32, port: u16, grace: Duration) -> Result<Vec<RoleExit>> {
    crate::ep::launch::run_ranks(world, port, grace)
}

/// `--check-connection`: the ranks meet and wire up their NIXL agents,
/// no GPU used.
pub fn check_connection(env: &RankEnv, timeout: Duration) -> Result<()> {
    crate::ep::connect::check_connection(env, timeout, Inject::default())
}
