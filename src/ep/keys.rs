//! `ep`'s own store keys, beside the membership's ([`crate::ranks::keys`]),
//! all under the run's prefix `nixl_ep/`.
//!
//! On the launcher's store the key `nixl_ep/rank/1/info` goes on the wire as
//! `/nixl_ep/rank/1/info` (the c10d client adds `/`); on torchrun's store
//! it is `/worker/attempt_0/nixl_ep/rank/1/info`, on the wire
//! `//worker/attempt_0/nixl_ep/rank/1/info` — byte for byte what a torch
//! worker's `PrefixStore("/worker/attempt_0", TCPStore)` sends for
//! `nixl_ep/rank/1/info`.
//!
//! | key | value | written by | read by | when |
//! |---|---|---|---|---|
//! | `config` | [`RunConfig`] (JSON) | the first rank to get there (compare-and-set; shared) | every rank, which must match it | first |
//! | `rank/<r>/info` | [`RankInfo`] (JSON): host, pid, GPU, NCCL | rank r | every rank | then; the setup is made from them |
//! | `setup` | [`Setup`] (JSON): grid, baseline, the first phase's infos | every member of the first phase makes the same one, the first to get there writes it (compare-and-set; shared) | every rank, joiners too | after every info |
//! | `nccl_id` | the NCCL unique id (128 bytes) | rank 0 | every rank | before the baseline |
//! | `rank/<r>/result` | [`RankResult`] (JSON): timings, byte counts | rank r | the reporter (the lowest survivor) | after its last iteration (single-phase runs) |
//! | `phase/<i>/result/<r>` | [`PhaseResult`] (JSON): the phase's times, detections, agreements, lost steps | rank r | the reporter (the lowest survivor of the last phase) | at the end of phase i (elastic runs) |
//!
//! A process's `rank/<r>.<inc>/peer` is a [`PeerCard`](crate::nixl::net::PeerCard)
//! (agent name, window, metadata) in GPU runs.

use super::config::RunConfig;
use super::phase_report::PhaseResult;
use super::report::{RankInfo, RankResult};
use super::setup::Setup;
use crate::group::{Bytes, Entry};
use crate::ranks::keys::Keys;

crate::json_value!(
    RunConfig => "run configuration",
    Setup => "run setup",
    RankInfo => "rank description",
    RankResult => "rank result",
    PhaseResult => "phase result",
);

/// `ep`'s keys, as calls on the run's keys ([`crate::ranks::Group::keys`]):
/// `group.keys.config()` beside the membership's `group.keys.decision(i, s)`.
pub trait EpKeys {
    fn config(&self) -> Entry<RunConfig>;
    fn setup(&self) -> Entry<Setup>;
    fn nccl_id(&self) -> Entry<Bytes>;
    fn info(&self, r: u32) -> Entry<RankInfo>;
    /// What rank `r` measured in phase `i` (elastic runs).
    fn phase_result(&self, i: usize, r: u32) -> Entry<PhaseResult>;
    fn result(&self, r: u32) -> Entry<RankResult>;
}

impl EpKeys for Keys {
    fn config(&self) -> Entry<RunConfig> {
        self.entry("config")
    }
    fn setup(&self) -> Entry<Setup> {
        self.entry("setup")
    }
    fn nccl_id(&self) -> Entry<Bytes> {
        self.entry("nccl_id")
    }
    fn info(&self, r: u32) -> Entry<RankInfo> {
        self.entry(format_args!("rank/{r}/info"))
    }
    fn phase_result(&self, i: usize, r: u32) -> Entry<PhaseResult> {
        self.entry(format_args!("phase/{i}/result/{r}"))
    }
    fn result(&self, r: u32) -> Entry<RankResult> {
        self.entry(format_args!("rank/{r}/result"))
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
        assert_eq!(k.death(0, 1).key(), "/worker/attempt_0/nixl_ep/dead/0.1");
    }
}
