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
//! | key | set by | value |
//! |---|---|---|
//! | `config` | rank 0 | the [`super::config::RunConfig`] (JSON); others must match it |
//! | `rank/<r>/info` | rank r | host, pid, agent name, GPU (JSON) |
//! | `rank/<r>/metadata` | rank r | NIXL agent metadata (`getLocalMD`) |
//! | `rank/<r>/window` | rank r | its window's descriptor list (nixlSerDes) |
//! | `plan` | rank 0 | decisions every rank follows: grid, baseline (JSON) |
//! | `rank/<r>/ptr` | rank r | whether `nixlGetPtr` reached every peer |
//! | `rank/<r>/nccl` | rank r | whether NCCL loaded here |
//! | `nccl_id` | rank 0 | the NCCL unique id (128 bytes) |
//! | `rank/<r>/result` | rank r | its timings, byte counts, verdicts (JSON) |
//! | `barrier/<name>/<r>` | rank r | arrival at a named barrier |
//! | `alive/<r>` | rank r | heartbeat counter |
//! | `abort` | first rank to fail | `rank r: why` |
//! | `left`, `gone` | every rank | counters of the teardown |

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

    fn key(&self, rest: &str) -> String {
        format!("{}{rest}", self.prefix)
    }

    pub fn config(&self) -> String {
        self.key("config")
    }
    pub fn plan(&self) -> String {
        self.key("plan")
    }
    pub fn nccl_id(&self) -> String {
        self.key("nccl_id")
    }
    pub fn abort(&self) -> String {
        self.key("abort")
    }
    pub fn left(&self) -> String {
        self.key("left")
    }
    pub fn gone(&self) -> String {
        self.key("gone")
    }
    /// `rank/<r>/<what>`: info, metadata, window, store, nccl, result.
    pub fn rank(&self, r: u32, what: &str) -> String {
        self.key(&format!("rank/{r}/{what}"))
    }
    pub fn alive(&self, r: u32) -> String {
        self.key(&format!("alive/{r}"))
    }
    pub fn barrier(&self, name: &str, r: u32) -> String {
        self.key(&format!("barrier/{name}/{r}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_live_under_the_prefix() {
        let k = Keys::new("/worker/attempt_0/nixl_ep/");
        assert_eq!(
            k.rank(1, "metadata"),
            "/worker/attempt_0/nixl_ep/rank/1/metadata"
        );
        assert_eq!(
            k.barrier("ready", 2),
            "/worker/attempt_0/nixl_ep/barrier/ready/2"
        );
        assert_eq!(Keys::new("nixl_ep/").abort(), "nixl_ep/abort");
    }
}
