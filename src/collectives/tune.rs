//! The tuner: which algorithm and data path each operation, type and size
//! ran fastest with on this machine. `collectives --tune FILE` writes it
//! from a sweep's rows (our time per call, p50 of the slowest rank);
//! `--tuned FILE` runs each size with the entry of the nearest size of the
//! same operation and type, as NCCL's tuner plugins pick a protocol per
//! size. A size the table cannot serve (no entry, or its algorithm does not
//! run there) falls back to `--algo auto`, the table built in from the
//! 2026-11-27 matrices ([`super::ops::allreduce::auto_one_shot_max`]).

use std::path::Path as FsPath;

use serde::{Deserialize, Serialize};

use super::case::Case;
use super::layout::{Algo, Dtype, Path};
use super::ops::Op;
use crate::cli::UsageError;

/// One size's choice and what it measured.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TuneEntry {
    pub op: Op,
    pub dtype: Dtype,
    /// nccl-tests' size of the buffer, bytes.
    pub bytes: u64,
    pub algo: Algo,
    pub path: Path,
    /// Its time per call, p50 of the slowest rank, µs.
    pub time_p50_us: f64,
}

/// A tuned table, for one rank count and launch mode, as the JSON file
/// holds it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TuneTable {
    /// The GPU it was measured on (`cuDeviceGetName`).
    pub gpu: String,
    pub ranks: u32,
    /// `stream` or `graph`.
    pub launch: String,
    pub entries: Vec<TuneEntry>,
}

impl TuneTable {
    /// The fastest of `timed` (each case with its time per call, µs) for
    /// every operation, type and size; ties keep the first.
    pub fn fastest(gpu: &str, ranks: u32, launch: &str, timed: &[(Case, f64)]) -> Self {
        let mut entries: Vec<TuneEntry> = Vec::new();
        for (case, us) in timed {
            let bytes = case.bytes(ranks);
            let e = TuneEntry {
                op: case.op,
                dtype: case.dtype,
                bytes,
                algo: case.algo,
                path: case.path,
                time_p50_us: *us,
            };
            let same = |x: &TuneEntry| (x.op, x.dtype, x.bytes) == (e.op, e.dtype, e.bytes);
            match entries.iter_mut().find(|x| same(x)) {
                Some(x) if e.time_p50_us < x.time_p50_us => *x = e,
                Some(_) => {}
                None => entries.push(e),
            }
        }
        Self {
            gpu: gpu.to_string(),
            ranks,
            launch: launch.to_string(),
            entries,
        }
    }

    /// The algorithm and path of the entry of `op` and `dtype` whose size
    /// is nearest `bytes` (by ratio; the smaller of two equally near).
    pub fn pick(&self, op: Op, dtype: Dtype, bytes: u64) -> Option<(Algo, Path)> {
        let distance = |b: u64| (b.max(bytes) as f64) / (b.min(bytes).max(1) as f64);
        (self.entries.iter())
            .filter(|e| e.op == op && e.dtype == dtype)
            .min_by(|a, b| {
                (distance(a.bytes), a.bytes)
                    .partial_cmp(&(distance(b.bytes), b.bytes))
                    .unwrap_or(std::cmp::Ordering::Equal)
            })
            .map(|e| (e.algo, e.path))
    }

    /// Reads `path`. Errors (usage errors, exit 2): unreadable, not a
    /// tuned table, or measured on another number of ranks than `ranks`.
    pub fn read(path: &FsPath, ranks: u32) -> Result<Self, UsageError> {
        let name = path.display();
        let text = std::fs::read_to_string(path).map_err(|e| {
            UsageError(format!(
                "--tuned {name}: {e} (collectives --tune FILE writes one)"
            ))
        })?;
        let t: Self = serde_json::from_str(&text)
            .map_err(|e| UsageError(format!("--tuned {name}: not a tuned table ({e})")))?;
        if t.ranks != ranks {
            return Err(UsageError(format!(
                "--tuned {name}: measured on {} ranks, this run has {ranks}: tune on {ranks} (collectives --tune)",
                t.ranks
            )));
        }
        Ok(t)
    }

    /// Writes the table to `path` as JSON.
    pub fn write(&self, path: &FsPath) -> anyhow::Result<()> {
        let text = serde_json::to_string_pretty(self)?;
        std::fs::write(path, text + "\n")
            .map_err(|e| anyhow::anyhow!("writing the tuned table {}: {e}", path.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn case(op: Op, algo: Algo, path: Path, count: u64) -> Case {
        Case {
            op,
            algo,
            path,
            dtype: Dtype::F32,
            in_place: false,
            count,
        }
    }

    #[test]
    fn the_fastest_case_of_each_size_is_kept_and_the_nearest_size_is_picked() {
        let ar = Op::Allreduce;
        let timed = vec![
            (case(ar, Algo::OneShot, Path::Put, 2), 9.0),
            (case(ar, Algo::Ll, Path::Store, 2), 8.0),
            (case(ar, Algo::OneShot, Path::Store, 1 << 20), 30.0),
            (case(ar, Algo::TwoShot, Path::Put, 1 << 20), 20.0),
        ];
        let t = TuneTable::fastest("H100", 4, "stream", &timed);
        assert_eq!(t.entries.len(), 2);
        assert_eq!(t.pick(ar, Dtype::F32, 8), Some((Algo::Ll, Path::Store)));
        assert_eq!(t.pick(ar, Dtype::F32, 256), Some((Algo::Ll, Path::Store)));
        assert_eq!(
            t.pick(ar, Dtype::F32, 64 << 10),
            Some((Algo::TwoShot, Path::Put))
        );
        assert_eq!(
            t.pick(ar, Dtype::F32, 1 << 30),
            Some((Algo::TwoShot, Path::Put))
        );
        assert_eq!(t.pick(Op::Allgather, Dtype::F32, 8), None);
        assert_eq!(t.pick(ar, Dtype::Bf16, 8), None);
    }

    #[test]
    fn a_table_round_trips_and_another_rank_count_is_refused() {
        let timed = vec![(case(Op::Allgather, Algo::Ll, Path::Store, 2), 5.0)];
        let t = TuneTable::fastest("H200", 2, "graph", &timed);
        let f = std::env::temp_dir().join(format!("tuned-{}.json", std::process::id()));
        t.write(&f).unwrap();
        assert_eq!(TuneTable::read(&f, 2).unwrap(), t);
        let e = TuneTable::read(&f, 4).unwrap_err();
        assert!(
            e.0.contains("measured on 2 ranks, this run has 4"),
            "{}",
            e.0
        );
        std::fs::write(&f, "{}").unwrap();
        assert!(
            TuneTable::read(&f, 2)
                .unwrap_err()
                .0
                .contains("not a tuned table")
        );
        let _ = std::fs::remove_file(&f);
        assert!(
            TuneTable::read(&f, 2)
                .unwrap_err()
                .0
                .contains("--tune FILE writes one")
        );
    }
}
