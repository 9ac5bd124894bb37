//! How an N-rank kernel's data reaches a peer: the two data paths of NIXL's
//! device API that `ep` and `collectives` (and `put_and_signal`) take.
//! (`simple_write` has two more, LL lines and the bare flag of its floor
//! row: `simple_write::kernels::Path`.)

use serde::{Deserialize, Serialize};

/// A data path. Serialized as `put` / `store`; [`Path::code`] is what the
/// kernels take (`*_PATH_PUT` = 0, `*_PATH_STORE` = 1 in `cuda/`).
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
pub enum Path {
    /// `nixlPut` + `nixlAtomicAdd`: any UCX device transport (cuda_ipc over
    /// NVLink, RDMA with GPU-initiated communication).
    Put,
    /// `nixlGetPtr` + plain 16-byte stores + a release signal: the peer's
    /// memory mapped into ours (NVLink / cuda_ipc only).
    Store,
}

impl Path {
    pub fn name(self) -> &'static str {
        match self {
            Path::Put => "put",
            Path::Store => "store",
        }
    }

    /// The code the kernels take.
    pub fn code(self) -> u32 {
        match self {
            Path::Put => 0,
            Path::Store => 1,
        }
    }
}

/// `--path` of `ep` and `collectives`: one data path, or both in turn.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum PathChoice {
    Put,
    Store,
    Both,
}

impl PathChoice {
    /// The paths to run, in order; both: `first`, then the other.
    pub fn paths(self, first: Path) -> Vec<Path> {
        let other = match first {
            Path::Put => Path::Store,
            Path::Store => Path::Put,
        };
        match self {
            PathChoice::Put => vec![Path::Put],
            PathChoice::Store => vec![Path::Store],
            PathChoice::Both => vec![first, other],
        }
    }
}
