//! Result rows as CSV, from the same `Serialize` rows the JSON carries, so a
//! report declares its columns once (its row struct) and the two files
//! cannot disagree.
//!
//! A row's fields become columns in declaration order; a nested struct
//! flattens to `outer_inner` columns (`time` → `time_p50_ns`), a list to
//! one cell of `;`-separated values, `None` to an empty cell. A column
//! appears if any row has it (an `Option` of a struct that is `None` in
//! every row adds none; one that some rows have sits where the struct
//! declares it). The run's configuration comes first as
//! `# key: value` comment lines (pandas: `read_csv(path, comment="#")`).

use std::path::Path;

use anyhow::{Context, Result};
use serde::Serialize;
use serde_json::{Map, Value};

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
        w.write_record(header.iter().map(|k| row.get(*k).map_or(String::new(), cell)))?;
    }
    let out = w.into_inner().context("finishing the CSV")?;
    std::fs::write(path, out).with_context(|| format!("writing {}", path.display()))
}

/// Puts `v`'s scalar leaves into `cells`, nested keys joined with `_`.
fn flatten(prefix: &str, v: Value, cells: &mut Map<String, Value>) {
    match v {
        Value::Object(m) => {
            for (k, v) in m {
                let key = if prefix.is_empty() { k } else { format!("{prefix}_{k}") };
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
            Row { mode: "ht", time: None, ranks: vec![1, 2], note: "a, b" },
            Row { mode: "ll", time: Some(Inner { p50_ns: 1.5 }), ranks: vec![], note: "" },
        ];
        let path = std::env::temp_dir().join(format!("csv_rows-{}.csv", std::process::id()));
        write_csv(&path, &serde_json::json!({"seed": 7}), &rows).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        assert_eq!(
            text,
            "# seed: 7\nmode,time_p50_ns,ranks,note\nht,,1;2,\"a, b\"\nll,1.5,,\n"
        );
    }
}
