//! One rank as a member of the run's [`crate::group`]: the ranks meet over
//! the store, with heartbeats, probes, aborts, barriers and a teardown
//! after which no key is left. The program's launcher hosts the store when
//! it started the ranks (so any rank may die); under torchrun its agent does,
//! or rank 0 (which then leaves last) when `TORCHELASTIC_USE_AGENT_STORE`
//! is not `True`.
//!
//! A rank's process is named `<rank>.<incarnation>` in the membership keys
//! (its heartbeat is `alive/2.1`), so a rank id taken again by a new
//! process never reads as its dead predecessor.

use std::ops::Deref;
use std::time::Duration;

use anyhow::Result;

use super::env::{Program, RankEnv};
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
    /// What the ranks run (names the agents).
    pub program: Program,
    pub rank: u32,
    pub world: u32,
    /// Started by the program's own launcher, which hosts the store and
    /// writes a notice when a rank process dies or stops
    /// ([`super::keys::Keys::death`]).
    pub launcher: bool,
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
            program: env.program,
            rank: env.rank,
            world: env.world,
            launcher: env.launcher_store,
        }
    }

    /// The NIXL agent name of rank `r`'s process started in phase `inc`
    /// (`ep-rank-2.1`): a rank id taken again by a new process gets a new
    /// agent name, so its peers never confuse it with its predecessor.
    pub fn agent_name(&self, r: u32, inc: usize) -> String {
        format!("{}-rank-{}", self.program.name, process_name(r, inc))
    }

    /// Rank `r`'s NIXL card of its first phase (`rank/<r>/card`, as each
    /// rank publishes it), waited for as [`Member::get`] waits. Errors: the
    /// card names another agent than [`Self::agent_name`] expects (another
    /// run uses this store), and `get`'s.
    pub fn peer_card(&self, r: u32) -> Result<crate::nixl::net::PeerCard> {
        let card: crate::nixl::net::PeerCard =
            self.get(&self.rank_entry(r, "card"), r, "peer card")?;
        let want = self.agent_name(r, 0);
        if card.agent != want {
            anyhow::bail!(
                "rank {r}'s card names agent '{}', expected '{want}': another run uses this store",
                card.agent
            );
        }
        Ok(card)
    }

    /// One configuration for the whole run under `entry`: the first rank to
    /// get there stores `mine` (compare-and-set; the key is shared, so it
    /// outlives any rank), every other must match it. Errors: a usage error
    /// naming both configurations when they differ.
    pub fn same_config<T: Value + PartialEq + std::fmt::Debug>(
        &self,
        entry: &Entry<T>,
        mine: &T,
    ) -> Result<()> {
        if let Some(theirs) = self.claim(entry, mine)? {
            if &theirs != mine {
                return Err(crate::cli::UsageError(format!(
                    "rank {} was started with other arguments than the ranks before it (ours: {mine:?}; \
                     theirs: {theirs:?}): give every rank the same arguments",
                    self.rank
                ))
                .into());
            }
        }
        self.share(entry.key());
        Ok(())
    }

    /// Waits for `entry`, which rank `from` writes (see [`Member::get`]).
    pub fn get<T: Value>(&self, entry: &Entry<T>, from: u32, what: &str) -> Result<T> {
        self.member.get(entry, from as usize, what)
    }

    /// The run-wide entry `rest` under the program's namespace (e.g.
    /// `nixl_coll/config`).
    pub fn entry<T>(&self, rest: &str) -> Entry<T> {
        self.keys.entry(rest)
    }

    /// Rank `r`'s entry `what` (`rank/<r>/<what>`): what that rank publishes
    /// about itself in a fixed run.
    pub fn rank_entry<T>(&self, r: u32, what: &str) -> Entry<T> {
        self.keys.entry(format!("rank/{r}/{what}"))
    }

    /// Every rank's `rank/<r>/<what>`, in rank order.
    pub fn gather_ranks<T: Value>(&self, what: &str, describe: &str) -> Result<Vec<T>> {
        self.gather(|r| self.rank_entry(r, what), describe)
    }

    /// Every rank's `entry(r)`, in rank order.
    pub fn gather<T: Value>(&self, entry: impl Fn(u32) -> Entry<T>, what: &str) -> Result<Vec<T>> {
        (0..self.world)
            .map(|r| self.get(&entry(r), r, what))
            .collect()
    }
}

/// The name of rank `rank`'s process started in phase `incarnation`, in
/// membership keys: `2.1`.
pub fn process_name(rank: u32, incarnation: usize) -> String {
    format!("{rank}.{incarnation}")
}

/// The ranks of the run, each named as its first incarnation (`r.0`)
/// except this process (`r.<its incarnation>`): the names the group's
/// barriers and teardown use; an elastic run watches each phase's processes
/// by their own names ([`super::membership`]). The launcher hosts the store
/// when it started us, else torchrun's agent, else rank 0.
fn roster(env: &RankEnv) -> Roster {
    let host = if env.agent_store {
        Host::Elsewhere("torchrun's agent".into())
    } else if env.launcher_store {
        Host::Launcher(env.launcher())
    } else {
        Host::Member(0)
    };
    let mut roster = Roster::ranks(
        &env.key_prefix(),
        env.world,
        host,
        "MASTER_ADDR:MASTER_PORT",
    );
    for (r, name) in roster.names.iter_mut().enumerate() {
        *name = process_name(r as u32, 0);
    }
    roster.names[env.rank as usize] = process_name(env.rank, env.incarnation);
    roster
}

/// Opens the run's store: joins our launcher's or torchrun's
/// (`TORCHELASTIC_USE_AGENT_STORE=True`), or rank 0 hosts ours on
/// `MASTER_PORT` (all interfaces) and the others join it; rank 0 then waits
/// until all `WORLD_SIZE` ranks have.
pub fn open_store(env: &RankEnv, timeout: Duration) -> Result<Box<dyn Store>> {
    let elsewhere = env.agent_store || env.launcher_store;
    let hosting = !elsewhere && env.rank == 0;
    let opts = StoreOptions {
        host: env.master_addr.clone(),
        port: env.master_port,
        is_server: hosting,
        num_workers: (!elsewhere).then_some(env.world),
        wait_workers: !elsewhere,
        timeout,
    };
    let addr = format!("{}:{}", env.master_addr, env.master_port);
    if env.rank == 0 && !env.launcher_store {
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
        StoreError::Unreachable { .. } if env.launcher_store => anyhow::anyhow!(
            "no store at {addr} after {timeout:?}: {} that started this rank hosts it there, and it has exited",
            env.launcher()
        ),
        StoreError::Unreachable { .. } => anyhow::anyhow!(
            "no store at {addr} after {timeout:?}: rank 0 hosts it; start rank 0 (same MASTER_ADDR/MASTER_PORT), or use \
             `{} --ranks N`, which starts every rank (a rank 0 stopped before it could listen looks the same)",
            env.program.name
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
