//! The docs say what the code does: commands that run as written, defaults
//! as `--help` states them, figures as the committed results give them.

use std::path::Path;
use std::process::Command;

fn read(rel: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)).unwrap()
}

#[test]
fn readme_commands_run_as_written() {
    let readme = read("README.md");
    for line in readme.lines().filter(|l| l.contains("cargo run")) {
        if line.contains("--store libtorch") {
            assert!(
                line.contains("--features libtorch"),
                "needs --features libtorch: {line}"
            );
        }
    }
    // The bare `simple_write …` / `ep …` commands say where the programs come from.
    for needle in ["target/release/", "cargo install --path ."] {
        assert!(readme.contains(needle), "README never says {needle:?}");
    }
}

#[test]
fn simple_write_help_states_the_defaults_the_plan_uses() {
    use nixl_examples::simple_write::plan::auto_blocks;
    let o = Command::new(env!("CARGO_BIN_EXE_simple_write"))
        .arg("--help")
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&o.stdout)
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    assert!(help.contains("one per 16 KiB, at least 32"), "{help}");
    assert!(
        help.contains("256 on the put path, 512 on the store path"),
        "{help}"
    );
    // What "one per 16 KiB, at least 32" means, in the plan's own function.
    assert_eq!(auto_blocks(100 * (16 << 10), 10_000), 100);
    assert_eq!(auto_blocks(8, 10_000), 32);
}

#[test]
fn ep_md_cites_the_guide_section_that_holds_the_argument() {
    let ep = read("docs/EP.md");
    let guide = read("KERNEL_GUIDE.md");
    let line = ep
        .lines()
        .find(|l| l.contains("can never overtake the data"))
        .expect("EP.md's ordering argument");
    let cited = line
        .split("KERNEL_GUIDE.md §")
        .nth(1)
        .expect("a § reference");
    let n: String = cited.chars().take_while(char::is_ascii_digit).collect();
    let title = guide
        .lines()
        .find(|l| l.starts_with(&format!("## {n}. ")))
        .unwrap_or_else(|| panic!("KERNEL_GUIDE.md has no section {n}"));
    assert!(title.contains("Ordering"), "§{n} is {title:?}");
}

/// `simple_write`'s put at 64 MiB on the H100 pair, from the README's table
/// (`| 64 MiB | 372 GB/s | …`: the nixlPut column).
fn put_at_64_mib() -> String {
    let readme = read("README.md");
    let row = readme
        .lines()
        .find(|l| l.starts_with("| 64 MiB |"))
        .expect("the 64 MiB row");
    let put = row.split('|').nth(2).unwrap();
    put.trim().split(' ').next().unwrap().to_string()
}

#[test]
fn simple_writes_put_at_64_mib_is_one_figure() {
    let put = put_at_64_mib();
    let ep = read("docs/EP.md");
    // The figure EP.md's goal cites as simple_write's put on the H100 pair
    // is the README's (the dated sections keep their own runs' figures).
    let goal = ep
        .lines()
        .find(|l| l.contains("GB/s at 64 MiB on the H100 pair"))
        .expect("EP.md cites simple_write's put on the H100 pair");
    assert!(
        goal.contains(&format!("{put} GB/s at 64 MiB on the H100 pair")),
        "README: {put} GB/s; EP.md: {goal}"
    );
}

/// KERNEL_GUIDE §11's claim about the store path against the copy engine
/// holds row by row in the committed run (two H200s, GPU 0 -> GPU 1, block
/// level; the JSON is kept gzipped, read here with the system's gzip).
#[test]
fn the_guides_store_path_claim_matches_its_table() {
    let guide = read("KERNEL_GUIDE.md");
    assert!(guide.contains(
        "the store path beats\n  the copy engine from 16 B to 4 MiB: 1.5–2.5× up to 1 MiB"
    ));
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("docs/results/2026-11-27-h200x2-matrix/sw-0to1-bw.json.gz");
    let out = Command::new("gzip")
        .arg("-dc")
        .arg(&path)
        .output()
        .expect("gzip runs");
    assert!(out.status.success(), "gzip -dc {}", path.display());
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut rows = 0;
    for r in doc["rows"].as_array().unwrap() {
        if r["path"] != "store" {
            continue;
        }
        let size = r["size_bytes"].as_u64().unwrap();
        let ratio =
            r["gb_per_s"].as_f64().unwrap() / r["baselines"]["copy_engine_gbps"].as_f64().unwrap();
        if size <= 4 << 20 {
            assert!(ratio > 1.0, "store path at {size} B: {ratio}");
            rows += 1;
        }
        if size <= 1 << 20 {
            assert!(
                (1.45..2.55).contains(&ratio),
                "store path at {size} B: {ratio}"
            );
        }
    }
    assert!(rows >= 10, "{rows} rows");
}

/// docs/results keeps what a reader looks at (READMEs, tables, JSON/CSV and
/// plots) in at most 3 MiB, and every `docs/results/…` path that README.md,
/// KERNEL_GUIDE.md and docs/*.md cite exists (`dir/name*/` as a glob).
#[test]
fn results_stay_small_and_every_cited_path_exists() {
    use std::path::PathBuf;
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));

    fn bytes_under(dir: &Path) -> u64 {
        let mut total = 0;
        for entry in std::fs::read_dir(dir).unwrap() {
            let entry = entry.unwrap();
            let meta = std::fs::symlink_metadata(entry.path()).unwrap();
            if meta.is_dir() {
                total += bytes_under(&entry.path());
            } else if meta.is_file() {
                total += meta.len();
            }
        }
        total
    }
    let limit = 3 * 1024 * 1024;
    let bytes = bytes_under(&root.join("docs/results"));
    assert!(
        bytes <= limit,
        "docs/results holds {bytes} bytes (limit {limit}); keep READMEs, tables, JSON/CSV and \
         plots, leave raw logs in the script's --out folder"
    );

    /// Whether `comps` (path components, `*` allowed once per component)
    /// name something under `base`; a trailing `/` asks for a folder.
    fn exists(base: &Path, comps: &[&str], want_dir: bool) -> bool {
        let Some((first, rest)) = comps.split_first() else {
            return !want_dir || base.is_dir();
        };
        match first.split_once('*') {
            None => {
                let next = base.join(first);
                (next.exists() || next.is_symlink()) && exists(&next, rest, want_dir)
            }
            Some((prefix, suffix)) => std::fs::read_dir(base).is_ok_and(|entries| {
                entries.filter_map(Result::ok).any(|e| {
                    let name = e.file_name().to_string_lossy().into_owned();
                    name.len() >= prefix.len() + suffix.len()
                        && name.starts_with(prefix)
                        && name.ends_with(suffix)
                        && exists(&e.path(), rest, want_dir)
                })
            }),
        }
    }

    let mut docs: Vec<PathBuf> = vec![root.join("README.md"), root.join("KERNEL_GUIDE.md")];
    for entry in std::fs::read_dir(root.join("docs")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "md") {
            docs.push(path);
        }
    }
    let (mut cited, mut missing) = (0, Vec::new());
    for doc in &docs {
        let text = std::fs::read_to_string(doc).unwrap();
        for (at, _) in text.match_indices("docs/results") {
            let raw: String = text[at..]
                .chars()
                .take_while(|c| !c.is_whitespace() && !"`'\"()<>[]|,;".contains(*c))
                .collect();
            let path = raw.trim_end_matches(['.', ',', ':', ';', ')', '`']);
            let comps: Vec<&str> = path.split('/').filter(|c| !c.is_empty()).collect();
            cited += 1;
            if !exists(root, &comps, path.ends_with('/')) {
                missing.push(format!(
                    "{}: {path}",
                    doc.strip_prefix(root).unwrap().display()
                ));
            }
        }
    }
    assert!(
        cited >= 10,
        "only {cited} docs/results paths found in the docs"
    );
    assert!(
        missing.is_empty(),
        "the docs cite docs/results paths that do not exist (restore them or fix the citation): {missing:#?}"
    );
}

/// KERNEL_GUIDE.md keeps the lesson; its last section points at the program
/// chapters that moved to docs/. Every `docs/NAME.md` the guide names exists,
/// and each moved chapter is among them.
#[test]
fn the_guide_points_at_chapters_that_exist() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let guide = read("KERNEL_GUIDE.md");
    let mut named = Vec::new();
    for (at, _) in guide.match_indices("`docs/") {
        let path: String = guide[at + 1..].chars().take_while(|&c| c != '`').collect();
        if path.ends_with(".md") {
            assert!(
                root.join(&path).is_file(),
                "KERNEL_GUIDE.md names {path}, which does not exist"
            );
            named.push(path);
        }
    }
    for moved in [
        "docs/SMALL_MESSAGES.md",
        "docs/COLLECTIVES.md",
        "docs/PIPELINE.md",
        "docs/EP.md",
    ] {
        assert!(
            named.iter().any(|p| p == moved),
            "KERNEL_GUIDE.md does not point at {moved}"
        );
    }
}
