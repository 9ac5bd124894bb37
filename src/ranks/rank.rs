//! A rank's whole life, started one way in every program: the store (our
//! launcher's or torchrun's agent's), Ctrl-C, the stall watchdog, the
//! group (heartbeats, aborts, cleanup on every path) and the membership,
//! then the program's work, which runs its phases through
//! [`Rank::drive`].

use std::collections::BTreeSet;
use std::ops::Range;
use std::time::Duration;

use anyhow::Result;

use super::driver::{PhaseRecord, PhaseWork, drive};
use super::env::RankEnv;
use super::group::{Group, open_store};
use super::keys::Verdict;
pub use super::membership::OnDeath;
use super::membership::{END, Membership, lowest};
use super::plan::Plan;
use crate::group::{Entry, Value};

/// How a rank runs: every wait's limit (also the stall watchdog's), the
/// wait for a silent peer's report where only heartbeats tell, and what a
/// death does.
#[derive(Clone, Copy, Debug)]
pub struct RankOptions {
    pub timeout: Duration,
    pub fault_timeout: Duration,
    pub on_death: OnDeath,
}

/// One rank of the run: its group (the store and the run's keys) and its
/// side of the membership, which only the driver uses.
pub struct Rank<'a> {
    pub group: &'a Group<'a>,
    el: Membership<'a>,
}

/// Starts rank `env.rank` of `plan` and runs `work` as it: opens the store,
/// routes Ctrl-C, starts the stall watchdog (no progress for
/// `opts.timeout`: exit 1 naming where), joins the group and the
/// membership. Cleanup runs on every path ([`crate::group::Member::run`]).
pub fn run_rank<T>(
    env: &RankEnv,
    plan: &Plan,
    opts: RankOptions,
    work: impl FnOnce(&Rank) -> Result<T>,
) -> Result<T> {
    let store = open_store(env, opts.timeout)?;
    crate::interrupt::install()?;
    let _watch = crate::stall::watch(&format!("rank {}", env.rank), opts.timeout);
    let group = Group::new(store.as_ref(), env, opts.timeout);
    group.run(|| {
        let el = Membership::new(
            &group,
            plan,
            env.incarnation,
            opts.fault_timeout,
            opts.on_death,
        )?;
        work(&Rank { group: &group, el })
    })
}

impl Rank<'_> {
    /// Runs every phase of this process's life over `work` (see
    /// [`super::driver`]); `card` is what it publishes for its peers.
    pub fn drive<W: PhaseWork>(&self, work: &mut W, card: &W::Card) -> Result<Vec<PhaseRecord>> {
        drive(&self.el, work, card)
    }

    pub fn rank(&self) -> u32 {
        self.group.rank
    }

    pub fn plan(&self) -> &Plan {
        self.el.plan()
    }

    /// The phase that started this process.
    pub fn incarnation(&self) -> usize {
        self.el.incarnation()
    }

    /// The phases this process lives, unless it dies.
    pub fn life(&self) -> Range<usize> {
        self.el.life()
    }

    /// Whether the run goes on after a death.
    pub fn survives(&self) -> bool {
        self.el.survives()
    }

    /// Phase `i`'s members not gone, as this process knows them (after
    /// [`Rank::drive`]: the survivors of the phases it lived).
    pub fn survivors(&self, i: usize) -> BTreeSet<u32> {
        self.el.active(i)
    }

    /// Whether this process writes the run's report: it lived the plan's
    /// last phase and is its lowest survivor.
    pub fn reports(&self) -> bool {
        let last = self.plan().len() - 1;
        self.life().contains(&last) && lowest(&self.survivors(last)) == self.rank()
    }

    /// Waits for `entry`, which rank `r`'s process of phase `i` writes;
    /// `None` once that process is proven dead without writing it.
    pub fn await_from<T: Value>(
        &self,
        entry: &Entry<T>,
        r: u32,
        i: usize,
        what: &str,
    ) -> Result<Option<T>> {
        self.el.await_entry(entry, r, i, what)
    }

    /// When the launcher killed or saw the death of rank `r`'s process of
    /// phase `i` (unix ns), if it did.
    pub fn died_at(&self, i: usize, r: u32) -> Result<Option<u64>> {
        self.el.died_at(i, r)
    }

    /// The decision that ended phase `i` (who finished it, who is dead).
    pub fn phase_end(&self, i: usize) -> Result<Verdict> {
        let g = self.group;
        g.get(
            &g.keys.decision(i, END),
            lowest(&self.plan().members(i)),
            "end of a phase",
        )
    }
}
