//! How a kernel's data reaches a peer: the one data-path enum of every
//! program here. Each parses its `--path` into [`Path`] and refuses a path
//! it does not implement with a usage error (exit 2, [`refuse_missing`]):
//!
//! | program          | put | store | ll | ll128 |
//! |------------------|-----|-------|----|-------|
//! | `simple_write`   | yes | yes   | yes | yes (warp and block level) |
//! | `pipeline`       | yes | yes   | yes | no |
//! | `collectives`    | yes | yes   | no (its LL kernels are `--algo ll`) | no |
//! | `ep`             | yes | yes   | no | no |
//! | `put_and_signal` | yes | yes   | no | no |
//!
//! (`simple_write`'s floor row stores a bare flag and moves no data: not a
//! path a user picks, so it stays `simple_write`'s own notion,
//! `simple_write::kernels::WritePath`.)

use serde::{Deserialize, Serialize};

use crate::cli::UsageError;

/// A data path. Serialized (JSON, CSV) and named on the command line as
/// `put` / `store` / `ll` / `ll128`; [`Path::code`] is what the kernels take.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Path {
    /// `nixlPut` + `nixlAtomicAdd`: any UCX device transport (cuda_ipc over
    /// NVLink, RDMA with GPU-initiated communication).
    Put,
    /// `nixlGetPtr` + plain 16-byte stores + a release signal: the peer's
    /// memory mapped into ours (cuda_ipc: NVLink or PCIe) only.
    Store,
    /// `nixlGetPtr` + 16-byte LL lines {data, seq, data, seq} that carry
    /// their own flag (NCCL's LL protocol, `cuda/ll.cuh`): no fence, no
    /// signal, half the bytes are payload. Needs 8-byte halves to arrive
    /// whole: NVLink and within one GPU, not PCIe peer writes or RDMA.
    Ll,
    /// `nixlGetPtr` + 128-byte LL128 lines: 120 payload bytes and one
    /// 8-byte flag, written by eight lanes of a warp with one 16-byte store
    /// each (NCCL's LL128 protocol, `cuda/ll.cuh`): no fence, no signal,
    /// 15/16 of the bytes are payload. Needs a warp's 128-byte store to
    /// arrive whole: NVLink, not PCIe or RDMA; warp and block level only.
    Ll128,
}

impl Path {
    /// Every path, in the order of [`Path::code`].
    pub const ALL: [Path; 4] = [Path::Put, Path::Store, Path::Ll, Path::Ll128];

    /// Lower-case name, as on the command line and in results.
    pub fn name(self) -> &'static str {
        match self {
            Path::Put => "put",
            Path::Store => "store",
            Path::Ll => "ll",
            Path::Ll128 => "ll128",
        }
    }

    /// The code the kernels take. Every `.cu` numbers its paths the same
    /// way, as far as it has them: `PATH_PUT` 0, `PATH_STORE` 1, `PATH_LL` 2,
    /// `PATH_LL128` 3 in `cuda/kernels.cu` (its `PATH_FLAG` 4 is
    /// `simple_write::kernels::WritePath`'s), `PIPE_PATH_*` in
    /// `cuda/pipeline.cu`, `COLL_PATH_*` (put, store) in
    /// `cuda/collectives.cu`, `EP_PATH_*` (put, store) in
    /// `cuda/ep_common.cuh`.
    pub fn code(self) -> u32 {
        match self {
            Path::Put => 0,
            Path::Store => 1,
            Path::Ll => 2,
            Path::Ll128 => 3,
        }
    }

    /// The line format of the paths whose lines carry their own flag (LL,
    /// LL128); `None` for put and store.
    pub fn lines(self) -> Option<&'static crate::gpu::ll::Format> {
        match self {
            Path::Ll => Some(&crate::gpu::ll::LL),
            Path::Ll128 => Some(&crate::gpu::ll::LL128),
            Path::Put | Path::Store => None,
        }
    }

    /// Bytes that cross the link per payload byte: 2 for LL (half of every
    /// line is its flag), 128/120 for LL128, else 1.
    pub fn wire_factor(self) -> f64 {
        match self {
            Path::Ll => 2.0,
            Path::Ll128 => 128.0 / 120.0,
            Path::Put | Path::Store => 1.0,
        }
    }
}

/// `--path`: each path by [`Path::name`], with one line of help.
impl clap::ValueEnum for Path {
    fn value_variants<'a>() -> &'a [Self] {
        &Self::ALL
    }
    fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
        let help = match self {
            Path::Put => "nixlPut + nixlAtomicAdd: any UCX device transport, RDMA included",
            Path::Store => {
                "nixlGetPtr + 16-byte stores + a release signal: NVLink/PCIe peers (cuda_ipc) only"
            }
            Path::Ll => {
                "nixlGetPtr + 16-byte lines {data, seq, data, seq}, no fence or signal: NVLink only"
            }
            Path::Ll128 => {
                "nixlGetPtr + 128-byte lines (120 payload bytes + a flag) a warp stores at once: NVLink only, warp/block level"
            }
        };
        Some(clap::builder::PossibleValue::new(self.name()).help(help))
    }
}

impl std::fmt::Display for Path {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The first of `asked` that `program` does not implement, refused: a
/// usage error (exit 2) naming it and the paths `program` offers, in the
/// order of `offered`.
pub fn refuse_missing(program: &str, offered: &[Path], asked: &[Path]) -> Result<(), UsageError> {
    match asked.iter().find(|p| !offered.contains(p)) {
        None => Ok(()),
        Some(p) => {
            let names: Vec<&str> = offered.iter().map(|o| o.name()).collect();
            Err(UsageError(format!(
                "--path {p}: {program} has no {p} path (it offers {})",
                names.join(", ")
            )))
        }
    }
}

/// `--path` of `ep` and `collectives`: one data path, or `both` (put and
/// store, the two they implement) in turn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PathChoice {
    One(Path),
    Both,
}

impl PathChoice {
    /// The paths to run, in order; both: `first`, then the other of put
    /// and store.
    pub fn paths(self, first: Path) -> Vec<Path> {
        let other = match first {
            Path::Put => Path::Store,
            _ => Path::Put,
        };
        match self {
            PathChoice::One(p) => vec![p],
            PathChoice::Both => vec![first, other],
        }
    }
}

/// Every [`Path`] by its name, then `both`. `ll` and `ll128` parse, so
/// the program can refuse them by name ([`refuse_missing`]), but are left
/// out of the help: neither program offers them.
impl clap::ValueEnum for PathChoice {
    fn value_variants<'a>() -> &'a [Self] {
        &[
            PathChoice::One(Path::Put),
            PathChoice::One(Path::Store),
            PathChoice::One(Path::Ll),
            PathChoice::One(Path::Ll128),
            PathChoice::Both,
        ]
    }
    fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
        match self {
            PathChoice::One(p) => clap::ValueEnum::to_possible_value(p)
                .map(|v| v.hide(matches!(p, Path::Ll | Path::Ll128))),
            PathChoice::Both => Some(
                clap::builder::PossibleValue::new("both")
                    .help("put and store, one after the other"),
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::ValueEnum;

    #[test]
    fn names_and_codes_are_what_results_and_kernels_read() {
        let names: Vec<&str> = Path::ALL.iter().map(|p| p.name()).collect();
        assert_eq!(names, ["put", "store", "ll", "ll128"]);
        assert_eq!(Path::ALL.map(Path::code), [0, 1, 2, 3]);
        assert_eq!(serde_json::to_string(&Path::Ll).unwrap(), "\"ll\"");
        assert_eq!(
            serde_json::from_str::<Path>("\"store\"").unwrap(),
            Path::Store
        );
    }

    #[test]
    fn a_path_a_program_lacks_is_refused_by_name() {
        let both = [Path::Put, Path::Store];
        assert!(refuse_missing("ep", &both, &both).is_ok());
        let e = refuse_missing("ep", &both, &[Path::Put, Path::Ll])
            .unwrap_err()
            .0;
        assert_eq!(e, "--path ll: ep has no ll path (it offers put, store)");
    }

    #[test]
    fn both_is_put_and_store_in_the_order_asked() {
        let c = PathChoice::from_str("both", false).unwrap();
        assert_eq!(c.paths(Path::Store), [Path::Store, Path::Put]);
        assert_eq!(c.paths(Path::Put), [Path::Put, Path::Store]);
        let ll = PathChoice::from_str("ll", false).unwrap();
        assert_eq!(ll.paths(Path::Put), [Path::Ll]);
    }
}
