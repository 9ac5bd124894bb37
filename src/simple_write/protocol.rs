//! The protocol between `simple_write`'s two roles: every key on the
//! store, the type of its value, and the one place values are encoded.
//!
//! | key (under `NIXL_2PROC/`) | value | written by | read by | when |
//! |---|---|---|---|---|
//! | `target_claim` | [`Claim`] | target (compare-and-set) | a second target | first thing a target does; a second one finds it taken and leaves |
//! | `run_plan` | [`RunPlan`] | initiator | target | before anything else: sizes, levels, iterations, seed |
//! | `target_meta` ¹ | [`AgentMetadata`] | target | initiator | after registering its memory |
//! | `target_data_descs` ¹ | [`DescList`] | target | initiator | then: the data buffer |
//! | `target_signal_descs` ¹ | [`DescList`] | target | initiator | then: the 8-byte signal |
//! | `target_gpu` | [`GpuInfo`] | target | initiator | then: which GPU, for the baselines and `same_gpu` |
//! | `initiator_meta` ¹ | [`AgentMetadata`] | initiator | target | after registering its memory |
//! | `initiator_ack_descs` | [`DescList`] | initiator | target | then: the 8-byte acknowledgement word |
//! | `go/<round>` | [`Marker`] | initiator | target | before each round, after the round's baselines |
//! | `verdict/<round>` | [`Verdict`] | target | initiator | after checking each round's data |
//! | `initiator_done` | [`Marker`] | initiator | target | its memory views of the target are released |
//! | `target_done` | [`Marker`] | target | initiator | the target's last message; the initiator deletes it |
//!
//! ¹ Upstream's keys (NIXL PR #1259), written in upstream's order with
//! upstream's bytes (raw `getLocalMD()` output, NIXL's `nixlSerDes`
//! descriptor lists), so our roles and the C++ original read each other's
//! metadata. Our own values are JSON.
//!
//! The two roles are the members of a [`crate::group`] ([`roster`]), whose
//! own keys sit under the same prefix: `alive/initiator`, `alive/target`
//! (heartbeats), `abort` (a role failed: the other stops waiting at once),
//! `out` (teardown). Each role deletes the keys it wrote when its work ends,
//! on every path; `target_done`, which the target writes last, is deleted
//! by the initiator after reading it. The initiator hosts the store, so it
//! leaves last: it waits until the target counted itself out.

use serde::{Deserialize, Serialize};

pub use super::plan::RunPlan;
pub use crate::gpu::GpuInfo;
pub use crate::group::{AgentMetadata, Entry, Marker, ProtocolError, Value};
use crate::group::{Host, Roster};
pub use crate::nixl::serdes::DescList;
use crate::stats::Summary;

/// Where every key lives.
pub const PREFIX: &str = "NIXL_2PROC/";

fn entry<T>(path: impl std::fmt::Display) -> Entry<T> {
    Entry::new(format!("{PREFIX}{path}"))
}

/// The two members: the initiator ([`INITIATOR`]) and the target
/// ([`TARGET`]). `host` is usually `Host::Member(INITIATOR)`; under
/// `--mode pair` the parent process hosts the store.
pub fn roster(host: Host) -> Roster {
    Roster {
        prefix: PREFIX.into(),
        names: vec![INITIATOR_NAME.into(), TARGET_NAME.into()],
        labels: vec!["the initiator".into(), "the target".into()],
        host,
        place: "--host/--port".into(),
        // The target publishes its verdict on the data; both then tear down.
        mismatch_is_published: true,
    }
}

/// The initiator's and the target's index in the [`roster`].
pub const INITIATOR: usize = 0;
pub const TARGET: usize = 1;

/// Agent names, as upstream.
pub const INITIATOR_NAME: &str = "initiator";
pub const TARGET_NAME: &str = "target";

/// Which side a process plays.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Hosts the store, owns the source data, launches the puts.
    Initiator,
    /// Exposes a data buffer and a signal, waits, verifies.
    Target,
}

impl Role {
    /// `initiator` / `target`: the agent name and the prefix of its lines.
    pub fn name(self) -> &'static str {
        match self {
            Role::Initiator => INITIATOR_NAME,
            Role::Target => TARGET_NAME,
        }
    }

    /// Our index in the [`roster`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// The other side.
    pub fn peer(self) -> Role {
        match self {
            Role::Initiator => Role::Target,
            Role::Target => Role::Initiator,
        }
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The first target to join: who holds the pair.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claim {
    pub pid: u32,
    pub host: String,
    /// `--check-connection` targets say so.
    pub check_only: bool,
}

/// The target's verdict on one round's data.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "verdict", rename_all = "lowercase")]
pub enum Verdict {
    /// Every byte as expected.
    Ok {
        /// Byte sum of the received data (upstream's checksum).
        checksum: u64,
        /// Intervals between the moments the target's GPU saw each timed
        /// iteration complete (spinning wait only), ns.
        arrivals: Option<Summary>,
    },
    /// Wrong data.
    Mismatch {
        checksum: u64,
        expected_checksum: u64,
        /// The first wrong byte: offset, expected and received values.
        first: String,
    },
}

impl Verdict {
    /// Whether the data verified.
    pub fn ok(&self) -> bool {
        matches!(self, Verdict::Ok { .. })
    }
}

crate::json_value!(
    RunPlan => "run plan",
    GpuInfo => "GPU identity",
    Claim => "target claim",
    Verdict => "verdict",
);

/// The first target's claim on the pair.
pub fn target_claim() -> Entry<Claim> {
    entry("target_claim")
}
/// The run plan.
pub fn run_plan() -> Entry<RunPlan> {
    entry("run_plan")
}
/// Upstream's: the target's agent metadata.
pub fn target_meta() -> Entry<AgentMetadata> {
    entry("target_meta")
}
/// Upstream's: the target's data buffer.
pub fn target_data_descs() -> Entry<DescList> {
    entry("target_data_descs")
}
/// Upstream's: the target's signal.
pub fn target_signal_descs() -> Entry<DescList> {
    entry("target_signal_descs")
}
/// The target's GPU.
pub fn target_gpu() -> Entry<GpuInfo> {
    entry("target_gpu")
}
/// Upstream's: the initiator's agent metadata.
pub fn initiator_meta() -> Entry<AgentMetadata> {
    entry("initiator_meta")
}
/// The initiator's acknowledgement word.
pub fn initiator_ack_descs() -> Entry<DescList> {
    entry("initiator_ack_descs")
}
/// Round `round` may start.
pub fn go(round: usize) -> Entry<Marker> {
    entry(format_args!("go/{round}"))
}
/// The target's verdict on round `round`.
pub fn verdict(round: usize) -> Entry<Verdict> {
    entry(format_args!("verdict/{round}"))
}
/// The initiator released its views of the target.
pub fn initiator_done() -> Entry<Marker> {
    entry("initiator_done")
}
/// The target is done with the store.
pub fn target_done() -> Entry<Marker> {
    entry("target_done")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_keys_are_upstreams() {
        assert_eq!(target_meta().key(), "NIXL_2PROC/target_meta");
        assert_eq!(target_data_descs().key(), "NIXL_2PROC/target_data_descs");
        assert_eq!(
            target_signal_descs().key(),
            "NIXL_2PROC/target_signal_descs"
        );
        assert_eq!(initiator_meta().key(), "NIXL_2PROC/initiator_meta");
    }

    #[test]
    fn verdicts_round_trip_and_foreign_bytes_are_named() {
        let v = Verdict::Mismatch {
            checksum: 1,
            expected_checksum: 2,
            first: "offset 5: expected 0x01, got 0x02".into(),
        };
        let e = verdict(3);
        assert_eq!(e.decode(&e.encode(&v)).unwrap(), v);
        let err = e.decode(b"ok 123").unwrap_err().to_string();
        assert!(
            err.contains("NIXL_2PROC/verdict/3") && err.contains("verdict"),
            "{err}"
        );
    }
}
