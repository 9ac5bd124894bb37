//! The membership's store keys, built in one place.
//!
//! All keys start with the run's prefix ([`super::env::RankEnv::key_prefix`]:
//! `nixl_ep/` for `ep`, `nixl_coll/` for `collectives`, inside torchrun's
//! worker namespace `/worker/attempt_<n>/` when its agent hosts the store).
//! A program adds its own keys beside these under the same prefix.
//! `<r>.<inc>` names rank r's process started in phase `inc`; phase-scoped
//! keys need no incarnation (one process holds a rank id during a phase):
//!
//! | key | value | written by | read by | when |
//! |---|---|---|---|---|
//! | `rank/<r>.<inc>/peer` | the caller's payload `P` (what the others connect to: NIXL agent metadata, a window) | that process | every member connecting to it | its first phase's begin |
//! | `phase/<i>/connected/<r>` | marker | rank r, once connected to phase i's joiners | the joiners | a phase's begin |
//! | `phase/<i>/step/<s>/report/<r>` | [`Report`] (JSON): the ranks r masked so far in the phase | rank r | the leader | after round s; deleted by r once decided |
//! | `phase/<i>/step/<s>/decision` | [`Verdict`] (JSON): every rank gone in the phase so far, the forgiven, every process dead in the run, the leader, how many reports | the leader (compare-and-set: one decision) | every active member | after the reports; a step's is deleted by its writer at the end of the next phase; the rounds that open and end a phase (`s` = 2⁶¹ and 2⁶⁰) are shared: joiners and the launcher read them, and they go with the group's shared keys |
//! | `phase/<i>/rounds` | counter | the leader of each step's round | the launcher, which times the plan's kills by it | after each step's decision |
//! | `dead/<r>.<inc>` | [`Death`] (JSON): how, when, planned or not | the launcher, when it kills a process or sees one die or stop | the agreement (proof at once, no heartbeat window) | a death |
//! | `deaths` | counter | the launcher, after each notice | every waiting agreement (`ADD 0`: one request says whether a notice is new) | a death |
//!
//! The group keys under the same prefix (heartbeats `alive/<r>`, `abort`,
//! barriers `barrier/<name>/<r>`, and the teardown counters `left`,
//! `left/all`, `out`) are [`crate::group`]'s. Every rank deletes the keys it
//! wrote when it ends, on every path.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::group::{Entry, Marker, Value};

/// A rank's report after a step: the ranks it masked so far in the phase.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Report {
    pub masked: BTreeSet<u32>,
}

/// A step's decision as stored: every rank gone in the phase so far, who
/// decided, and from how many survivors' reports (the leader's included).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Verdict {
    pub gone: BTreeSet<u32>,
    pub leader: u32,
    pub reports: u32,
    /// Ranks some survivor masked in this step that reported all the same:
    /// alive, only late (they waited on the dead one), so not gone; every
    /// survivor resynchronises with them before the next step.
    #[serde(default)]
    pub forgiven: BTreeSet<u32>,
    /// Every process agreed gone in the run so far, this decision's
    /// included, as (rank, incarnation): a process that joins later learns
    /// from the decision that ended the phase before it whom not to wait for.
    #[serde(default)]
    pub dead: BTreeSet<(u32, usize)>,
}

/// The launcher's notice that one of its rank processes died (exited
/// through a signal) or froze (stopped): what the survivors' agreement
/// takes as proof at once, where without it only a heartbeat that stands
/// still for a while tells. Under torchrun no one writes it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Death {
    /// What happened: `SIGKILL`, `stopped (SIGSTOP)`, `exit 1`.
    pub how: String,
    /// When the launcher sent or saw it, unix ns.
    pub at_ns: u64,
    /// Whether the launcher sent it as the plan says (`-r`).
    pub planned: bool,
}

crate::json_value!(
    Report => "membership step report",
    Verdict => "membership step decision",
    Death => "death notice",
);

/// The membership keys of one run.
#[derive(Clone, Debug)]
pub struct Keys {
    prefix: String,
}

impl Keys {
    pub fn new(prefix: impl Into<String>) -> Self {
        Self {
            prefix: prefix.into(),
        }
    }

    /// The run's prefix, e.g. `nixl_ep/`.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The entry `rest` under the run's prefix (a program's own keys).
    pub fn entry<T>(&self, rest: impl std::fmt::Display) -> Entry<T> {
        Entry::new(format!("{}{rest}", self.prefix))
    }
    /// What process `<r>.<inc>` published for the others to connect to it.
    pub fn peer<P: Value>(&self, r: u32, inc: usize) -> Entry<P> {
        self.entry(format_args!("rank/{r}.{inc}/peer"))
    }
    /// Rank `r` connected to phase `i`'s joiners (barrier).
    pub fn connected(&self, i: usize, r: u32) -> Entry<Marker> {
        self.entry(format_args!("phase/{i}/connected/{r}"))
    }
    /// Rank `r`'s report after step `s` of phase `i`.
    pub fn report(&self, i: usize, s: u64, r: u32) -> Entry<Report> {
        self.entry(format_args!("phase/{i}/step/{s}/report/{r}"))
    }
    /// The decision after step `s` of phase `i`.
    pub fn decision(&self, i: usize, s: u64) -> Entry<Verdict> {
        self.entry(format_args!("phase/{i}/step/{s}/decision"))
    }
    /// The launcher's notice that process `<r>.<inc>` died or froze.
    pub fn death(&self, r: u32, inc: usize) -> Entry<Death> {
        self.entry(format_args!("dead/{r}.{inc}"))
    }
    /// Counter of the launcher's death notices: one request tells a waiting
    /// leader whether any process died since it last looked.
    pub fn deaths(&self) -> String {
        format!("{}deaths", self.prefix)
    }
    /// Counter of phase `i`'s agreement rounds so far (the leader of each
    /// adds 1): the launcher times the plan's kills by it.
    pub fn rounds(&self, i: usize) -> String {
        format!("{}phase/{i}/rounds", self.prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_live_under_the_prefix() {
        let k = Keys::new("/worker/attempt_0/nixl_ep/");
        assert_eq!(k.death(1, 2).key(), "/worker/attempt_0/nixl_ep/dead/1.2");
        assert_eq!(
            k.decision(3, 4).key(),
            "/worker/attempt_0/nixl_ep/phase/3/step/4/decision"
        );
        assert_eq!(
            Keys::new("nixl_coll/").rounds(0),
            "nixl_coll/phase/0/rounds"
        );
    }
}
