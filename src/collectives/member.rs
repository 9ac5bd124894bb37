//! One rank as a member of the run's [`crate::group`]: the ranks meet over
//! the store (heartbeats, probes, aborts, barriers, a teardown after which
//! no key is left), with the rank environment, store and launcher of [`crate::ranks`].
//! Rank 0 hosts the store (so it leaves last), unless torchrun's agent does.
//!
//! Keys, under `nixl_coll/` (in torchrun's worker namespace when its agent
//! hosts the store):
//!
//! | key | set by | value |
//! |---|---|---|
//! | `config` | rank 0 | the [`super::plan::RunConfig`]; others must match it |
//! | `rank/<r>/info` | rank r | host, GPU, NCCL ([`super::session::RankInfo`]) |
//! | `rank/<r>/metadata` | rank r | NIXL agent metadata |
//! | `rank/<r>/window` | rank r | its window's descriptor list (nixlSerDes) |
//! | `rank/<r>/store` | rank r | peers `nixlGetPtr` did not reach |
//! | `nccl_id`, `rank/<r>/nccl` | rank 0, rank r | NCCL's unique id; whether NCCL connected |
//! | `rank/<r>/result` | rank r | its times ([`super::report::RankTimes`]) |

use std::ops::Deref;
use std::time::Duration;

use anyhow::Result;

use crate::group::{Entry, Host, Member, Roster, Value};
use crate::launch::RoleExit;
use crate::ranks::check::Inject;
pub use crate::ranks::env::RankEnv;

/// One rank's handle on the run: its [`Member`] (every membership call,
/// through `Deref`) and where its keys live.
pub struct Group<'a> {
    member: Member<'a>,
    prefix: String,
    pub rank: u32,
    pub world: u32,
}

impl<'a> Deref for Group<'a> {
    type Target = Member<'a>;
    fn deref(&self) -> &Member<'a> {
        &self.member
    }
}

impl Group<'_> {
    /// The run-wide entry `rest` (e.g. `config`).
    pub fn entry<T>(&self, rest: &str) -> Entry<T> {
        Entry::new(format!("{}{rest}", self.prefix))
    }

    /// Rank `r`'s entry `what` (`rank/<r>/<what>`).
    pub fn rank_entry<T>(&self, r: u32, what: &str) -> Entry<T> {
        self.entry(&format!("rank/{r}/{what}"))
    }

    /// Waits for `entry`, which rank `from` writes (see [`Member::get`]).
    pub fn get<T: Value>(&self, entry: &Entry<T>, from: u32, what: &str) -> Result<T> {
        self.member.get(entry, from as usize, what)
    }

    /// Every rank's `rank/<r>/<what>`, in rank order.
    pub fn gather<T: Value>(&self, what: &str, describe: &str) -> Result<Vec<T>> {
        (0..self.world)
            .map(|r| self.get(&self.rank_entry(r, what), r, describe))
            .collect()
    }
}

/// The NIXL agent name of rank `r`.
pub fn agent_name(r: u32) -> String {
    format!("coll-rank-{r}")
}

/// Joins the run's store as `env` says and runs `work` as this rank
/// ([`Member::run`]: heartbeat, abort on failure, cleanup on every path),
/// then leaves with the others.
pub fn run_member(
    env: &RankEnv,
    timeout: Duration,
    work: impl FnOnce(&Group) -> Result<()>,
) -> Result<()> {
    let store = crate::ranks::group::open_store(env, timeout)?;
    crate::interrupt::install()?;
    let host = match env.agent_store {
        true => Host::Elsewhere("torchrun's agent".into()),
        false => Host::Member(0),
    };
    let roster = Roster::ranks(
        &env.key_prefix(),
        env.world,
        host,
        "MASTER_ADDR:MASTER_PORT",
    );
    let group = Group {
        member: Member::new(store.as_ref(), roster, env.rank as usize, timeout),
        prefix: env.key_prefix(),
        rank: env.rank,
        world: env.world,
    };
    group.run(|| work(&group).and_then(|()| group.leave()))
}

/// `collectives --ranks N`: starts the N ranks here, as torchrun would,
/// and waits for all; a failed rank's peers get `grace` to say why.
pub fn launch_ranks(world: u32, port: u16, grace: Duration) -> Result<Vec<RoleExit>> {
    crate::ranks::launch::run_ranks(world, port, grace)
}

/// `--check-connection`: the ranks meet and wire up their NIXL agents,
/// no GPU used ([`crate::ranks::check`], the same wiring as `ep`'s).
pub fn check_connection(env: &RankEnv, timeout: Duration) -> Result<()> {
    let plan = crate::ranks::plan::Plan::fixed(env.world);
    let fault = Duration::from_nanos(crate::ranks::membership::DEFAULT_FAULT_TIMEOUT_NS);
    let check = crate::ranks::check::Check {
        timeout,
        fault_timeout: fault,
        steps: 0,
        step_work: Duration::ZERO,
        on_death: crate::ranks::membership::OnDeath::Fail,
        inject: Inject::default(),
    };
    crate::ranks::check::check_connection(env, &plan, check)
}
