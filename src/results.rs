//! What every program's results carry: the run's environment
//! ([`RunEnv`], captured once for simple_write and ep) and the CSV writer.
//!
//! CSV is written from the same `Serialize` rows the JSON carries, so a
//! report declares its columns once (its row struct) and the two files
//! cannot disagree. A row's fields become columns in declaration order; a nested struct
//! flattens to `outer_inner` columns (`time` → `time_p50_ns`), a list to
//! one cell of `;`-separated values, `None` to an empty cell. A column
//! appears if any row has it (an `Option` of a struct that is `None` in
//! every row adds none; one that some rows have sits where the struct
//! declares it). The run's configuration comes first as
//! `# key: value` comment lines (pandas: `read_csv(path, comment="#")`).

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result};
use serde::Serialize;
use serde_json::{Map, Value};

/// `--json FILE`, `--csv FILE`: where an N-rank program (`ep`,
/// `collectives`) also writes its results; rank 0 writes them.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct ResultFiles {
    /// Also write the results and the run's configuration as JSON (rank 0).
    #[arg(long, value_name = "FILE")]
    pub json: Option<std::path::PathBuf>,

    /// Also write the results as CSV, the configuration as `#` lines above
    /// them (rank 0).
    #[arg(long, value_name = "FILE")]
    pub csv: Option<std::path::PathBuf>,
}

/// The environment a run's figures were measured in, recorded beside its
/// configuration (flattened into each report's `run` object).
#[derive(Clone, Debug, Default, Serialize)]
pub struct RunEnv {
    /// `simple_write 0.1.0`, `ep 0.1.0`.
    pub tool: String,
    pub command_line: Vec<String>,
    /// Seconds since the Unix epoch at capture.
    pub unix_time: u64,
    pub hostname: Option<String>,
    /// The CUDA driver's version, when a driver loads.
    pub driver_version: Option<String>,
    /// NIXL and UCX as loaded at run time ([`crate::nixl::runtime`]).
    pub nixl_version: Option<String>,
    pub nixl_lib_dir: Option<String>,
    pub ucx_version: Option<String>,
    /// The variables in effect that change what NIXL, UCX, CUDA, NCCL or
    /// the launcher do: `UCX_*`, `NIXL_*`, `CUDA_*`, `NCCL_*`,
    /// `TORCHELASTIC_*`, `MASTER_*`, `LOCAL_WORLD*`.
    pub env: BTreeMap<String, String>,
}

/// The prefixes of [`RunEnv::env`].
const ENV_PREFIXES: [&str; 7] = [
    "UCX_",
    "NIXL_",
    "CUDA_",
    "NCCL_",
    "TORCHELASTIC_",
    "MASTER_",
    "LOCAL_WORLD",
];

impl RunEnv {
    /// What this process can know about where it runs, for `tool`
    /// (`simple_write`, `ep`); what cannot be read (no driver, no NIXL) is
    /// `None`.
    pub fn capture(tool: &str) -> Self {
        let rt = crate::nixl::runtime::load().ok();
        Self {
            tool: format!("{tool} {}", env!("CARGO_PKG_VERSION")),
            command_line: std::env::args().collect(),
            unix_time: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
            hostname: Some(hostname()).filter(|h| !h.is_empty()),
            driver_version: crate::gpu::context::driver_version(),
            nixl_version: rt.as_ref().and_then(|r| r.nixl_version()),
            nixl_lib_dir: rt.as_ref().map(|r| r.lib_dir.display().to_string()),
            ucx_version: rt.as_ref().and_then(|r| r.ucx_version()),
            env: std::env::vars()
                .filter(|(k, _)| ENV_PREFIXES.iter().any(|p| k.starts_with(p)))
                .collect(),
        }
    }
}

/// Writes `rows` to `path` as CSV after `info` as `# key: value` lines.
///
/// Errors: a row that does not serialize to a JSON object, or the file
/// cannot be written (the message names it).
pub fn write_csv<R: Serialize>(path: &Path, info: &impl Serialize, rows: &[R]) -> Result<()> {
    let flat: Vec<Map<String, Value>> = rows
        .iter()
        .map(|r| {
            let mut cells = Map::new();
            flatten("", serde_json::to_value(r)?, &mut cells);
            Ok(cells)
        })
        .collect::<Result<_>>()?;
    // Every row's keys, a key new in a later row placed after the one
    // before it there: declaration order whichever rows had the options.
    let mut header: Vec<&String> = Vec::new();
    for row in &flat {
        let mut at = 0;
        for key in row.keys() {
            at = match header.iter().position(|k| *k == key) {
                Some(i) => i + 1,
                None => {
                    header.insert(at, key);
                    at + 1
                }
            };
        }
    }
    let mut out = Vec::new();
    if let Value::Object(m) = serde_json::to_value(info)? {
        for (k, v) in m {
            out.extend(format!("# {k}: {v}\n").into_bytes());
        }
    }
    let mut w = csv::Writer::from_writer(out);
    w.write_record(&header)?;
    for row in &flat {
        w.write_record(
            header
                .iter()
                .map(|k| row.get(*k).map_or(String::new(), cell)),
        )?;
    }
    let out = w.into_inner().context("finishing the CSV")?;
    std::fs::write(path, out).with_context(|| format!("writing {}", path.display()))
}

/// Puts `v`'s scalar leaves into `cells`, nested keys joined with `_`.
fn flatten(prefix: &str, v: Value, cells: &mut Map<String, Value>) {
    match v {
        Value::Object(m) => {
            for (k, v) in m {
                let key = if prefix.is_empty() {
                    k
                } else {
                    format!("{prefix}_{k}")
                };
                flatten(&key, v, cells);
            }
        }
        Value::Null => {}
        v => {
            cells.insert(prefix.to_owned(), v);
        }
    }
}

/// One cell: strings bare, lists `;`-joined, numbers and booleans as JSON
/// writes them.
fn cell(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Array(items) => items.iter().map(cell).collect::<Vec<_>>().join(";"),
        v => v.to_string(),
    }
}

/// This machine's host name (Linux: `/proc/sys/kernel/hostname`), empty
/// where it cannot be read.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Serialize)]
    struct Inner {
        p50_ns: f64,
    }

    #[derive(Serialize)]
    struct Row {
        mode: &'static str,
        time: Option<Inner>,
        ranks: Vec<u32>,
        note: &'static str,
    }

    #[test]
    fn nested_fields_flatten_in_order_and_cells_are_quoted() {
        let rows = [
            Row {
                mode: "ht",
                time: None,
                ranks: vec![1, 2],
                note: "a, b",
            },
            Row {
                mode: "ll",
                time: Some(Inner { p50_ns: 1.5 }),
                ranks: vec![],
                note: "",
            },
        ];
        let path = std::env::temp_dir().join(format!("results-csv-{}.csv", std::process::id()));
        write_csv(&path, &serde_json::json!({"seed": 7}), &rows).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        assert_eq!(
            text,
            "# seed: 7\nmode,time_p50_ns,ranks,note\nht,,1;2,\"a, b\"\nll,1.5,,\n"
        );
    }
}
