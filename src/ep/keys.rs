//! Every store key of an `ep` run, built in one place.
//!
//! All keys start with the run's prefix ([`super::env::RankEnv::key_prefix`]).
//! On our own store (rank 0 hosts it) the key `nixl_ep/rank/1/metadata`
//! goes on the wire as `/nixl_ep/rank/1/metadata` (the c10d client adds
//! `/`); on torchrun's store it is `/worker/attempt_0/nixl_ep/rank/1/metadata`,
//! on the wire `//worker/attempt_0/nixl_ep/rank/1/metadata` — byte for byte
//! what a torch worker's `PrefixStore("/worker/attempt_0", TCPStore)` sends
//! for `nixl_ep/rank/1/metadata`.
//!
//! | key | value | written by | read by | when |
//! |---|---|---|---|---|
//! | `config` | [`RunConfig`] (JSON) | rank 0 | every rank, which must match it | first |
//! | `rank/<r>/info` | [`RankInfo`] (JSON): host, pid, GPU, NCCL | rank r | every rank | then; rank 0 makes the setup from them |
//! | `setup` | [`Setup`] (JSON): grid, baseline | rank 0 | every rank | after every info |
//! | `nccl_id` | the NCCL unique id (128 bytes) | rank 0 | every rank | before the baseline |
//! | `rank/<r>/result` | [`RankResult`] (JSON): timings, byte counts | rank r | rank 0 | after its last iteration (single-phase runs) |
//! | `phase/<i>/result/<r>` | [`PhaseResult`] (JSON): the phase's times, detections, agreements, lost steps | rank r | the first rank (the report) | at the end of phase i (elastic runs) |
//!
//! The elastic membership's keys ([`super::elastic`]); `<r>.<inc>` names
//! rank r's process started in phase `inc`, phase-scoped keys need no
//! incarnation (one process holds a rank id during a phase):
//!
//! | key | value | written by | read by | when |
//! |---|---|---|---|---|
//! | `rank/<r>.<inc>/peer` | the caller's payload `P`: a [`PeerCard`](super::net::PeerCard) (agent name, window, metadata) in GPU runs, agent metadata in `--check-connection` | that process | every member connecting to it | its first phase's begin |
//! | `phase/<i>/connected/<r>` | marker | each member of phase i | every member (barrier) | connected to the phase's joiners |
//! | `phase/<i>/step/<s>/report/<r>` | [`Report`] (JSON): the ranks r masked so far in the phase | rank r | the leader | after step s; deleted by r once decided |
//! | `phase/<i>/step/<s>/decision` | [`Verdict`] (JSON): every rank gone in the phase so far, the leader, how many reports | the leader (compare-and-set: one decision) | every active member | after the reports; deleted at the phase's end |
//! | `phase/<i>/halfway` | marker | the leader of the phase's middle step | the launcher, which deletes it and kills the phase's `-r` ranks | phases with kills |
//! | `phase/<i>/killed/<r>` | u64 (JSON): the kill's wall time, unix ns | the launcher | the ranks' reports | right after the kill |
//! | `phase/<i>/done`, `phase/<i>/out` | counters | each survivor of phase i | itself (the `ADD` answer) | the phase's end; the survivor completing `out` deletes both and `done/all` |
//! | `phase/<i>/done/all` | marker | the survivor completing `done` | every survivor | the phase's end: all read every decision |
//! | `phase/<i>/ended` | marker | the survivor completing `done`, when a phase follows | the launcher, which deletes it and starts phase i+1's joiners | the phase's end |
//!
//! The membership keys under the same prefix (heartbeats `alive/<r>`,
//! `abort`, barriers `barrier/<name>/<r>` for `connected`, `ready`,
//! `released` and `finished`, and the teardown counters `left`,
//! `left/all`, `out`) are [`crate::group`]'s. Every rank deletes the keys it
//! wrote when it ends, on every path.

use serde::{Deserialize, Serialize};

use super::config::RunConfig;
use super::phase_report::PhaseResult;
use super::report::{RankInfo, RankResult};
use super::setup::Setup;
use std::collections::BTreeSet;

use crate::group::{Bytes, Entry, Marker, Value};

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
}

crate::json_value!(
    RunConfig => "run configuration",
    Setup => "run setup",
    RankInfo => "rank description",
    RankResult => "rank result",
    PhaseResult => "phase result",
    Report => "elastic step report",
    Verdict => "elastic step decision",
    u64 => "unix time (ns)",
);

/// The keys of one run.
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

    fn entry<T>(&self, rest: impl std::fmt::Display) -> Entry<T> {
        Entry::new(format!("{}{rest}", self.prefix))
    }

    pub fn config(&self) -> Entry<RunConfig> {
        self.entry("config")
    }
    pub fn setup(&self) -> Entry<Setup> {
        self.entry("setup")
    }
    pub fn nccl_id(&self) -> Entry<Bytes> {
        self.entry("nccl_id")
    }
    pub fn info(&self, r: u32) -> Entry<RankInfo> {
        self.entry(format_args!("rank/{r}/info"))
    }
    /// What rank `r` measured in phase `i` (elastic runs).
    pub fn phase_result(&self, i: usize, r: u32) -> Entry<PhaseResult> {
        self.entry(format_args!("phase/{i}/result/{r}"))
    }
    pub fn result(&self, r: u32) -> Entry<RankResult> {
        self.entry(format_args!("rank/{r}/result"))
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
    /// Phase `i` is past its middle step: the launcher may kill its `-r` ranks.
    pub fn halfway(&self, i: usize) -> Entry<Marker> {
        self.entry(format_args!("phase/{i}/halfway"))
    }
    /// When the launcher killed rank `r` during phase `i` (unix ns).
    pub fn killed(&self, i: usize, r: u32) -> Entry<u64> {
        self.entry(format_args!("phase/{i}/killed/{r}"))
    }
    /// Counter of phase `i`'s survivors that finished it.
    pub fn done(&self, i: usize) -> String {
        format!("{}phase/{i}/done", self.prefix)
    }
    /// Every survivor of phase `i` finished it.
    pub fn all_done(&self, i: usize) -> Entry<Marker> {
        self.entry(format_args!("phase/{i}/done/all"))
    }
    /// Counter of phase `i`'s survivors past [`Keys::all_done`].
    pub fn out(&self, i: usize) -> String {
        format!("{}phase/{i}/out", self.prefix)
    }
    /// Phase `i` ended (for the launcher, which starts phase `i+1`'s joiners).
    pub fn ended(&self, i: usize) -> Entry<Marker> {
        self.entry(format_args!("phase/{i}/ended"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_live_under_the_prefix() {
        let k = Keys::new("/worker/attempt_0/nixl_ep/");
        assert_eq!(k.info(1).key(), "/worker/attempt_0/nixl_ep/rank/1/info");
        assert_eq!(k.result(2).key(), "/worker/attempt_0/nixl_ep/rank/2/result");
        assert_eq!(Keys::new("nixl_ep/").setup().key(), "nixl_ep/setup");
    }
}
