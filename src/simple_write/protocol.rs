//! The protocol between `simple_write`'s two roles: every key on the
//! store, the type of its value, and the one place values are encoded.
//!
//! | key (under `NIXL_2PROC/`) | value | written by | read by | when |
//! |---|---|---|---|---|
//! | `target_claim` | [`Claim`] | target (compare-and-set) | a second target | first thing a target does; a second one finds it taken and leaves |
//! | `alive/initiator`, `alive/target` | counter (`ADD`) | that role | the other | every 250 ms while the role runs ([`super::session`]) |
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
//! | `target_done` | [`Marker`] | target | initiator | the target's last store operation |
//! | `abort` | [`Abort`] | either | the other | a role failed: the other stops waiting at once |
//!
//! ¹ Upstream's keys (NIXL PR #1259), written in upstream's order with
//! upstream's bytes (raw `getLocalMD()` output, NIXL's `nixlSerDes`
//! descriptor lists), so our roles and the C++ original read each other's
//! metadata. Our own values are JSON.
//!
//! The initiator hosts the store, so a target that outlives it loses the
//! store: the target's last write is `target_done`, and the initiator
//! deletes every key only after reading it.

use std::marker::PhantomData;

use serde::{Deserialize, Serialize, de::DeserializeOwned};

pub use super::plan::RunPlan;
pub use crate::gpu::GpuInfo;
pub use crate::nixl::serdes::DescList;
use crate::stats::Summary;

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

/// A value that cannot be decoded: the other side speaks another version
/// of this protocol, or something else wrote the key.
#[derive(Debug, thiserror::Error)]
#[error(
    "the value of {key} is not a {what}: {why} (another simple_write version, or another program on this port?)"
)]
pub struct ProtocolError {
    pub key: String,
    pub what: &'static str,
    pub why: String,
}

/// How a value is written to and read from the store.
pub trait Value: Sized {
    /// What it is, for messages.
    const WHAT: &'static str;
    fn encode(&self) -> Vec<u8>;
    fn decode(bytes: &[u8]) -> Result<Self, String>;
}

/// A key whose value has type `T`: the only way to read or write the store.
#[derive(Debug)]
pub struct Entry<T> {
    key: String,
    _value: PhantomData<fn() -> T>,
}

impl<T> Entry<T> {
    fn new(path: impl std::fmt::Display) -> Self {
        Self {
            key: format!("NIXL_2PROC/{path}"),
            _value: PhantomData,
        }
    }

    /// The key as stored (without the `/` the TCP client adds on the wire).
    pub fn key(&self) -> &str {
        &self.key
    }
}

impl<T: Value> Entry<T> {
    /// The value's bytes.
    pub fn encode(&self, v: &T) -> Vec<u8> {
        v.encode()
    }

    /// The value, or why the bytes are not one.
    pub fn decode(&self, bytes: &[u8]) -> Result<T, ProtocolError> {
        T::decode(bytes).map_err(|why| ProtocolError {
            key: self.key.clone(),
            what: T::WHAT,
            why,
        })
    }
}

/// A heartbeat counter, bumped with the store's `ADD`; it has no other value.
#[derive(Debug)]
pub struct Counter;

/// A key whose presence is the message (an empty value).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Marker;

/// `getLocalMD()` bytes: opaque, passed to the peer's `loadRemoteMD`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentMetadata(pub Vec<u8>);

/// The first target to join: who holds the pair.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claim {
    pub pid: u32,
    pub host: String,
    /// `--check-connection` targets say so.
    pub check_only: bool,
}

/// A role's failure, so the other stops waiting with the reason.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Abort {
    pub role: Role,
    pub message: String,
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

impl Value for Marker {
    const WHAT: &'static str = "marker";
    fn encode(&self) -> Vec<u8> {
        Vec::new()
    }
    fn decode(_: &[u8]) -> Result<Self, String> {
        Ok(Marker)
    }
}

impl Value for AgentMetadata {
    const WHAT: &'static str = "NIXL agent metadata blob";
    fn encode(&self) -> Vec<u8> {
        self.0.clone()
    }
    fn decode(bytes: &[u8]) -> Result<Self, String> {
        if bytes.is_empty() {
            return Err("empty".into());
        }
        Ok(Self(bytes.to_vec()))
    }
}

impl Value for DescList {
    const WHAT: &'static str = "nixlSerDes descriptor list";
    fn encode(&self) -> Vec<u8> {
        DescList::encode(self)
    }
    fn decode(bytes: &[u8]) -> Result<Self, String> {
        DescList::decode(bytes).map_err(|e| e.to_string())
    }
}

/// Our own values: JSON, so a person can read them with any store client.
macro_rules! json_value {
    ($($t:ty => $what:literal),* $(,)?) => {$(
        impl Value for $t {
            const WHAT: &'static str = $what;
            fn encode(&self) -> Vec<u8> {
                json_encode(self)
            }
            fn decode(bytes: &[u8]) -> Result<Self, String> {
                json_decode(bytes)
            }
        }
    )*};
}

json_value!(
    RunPlan => "run plan",
    GpuInfo => "GPU identity",
    Claim => "target claim",
    Abort => "abort message",
    Verdict => "verdict",
);

fn json_encode(v: &impl Serialize) -> Vec<u8> {
    serde_json::to_vec(v).expect("protocol values always serialize")
}

fn json_decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, String> {
    serde_json::from_slice(bytes).map_err(|e| e.to_string())
}

/// The first target's claim on the pair.
pub fn target_claim() -> Entry<Claim> {
    Entry::new("target_claim")
}
/// A role's heartbeat.
pub fn alive(role: Role) -> Entry<Counter> {
    Entry::new(format_args!("alive/{role}"))
}
/// The run plan.
pub fn run_plan() -> Entry<RunPlan> {
    Entry::new("run_plan")
}
/// Upstream's: the target's agent metadata.
pub fn target_meta() -> Entry<AgentMetadata> {
    Entry::new("target_meta")
}
/// Upstream's: the target's data buffer.
pub fn target_data_descs() -> Entry<DescList> {
    Entry::new("target_data_descs")
}
/// Upstream's: the target's signal.
pub fn target_signal_descs() -> Entry<DescList> {
    Entry::new("target_signal_descs")
}
/// The target's GPU.
pub fn target_gpu() -> Entry<GpuInfo> {
    Entry::new("target_gpu")
}
/// Upstream's: the initiator's agent metadata.
pub fn initiator_meta() -> Entry<AgentMetadata> {
    Entry::new("initiator_meta")
}
/// The initiator's acknowledgement word.
pub fn initiator_ack_descs() -> Entry<DescList> {
    Entry::new("initiator_ack_descs")
}
/// Round `round` may start.
pub fn go(round: usize) -> Entry<Marker> {
    Entry::new(format_args!("go/{round}"))
}
/// The target's verdict on round `round`.
pub fn verdict(round: usize) -> Entry<Verdict> {
    Entry::new(format_args!("verdict/{round}"))
}
/// The initiator released its views of the target.
pub fn initiator_done() -> Entry<Marker> {
    Entry::new("initiator_done")
}
/// The target is done with the store.
pub fn target_done() -> Entry<Marker> {
    Entry::new("target_done")
}
/// A role failed.
pub fn abort() -> Entry<Abort> {
    Entry::new("abort")
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
