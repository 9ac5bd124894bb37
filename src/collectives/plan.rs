//! The run every rank agrees on: which operations, algorithms, paths,
//! types and sizes, in which order (the cases), and rank 0's decisions from
//! every rank's GPU (the block limit, the baseline).

use serde::{Deserialize, Serialize};

use super::case::{Case, count_for};
use super::layout::{Algo, AlgoChoice, Dtype, Path};
use super::ops::Op;
use super::tune::TuneTable;
use crate::cli::{UsageError, fmt_bytes};
use crate::gpu::path::refuse_missing;

/// In place, out of place, or both (`--place`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Place {
    Out,
    In,
    Both,
}

impl Place {
    pub fn in_place(self) -> Vec<bool> {
        match self {
            Place::Out => vec![false],
            Place::In => vec![true],
            Place::Both => vec![false, true],
        }
    }
}

/// How the timed calls reach the GPU (`--launch`): each launched on the
/// stream back to back, or all captured once into a CUDA graph and that
/// graph launched (nccl-tests' `-G`). NCCL's calls are timed the same way.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Launch {
    #[default]
    Stream,
    Graph,
}

impl Launch {
    pub fn name(self) -> &'static str {
        match self {
            Launch::Stream => "stream",
            Launch::Graph => "graph",
        }
    }
}

/// The memory-synchronization domain our calls are launched in
/// (`--sync-domain`, Hopper; [`crate::gpu::launch::LaunchAs::remote_domain`]):
/// CUDA's default, or the remote domain NCCL launches its kernels in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum SyncDomain {
    #[default]
    Default,
    Remote,
}

/// The inputs (`--data`): small integers, whose sums are exact in bf16 and
/// f32 in any order (every output element must equal the reference), or
/// uniform random values in [-1, 1) (rounded to the type), whose sums are
/// compared within 2·N·u·Σ|x| of the f32 sum in rank order (u = 2^-24 for
/// f32, 2^-8 for bf16): any order of additions in the type stays inside it,
/// so NCCL's results pass too.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum DataMode {
    #[default]
    Exact,
    Random,
}

/// What every rank must run the same way (rank 0's is checked against
/// every other rank's).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunConfig {
    pub ranks: u32,
    pub ops: Vec<Op>,
    pub algo: AlgoChoice,
    pub paths: Vec<Path>,
    pub dtypes: Vec<Dtype>,
    pub place: Place,
    /// Buffer sizes, bytes (nccl-tests' size: the whole buffer).
    pub sizes: Vec<u64>,
    pub iters: u32,
    pub warmup: u32,
    /// GPU-side limit of every wait, ns.
    pub timeout_ns: u64,
    /// `--blocks`: the block limit per call, instead of the GPU's share.
    pub blocks: Option<u32>,
    /// `--block-bytes`: a call takes one block per this many bytes of the
    /// elements its blocks divide (up to the block limit); none: each
    /// algorithm's own ([`super::layout::Algo::block_bytes`]).
    #[serde(default)]
    pub block_bytes: Option<u64>,
    /// `--piece-bytes`: one-shot and two-shot cut a block's share into
    /// pieces of at most this many bytes ([`super::layout::pieces`]).
    #[serde(default = "default_piece_bytes")]
    pub piece_bytes: u64,
    pub baseline: bool,
    /// Stream launches or one CUDA graph per case's timed calls.
    #[serde(default)]
    pub launch: Launch,
    /// `--pdl`: our calls by programmatic dependent launch, each free to
    /// start while the kernel before it on the stream ends.
    #[serde(default)]
    pub pdl: bool,
    /// `--sync-domain`: the memory-synchronization domain of our calls.
    #[serde(default)]
    pub sync_domain: SyncDomain,
    /// Exact small integers or random values within a bound.
    #[serde(default)]
    pub data: DataMode,
    /// Test hook: this rank corrupts one output element of its first timed call.
    pub corrupt_rank: Option<u32>,
    /// Survive deaths (`--elastic`, `--plan`): how; none in a fixed run.
    #[serde(default)]
    pub elastic: Option<Elastic>,
    /// `--tuned FILE`: the algorithm and path per size it names, instead of
    /// `algo` and `paths` ([`super::tune`]).
    #[serde(default)]
    pub tuned: Option<TuneTable>,
}

fn default_piece_bytes() -> u64 {
    super::layout::PIECE_BYTES
}

/// How an elastic run goes ([`super::elastic`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Elastic {
    /// A wait on a rank masks it after this long, ns (`--fault-timeout`).
    pub fault_timeout_ns: u64,
    /// Rounds of the sweep, one step per case each (`--rounds`).
    pub rounds: u32,
}

/// One size of one operation and type: our cases there, and NCCL's call.
#[derive(Clone, Debug, PartialEq)]
pub struct Group {
    pub op: Op,
    pub dtype: Dtype,
    pub bytes: u64,
    pub cases: Vec<Case>,
}

impl RunConfig {
    /// Calls per case: the checked warm-up calls, two untimed calls after
    /// the gate of the timed ones, the timed ones each between its own
    /// events, then as many again as one batch between two events
    /// (nccl-tests' time).
    pub fn calls(&self) -> u32 {
        self.warmup + 2 + 2 * self.iters
    }

    /// Every (operation, type, size) in run order with its cases; sizes
    /// are rounded down to whole elements (per rank for allgather and
    /// reduce-scatter), as nccl-tests does, and skipped when none remains.
    pub fn groups(&self) -> Vec<Group> {
        let mut out = Vec::new();
        for &op in &self.ops {
            for &dtype in &self.dtypes {
                for &size in &self.sizes {
                    let count = count_for(op, dtype, self.ranks, size);
                    if count == 0 {
                        continue;
                    }
                    let mut cases = Vec::new();
                    let probe = Case {
                        op,
                        algo: Algo::OneShot,
                        path: Path::Store,
                        dtype,
                        in_place: false,
                        count,
                    };
                    let bytes = probe.bytes(self.ranks);
                    for (algo, path) in self.choices(op, dtype, bytes) {
                        for in_place in self.place.in_place() {
                            cases.push(Case {
                                op,
                                algo,
                                path,
                                dtype,
                                in_place,
                                count,
                            });
                        }
                    }
                    if cases.is_empty() {
                        continue;
                    }
                    out.push(Group {
                        op,
                        dtype,
                        bytes: probe.bytes(self.ranks),
                        cases,
                    });
                }
            }
        }
        out
    }

    /// The (algorithm, path) pairs a size of `op` runs: the tuned table's,
    /// where it has one that runs there; else `--algo` over `--path`
    /// (`auto` when tuned).
    fn choices(&self, op: Op, dtype: Dtype, bytes: u64) -> Vec<(Algo, Path)> {
        let spec = op.spec();
        let tuned = (self.tuned.as_ref())
            .and_then(|t| t.pick(op, dtype, bytes))
            .filter(|&(algo, path)| spec.runs(algo, bytes, path));
        if let Some(choice) = tuned {
            return vec![choice];
        }
        let choice = if self.tuned.is_some() {
            AlgoChoice::Auto
        } else {
            self.algo
        };
        let algos = spec.chosen(choice, bytes, self.ranks);
        if choice == AlgoChoice::Auto {
            // Auto's list is a preference: each path runs the first that runs there.
            let first = |&path: &Path| {
                algos
                    .iter()
                    .find(|&&a| spec.runs(a, bytes, path))
                    .map(|&a| (a, path))
            };
            return self.paths.iter().filter_map(first).collect();
        }
        let mut out = Vec::new();
        for algo in algos {
            for &path in self.paths.iter().filter(|&&p| spec.runs(algo, bytes, p)) {
                out.push((algo, path));
            }
        }
        out
    }

    /// The elastic run's fault timeout, ns; 0 in a fixed run.
    pub fn fault_timeout_ns(&self) -> u64 {
        self.elastic.map_or(0, |e| e.fault_timeout_ns)
    }

    /// Steps of an elastic run: its cases × its rounds (0 in a fixed run).
    pub fn elastic_steps(&self) -> u64 {
        let cases: usize = self.groups().iter().map(|g| g.cases.len()).sum();
        self.elastic
            .map_or(0, |e| cases as u64 * u64::from(e.rounds))
    }

    /// Refuses a path collectives lacks, and a run the kernels cannot do
    /// (too many ranks, LL where it does not run, an operation with no size).
    pub fn validate(&self) -> Result<(), UsageError> {
        refuse_missing(super::PROGRAM.name, &super::layout::PATHS, &self.paths).map_err(|e| {
            UsageError(format!(
                "{e}; its LL allreduce is --algo ll, on the store path"
            ))
        })?;
        if self.ranks > super::layout::MAX_RANKS {
            return Err(UsageError(format!(
                "{} ranks: the kernels are written for at most {}",
                self.ranks,
                super::layout::MAX_RANKS
            )));
        }
        if self.algo == AlgoChoice::Ring && !self.paths.contains(&Path::Store) {
            return Err(UsageError(
                "--algo ring runs on the store path only (nixlPut copies, it cannot add on the way): use --path store or both"
                    .into(),
            ));
        }
        let lines = match self.algo {
            AlgoChoice::Ll => Some(("ll", super::layout::LL_MAX_BYTES)),
            AlgoChoice::Ll128 => Some(("ll128", super::layout::LL128_MAX_BYTES)),
            AlgoChoice::TwoShotLl128 => Some(("two-shot-ll128", super::layout::LL128_MAX_BYTES)),
            _ => None,
        };
        if let Some((name, max)) = lines {
            if !self.paths.contains(&Path::Store) {
                return Err(UsageError(format!(
                    "--algo {name} runs on the store path only (its lines need peer pointers): use --path store or both"
                )));
            }
            if self.sizes[0] > max {
                return Err(UsageError(format!(
                    "--algo {name} runs up to {}: lower -b",
                    fmt_bytes(max)
                )));
            }
        }
        let largest = *self.sizes.last().unwrap_or(&0);
        for &op in &self.ops {
            for &dtype in &self.dtypes {
                if count_for(op, dtype, self.ranks, largest) == 0 {
                    let need = dtype.bytes() * u64::from(self.ranks);
                    return Err(UsageError(format!(
                        "{} of {} on {} ranks needs a multiple of {need} bytes ({} per rank); -e {} holds none: \
                         raise -e to at least {need}",
                        op.name(),
                        dtype.name(),
                        self.ranks,
                        dtype.bytes(),
                        fmt_bytes(largest),
                    )));
                }
            }
        }
        Ok(())
    }

    /// The largest buffer of the run, bytes (sizes the window).
    pub fn max_bytes(&self) -> u64 {
        self.groups().iter().map(|g| g.bytes).max().unwrap_or(16)
    }

    /// The largest buffer of the run's LL128 calls, bytes (sizes the
    /// window's LL128 area); 0 when it has none.
    pub fn ll128_bytes(&self) -> u64 {
        (self.groups().iter())
            .filter(|g| g.cases.iter().any(|c| c.algo.ll128_lines()))
            .map(|g| g.bytes)
            .max()
            .unwrap_or(0)
    }
}

/// Rank 0's decisions, from every rank's GPU.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    /// Blocks per call at most: the smallest share of a GPU's resident
    /// blocks among the ranks (ranks sharing a GPU split it).
    pub max_blocks: u32,
    /// Ranks on the busiest GPU.
    pub max_ranks_on_gpu: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> RunConfig {
        RunConfig {
            ranks: 3,
            ops: Op::all().to_vec(),
            algo: AlgoChoice::All,
            paths: vec![Path::Store, Path::Put],
            dtypes: vec![Dtype::F32],
            place: Place::Both,
            sizes: vec![8, 1 << 20],
            iters: 2,
            warmup: 1,
            timeout_ns: 1,
            blocks: None,
            block_bytes: None,
            piece_bytes: crate::collectives::layout::PIECE_BYTES,
            tuned: None,
            baseline: true,
            launch: Launch::Stream,
            pdl: false,
            sync_domain: SyncDomain::Default,
            data: DataMode::Exact,
            corrupt_rank: None,
            elastic: None,
        }
    }

    #[test]
    fn auto_runs_on_each_path_the_first_of_its_choices_that_runs_there() {
        let c = RunConfig {
            algo: AlgoChoice::Auto,
            ..cfg()
        };
        let big = crate::collectives::ops::AUTO_RING_MIN;
        for (op, other) in [
            (Op::Allreduce, Algo::TwoShot),
            (Op::ReduceScatter, Algo::OneShot),
        ] {
            let want = vec![(Algo::Ring, Path::Store), (other, Path::Put)];
            assert_eq!(c.choices(op, Dtype::F32, big), want, "{op:?}");
        }
        assert_eq!(
            c.choices(Op::Allgather, Dtype::F32, big),
            vec![(Algo::OneShot, Path::Store), (Algo::OneShot, Path::Put)]
        );
        assert_eq!(
            c.choices(Op::Allreduce, Dtype::F32, 16 << 20),
            vec![(Algo::TwoShot, Path::Store), (Algo::TwoShot, Path::Put)]
        );
    }

    #[test]
    fn groups_round_sizes_like_nccl_tests_and_list_every_case() {
        let c = cfg();
        let g = c.groups();
        // allreduce: both sizes; allgather/reduce-scatter: 8 B holds no f32 per rank on 3 ranks.
        assert_eq!(g.iter().filter(|g| g.op == Op::Allreduce).count(), 2);
        assert_eq!(g.iter().filter(|g| g.op == Op::Allgather).count(), 1);
        let ag = g.iter().find(|g| g.op == Op::Allgather).unwrap();
        assert_eq!(ag.bytes, (1 << 20) / 12 * 12);
        assert_eq!(ag.cases.len(), 6); // one shot × 2 paths × 2 places, LL128 × store × 2
        assert_eq!(g[0].cases.len(), 12); // allreduce 8 B: 2 algorithms × 2 × 2, LL and LL128 × store × 2
        assert_eq!(g[1].cases.len(), 14); // 1 MiB: no LL; two-shot in LL128 lines and the ring × store × 2
        assert!(c.validate().is_ok());
        let small = RunConfig {
            sizes: vec![8],
            ..cfg()
        };
        assert!(small.validate().unwrap_err().0.contains("at least 12"));
        assert_eq!(c.max_bytes(), 1 << 20);
    }

    #[test]
    fn a_tuned_table_picks_one_case_per_size_and_auto_where_it_cannot() {
        let case = |algo, path, count| Case {
            op: Op::Allreduce,
            algo,
            path,
            dtype: Dtype::F32,
            in_place: false,
            count,
        };
        let timed = vec![
            (case(Algo::Ll, Path::Store, 2), 8.0),
            (case(Algo::OneShot, Path::Put, 2), 9.0),
            (case(Algo::TwoShot, Path::Put, 1 << 18), 20.0),
        ];
        let c = RunConfig {
            ops: vec![Op::Allreduce],
            place: Place::Out,
            sizes: vec![8, 1 << 20, 1 << 30],
            tuned: Some(TuneTable::fastest("H100", 3, "stream", &timed)),
            ..cfg()
        };
        let g = c.groups();
        let pairs = |i: usize| -> Vec<(Algo, Path)> {
            g[i].cases.iter().map(|k| (k.algo, k.path)).collect()
        };
        assert_eq!(pairs(0), vec![(Algo::Ll, Path::Store)]);
        assert_eq!(pairs(1), vec![(Algo::TwoShot, Path::Put)]);
        assert_eq!(pairs(2), vec![(Algo::TwoShot, Path::Put)]);
        // A table whose only entry cannot run a size: auto over --path.
        let ll_only = RunConfig {
            tuned: Some(TuneTable::fastest("H100", 3, "stream", &timed[..1])),
            ..c
        };
        let g = ll_only.groups();
        let big: Vec<_> = g[2].cases.iter().map(|k| (k.algo, k.path)).collect();
        assert_eq!(
            big,
            vec![(Algo::Ring, Path::Store), (Algo::TwoShot, Path::Put)]
        );
    }
}
