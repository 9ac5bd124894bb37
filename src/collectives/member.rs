//! One rank as a member of the run: the group of [`crate::ranks`] (the ranks
//! meet over the store with heartbeats, probes, aborts, barriers, and a
//! teardown after which no key is left), its rank environment, store and
//! launcher. The launcher hosts the store when it started the ranks,
//! torchrun's agent under torchrun, else rank 0 (which then leaves last).
//!
//! Keys, under `nixl_coll/` (in torchrun's worker namespace when its agent
//! hosts the store):
//!
//! | key | set by | value |
//! |---|---|---|
//! | `config` | rank 0 | the [`super::plan::RunConfig`]; others must match it |
//! | `rank/<r>/info` | rank r | host, GPU, NCCL ([`crate::ranks::info::RankInfo`]) |
//! | `rank/<r>/metadata` | rank r | NIXL agent metadata |
//! | `rank/<r>/window` | rank r | its window's descriptor list (nixlSerDes) |
//! | `rank/<r>/store` | rank r | peers `nixlGetPtr` did not reach |
//! | `nccl_id`, `rank/<r>/nccl` | rank 0, rank r | NCCL's unique id; whether NCCL connected |
//! | `rank/<r>/result` | rank r | its times ([`super::report::RankTimes`]) |

use anyhow::Result;

use crate::ranks::check::Check;
pub use crate::ranks::env::RankEnv;
pub use crate::ranks::group::Group;
use crate::ranks::plan::Plan;

/// `--check-connection`: the ranks meet and wire up their NIXL agents, no
/// GPU used ([`crate::ranks::check`], the same wiring as `ep`'s); with an
/// elastic `plan`, `check.steps` steps of agreement in which any rank may
/// die.
pub fn check_connection(env: &RankEnv, plan: Option<&Plan>, check: Check) -> Result<()> {
    let fixed = Plan::fixed(env.world);
    crate::ranks::check::check_connection(env, plan.unwrap_or(&fixed), check)
}
