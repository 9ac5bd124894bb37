//! One rank as a member of the run's [`crate::group`]: the ranks meet over
//! the store, with heartbeats, probes, aborts, barriers and a teardown
//! after which no key is left. Rank 0 hosts the store (so it leaves
//! last), unless torchrun's agent does.

use std::ops::Deref;
use std::time::Duration;

use anyhow::Result;

use super::env::RankEnv;
use super::keys::Keys;
use crate::cli::StoreBackend;
use crate::group::{Entry, Host, Member, Roster, Value, join_store};
use crate::store::native::TcpStore;
use crate::store::{Store, StoreError, StoreOptions};

/// One rank's handle on the run: its [`Member`] (every membership call,
/// through `Deref`) and the run's keys.
pub struct Group<'a> {
    member: Member<'a>,
    pub keys: Keys,
    pub rank: u32,
    pub world: u32,
}

impl<'a> Deref for Group<'a> {
    type Target = Member<'a>;
    fn deref(&self) -> &Member<'a> {
        &self.member
    }
}

impl<'a> Group<'a> {
    /// Rank `env.rank` of `env.world` on `store`; `timeout` bounds every
    /// wait for another rank.
    pub fn new(store: &'a dyn Store, env: &RankEnv, timeout: Duration) -> Self {
        let keys = Keys::new(env.key_prefix());
        let member = Member::new(store, roster(env), env.rank as usize, timeout);
        Self {
            member,
            keys,
            rank: env.rank,
            world: env.world,
        }
    }

    /// Waits for `entry`, which rank `from` writes (see [`Member::get`]).
    pub fn get<T: Value>(&self, entry: &Entry<T>, from: u32, what: &str) -> Result<T> {
        self.member.get(entry, from as usize, what)
    }

    /// Every rank's `entry(r)`, in rank order.
    pub fn gather<T: Value>(&self, entry: impl Fn(u32) -> Entry<T>, what: &str) -> Result<Vec<T>> {
        (0..self.world)
            .map(|r| self.get(&entry(r), r, what))
            .collect()
    }
}

/// The ranks of the run; rank 0 hosts the store unless torchrun's agent does.
fn roster(env: &RankEnv) -> Roster {
    let host = match env.agent_store {
        true => Host::Elsewhere("torchrun's agent".into()),
        false => Host::Member(0),
    };
    Roster::ranks(
        &env.key_prefix(),
        env.world,
        host,
        "MASTER_ADDR:MASTER_PORT",
    )
}

/// Opens the run's store: joins torchrun's (`TORCHELASTIC_USE_AGENT_STORE=True`),
/// or rank 0 hosts ours on `MASTER_PORT` (all interfaces) and the others
/// join it; rank 0 then waits until all `WORLD_SIZE` ranks have.
pub fn open_store(env: &RankEnv, timeout: Duration) -> Result<Box<dyn Store>> {
    let hosting = !env.agent_store && env.rank == 0;
    let opts = StoreOptions {
        host: env.master_addr.clone(),
        port: env.master_port,
        is_server: hosting,
        num_workers: (!env.agent_store).then_some(env.world),
        wait_workers: !env.agent_store,
        timeout,
    };
    let addr = format!("{}:{}", env.master_addr, env.master_port);
    if env.rank == 0 {
        match hosting {
            true => tracing::info!(
                "hosting the store on port {} (keys under {})",
                env.master_port,
                env.key_prefix()
            ),
            false => tracing::info!(
                "joining torchrun's agent store at {addr} (keys under {})",
                env.key_prefix()
            ),
        }
    }
    let opened = match hosting {
        true => TcpStore::open(&opts).map(|s| Box::new(s) as Box<dyn Store>),
        false => join_store(
            StoreBackend::Native,
            &opts,
            roster(env).reply_deadline(timeout),
        ),
    };
    opened.map_err(|e| match e {
        e @ StoreError::Bind { .. } => crate::cli::store_error(e),
        StoreError::Unreachable { .. } if env.agent_store => anyhow::anyhow!(
            "no store at {addr} after {timeout:?}: TORCHELASTIC_USE_AGENT_STORE=True says torchrun's agent hosts one \
             there; start the ranks with torchrun, or unset it so that rank 0 hosts the store"
        ),
        StoreError::Unreachable { .. } => anyhow::anyhow!(
            "no store at {addr} after {timeout:?}: rank 0 hosts it; start rank 0 (same MASTER_ADDR/MASTER_PORT), or use \
             `ep --ranks N`, which starts every rank (a rank 0 stopped before it could listen looks the same)"
        ),
        StoreError::WorkersTimeout { joined, .. } => anyhow::anyhow!(
            "only {joined} of {} ranks joined the store on port {} within {timeout:?}: start the missing ranks (same \
             MASTER_PORT and WORLD_SIZE), or raise --timeout",
            env.world,
            env.master_port
        ),
        e @ StoreError::NoReply { .. } => anyhow::anyhow!("{}", roster(env).host_silent(&e)),
        e => crate::cli::store_error(e).context(format!("opening the store at {addr}")),
    })
}
