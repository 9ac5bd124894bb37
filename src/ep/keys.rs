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
//! | `rank/<r>/metadata` | NIXL agent metadata (`getLocalMD`) | rank r | every rank | after registering its window |
//! | `rank/<r>/window` | its window's descriptor list (nixlSerDes) | rank r | every rank | then |
//! | `rank/<r>/ptr` | the ranks whose window `nixlGetPtr` did not map (JSON list) | rank r | every rank | store path only, before the first iteration |
//! | `nccl_id` | the NCCL unique id (128 bytes) | rank 0 | every rank | before the baseline |
//! | `rank/<r>/result` | [`RankResult`] (JSON): timings, byte counts | rank r | rank 0 | after its last iteration |
//!
//! The membership keys under the same prefix (heartbeats `alive/<r>`,
//! `abort`, barriers `barrier/<name>/<r>` for `connected`, `ready`,
//! `released` and `finished`, and the teardown counters `left`,
//! `left/all`, `out`) are [`crate::group`]'s. Every rank deletes the keys it
//! wrote when it ends, on every path.

use super::config::RunConfig;
use super::net::PeerCard;
use super::report::{RankInfo, RankResult};
use super::setup::Setup;
use crate::group::{AgentMetadata, Bytes, Entry};

crate::json_value!(
    RunConfig => "run configuration",
    Setup => "run setup",
    RankInfo => "rank description",
    RankResult => "rank result",
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
    pub fn metadata(&self, r: u32) -> Entry<AgentMetadata> {
        self.entry(format_args!("rank/{r}/metadata"))
    }
    pub fn card(&self, r: u32) -> Entry<PeerCard> {
        self.entry(format_args!("rank/{r}/card"))
    }
    /// The ranks whose window rank `r` could not map (store path).
    pub fn unmapped(&self, r: u32) -> Entry<Vec<usize>> {
        self.entry(format_args!("rank/{r}/ptr"))
    }
    pub fn result(&self, r: u32) -> Entry<RankResult> {
        self.entry(format_args!("rank/{r}/result"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_live_under_the_prefix() {
        let k = Keys::new("/worker/attempt_0/nixl_ep/");
        assert_eq!(
            k.metadata(1).key(),
            "/worker/attempt_0/nixl_ep/rank/1/metadata"
        );
        assert_eq!(k.unmapped(2).key(), "/worker/attempt_0/nixl_ep/rank/2/ptr");
        assert_eq!(Keys::new("nixl_ep/").setup().key(), "nixl_ep/setup");
    }
}
