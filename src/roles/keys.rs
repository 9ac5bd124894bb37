//! Store keys of `simple_write`.
//!
//! The first four are upstream's, set in upstream's order; the rest are
//! ours: the run plan, the initiator's acknowledgement word, the target's
//! per-round verdict and the teardown handshake that keeps either side from
//! freeing memory the other still maps, or from closing the store under
//! the other.

/// Agent metadata of the target (`getLocalMD`).
pub const TARGET_META: &str = "NIXL_2PROC/target_meta";
/// nixlSerDes descriptor list of the target's data buffer.
pub const TARGET_DATA_DESCS: &str = "NIXL_2PROC/target_data_descs";
/// nixlSerDes descriptor list of the target's 8-byte signal.
pub const TARGET_SIGNAL_DESCS: &str = "NIXL_2PROC/target_signal_descs";
/// Agent metadata of the initiator.
pub const INITIATOR_META: &str = "NIXL_2PROC/initiator_meta";

/// The [`super::plan::RunPlan`], set by the initiator before anything else.
pub const RUN_PLAN: &str = "NIXL_2PROC/run_plan";
/// nixlSerDes descriptor list of the initiator's 8-byte acknowledgement word.
pub const INITIATOR_ACK_DESCS: &str = "NIXL_2PROC/initiator_ack_descs";
/// The target's GPU: `<uuid hex> <ordinal> <name>`, so the initiator can
/// find the same device for its copy-engine baseline.
pub const TARGET_GPU: &str = "NIXL_2PROC/target_gpu";
/// Set by the initiator once its memory views of the target are released.
pub const INITIATOR_DONE: &str = "NIXL_2PROC/initiator_done";
/// Set by the target as its very last store operation.
pub const TARGET_DONE: &str = "NIXL_2PROC/target_done";
/// Set by a side that failed, with its error, so the other stops waiting.
pub const ABORT: &str = "NIXL_2PROC/abort";

/// The target's verdict on round `round`: `ok <checksum>` or `mismatch <details>`.
pub fn verdict(round: usize) -> String {
    format!("NIXL_2PROC/verdict/{round}")
}

/// Set by the initiator right before it starts round `round`, after its
/// baselines, so the target's waits never overlap them.
pub fn go(round: usize) -> String {
    format!("NIXL_2PROC/go/{round}")
}

/// A role's heartbeat counter (see [`super::peer`]).
pub fn alive(role: &str) -> String {
    format!("NIXL_2PROC/alive/{role}")
}

/// Claimed (compare-and-set) by the first target to join; a second target
/// finds it taken and leaves without touching the first pair's keys.
pub const TARGET_CLAIM: &str = "NIXL_2PROC/target_claim";

/// Agent names, as upstream.
pub const INITIATOR_NAME: &str = "initiator";
pub const TARGET_NAME: &str = "target";
