//! Our nixlSerDes codec against the bytes the real NIXL library writes:
//! committed fixtures (scripts/gen_serdes_fixtures.py, from the nixl-cu13
//! wheel's bindings) always, and a live comparison when the bindings can be
//! imported from the project's Python.

use std::path::{Path, PathBuf};
use std::process::Command;

use nixl_examples::nixl::serdes::{Desc, DescList, MemType};

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/serdes")
}

/// The cases of cases.txt as our own lists.
fn cases() -> Vec<(String, DescList)> {
    let text = std::fs::read_to_string(dir().join("cases.txt")).unwrap();
    let num = |s: &str| -> u64 {
        s.strip_prefix("0x").map_or_else(
            || s.parse().unwrap(),
            |h| u64::from_str_radix(h, 16).unwrap(),
        )
    };
    text.lines()
        .map(|l| l.split('#').next().unwrap().trim())
        .filter(|l| !l.is_empty())
        .map(|l| {
            let mut w = l.split_whitespace();
            let name = w.next().unwrap().to_string();
            let mem_type = match w.next().unwrap() {
                "DRAM" => MemType::Dram,
                "VRAM" => MemType::Vram,
                "BLK" => MemType::Blk,
                "OBJ" => MemType::Obj,
                "FILE" => MemType::File,
                other => panic!("unknown memory type {other}"),
            };
            let descs = w
                .map(|d| {
                    let v: Vec<u64> = d.split(',').map(num).collect();
                    Desc {
                        addr: v[0],
                        len: v[1],
                        dev_id: v[2],
                    }
                })
                .collect();
            (name, DescList::new(mem_type, descs))
        })
        .collect()
}

#[test]
fn encodes_exactly_what_nixl_wrote_and_decodes_it_back() {
    for (name, list) in cases() {
        let fixture = std::fs::read(dir().join(format!("{name}.bin"))).unwrap();
        assert_eq!(
            list.encode(),
            fixture,
            "{name}: our bytes differ from NIXL's"
        );
        assert_eq!(
            DescList::decode(&fixture).unwrap(),
            list,
            "{name}: decoding NIXL's bytes"
        );
    }
}

#[test]
fn agrees_with_the_live_library_when_its_bindings_import() {
    let python = std::env::var("PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|_| Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/python"));
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/gen_serdes_fixtures.py");
    let out = Command::new(&python).arg(&script).arg("--stdout").output();
    let out = match out {
        Ok(o) if o.status.success() => o,
        Ok(o) => {
            eprintln!(
                "SKIP live nixlSerDes comparison: {} cannot import the nixl-cu13 bindings ({}) (run scripts/setup.sh)",
                python.display(),
                String::from_utf8_lossy(&o.stderr)
                    .lines()
                    .last()
                    .unwrap_or("")
            );
            return;
        }
        Err(e) => {
            eprintln!(
                "SKIP live nixlSerDes comparison: cannot run {}: {e}",
                python.display()
            );
            return;
        }
    };
    let live: Vec<(String, Vec<u8>)> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let (name, hex) = l.split_once('\t').unwrap();
            let bytes = (0..hex.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
                .collect();
            (name.to_string(), bytes)
        })
        .collect();
    let ours = cases();
    assert_eq!(live.len(), ours.len());
    for ((name, bytes), (_, list)) in live.iter().zip(&ours) {
        assert_eq!(
            &list.encode(),
            bytes,
            "{name}: live NIXL bytes differ from ours"
        );
    }
}
