//! Every script behaves like the programs at the command line: `--help`
//! prints its header and exits 0 without doing anything else, an unknown
//! option exits 2, and the GPU scripts on a machine without a GPU say so
//! and exit non-zero (never a table of runs that did not happen).
//!
//! The scripts run with `cargo` and `nvidia-smi` replaced on PATH by stubs
//! that leave a mark when called (cargo) or list no GPU (nvidia-smi), so a
//! side effect shows and "no GPU" holds on any machine.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// An empty folder of this test process's own under the system's temp
/// folder, named by `tag` (whatever an earlier run left there removed).
fn scratch(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("scripts-cli-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A folder with the stubs, and the file the cargo stub creates when run.
struct Stubs {
    dir: PathBuf,
    mark: PathBuf,
}

impl Stubs {
    fn new(tag: &str) -> Self {
        let dir = scratch(tag);
        let mark = dir.join("cargo-was-run");
        let write = |name: &str, body: String| {
            let p = dir.join(name);
            std::fs::write(&p, body).unwrap();
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        };
        write(
            "cargo",
            format!("#!/bin/sh\necho \"$@\" >> '{}'\nexit 1\n", mark.display()),
        );
        write("nvidia-smi", "#!/bin/sh\nexit 9\n".into());
        Self { dir, mark }
    }

    fn run(&self, script: &str, args: &[&str]) -> Output {
        let path = format!("{}:{}", self.dir.display(), std::env::var("PATH").unwrap());
        let program = root().join(script);
        let mut c = if script.ends_with(".py") {
            let mut c = Command::new("python3");
            c.arg(&program);
            c
        } else {
            Command::new(&program)
        };
        c.args(args)
            .current_dir(root())
            .env("PATH", path)
            .env("SIMPLE_WRITE_BIN", env!("CARGO_BIN_EXE_simple_write"))
            .output()
            .unwrap_or_else(|e| panic!("running {script}: {e}"))
    }

    fn cargo_ran(&self) -> Option<String> {
        std::fs::read_to_string(&self.mark).ok()
    }
}

impl Drop for Stubs {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn text(o: &Output) -> String {
    format!(
        "status {:?}\n--- stdout\n{}--- stderr\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Every script of scripts/, bench/, bench/nvshmem/, bench/link-ceiling/ and bench/launch-floor/
/// (not scripts/lib/), as a path from the repository's root.
fn scripts() -> Vec<String> {
    let mut v: Vec<String> = [
        "scripts",
        "bench",
        "bench/nvshmem",
        "bench/link-ceiling",
        "bench/launch-floor",
    ]
    .iter()
    .filter_map(|d| Some((d, std::fs::read_dir(root().join(d)).ok()?)))
    .flat_map(|(d, entries)| {
        entries
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".sh") || n.ends_with(".py"))
            .map(move |n| format!("{d}/{n}"))
    })
    .collect();
    v.sort();
    v
}

#[test]
fn every_script_answers_help_without_side_effects() {
    let stubs = Stubs::new("help");
    let tree = git_status();
    for script in scripts() {
        for flag in ["--help", "-h"] {
            let o = stubs.run(&script, &[flag]);
            assert_eq!(o.status.code(), Some(0), "{script} {flag}: {}", text(&o));
            let out = String::from_utf8_lossy(&o.stdout);
            assert!(
                out.lines().count() >= 2,
                "{script} {flag} prints no help: {}",
                text(&o)
            );
            assert!(
                !String::from_utf8_lossy(&o.stderr).contains("Traceback"),
                "{script} {flag}: {}",
                text(&o)
            );
            assert_eq!(stubs.cargo_ran(), None, "{script} {flag} ran cargo");
        }
    }
    assert_eq!(git_status(), tree, "a --help changed the working tree");
}

#[test]
fn every_script_refuses_an_unknown_option_with_exit_2() {
    let stubs = Stubs::new("bogus");
    for script in scripts() {
        let o = stubs.run(&script, &["--bogus-flag"]);
        assert_eq!(
            o.status.code(),
            Some(2),
            "{script} --bogus-flag: {}",
            text(&o)
        );
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains("--bogus-flag") || err.contains("usage"),
            "{script}: the message names neither the option nor the usage: {}",
            text(&o)
        );
        assert_eq!(stubs.cargo_ran(), None, "{script} --bogus-flag ran cargo");
    }
}

#[test]
fn run_simple_write_checks_simple_writes_options_first() {
    let stubs = Stubs::new("run-sw");
    let o = stubs.run("scripts/run_simple_write.sh", &["--size", "0"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("at least 1 byte"),
        "{}",
        text(&o)
    );
}

#[test]
fn gpu_scripts_without_a_gpu_say_so_and_fail() {
    let stubs = Stubs::new("nogpu");
    let out = stubs.dir.join("out");
    let out = out.to_str().unwrap();
    for (script, args) in [
        ("bench/gpu-check.sh", vec!["--out", out]),
        ("bench/bench.sh", vec!["--out", out]),
        ("bench/tune-grid.sh", vec!["--out", out]),
        ("bench/gpu-faults.sh", vec!["--out", out]),
        ("bench/run_ep.sh", vec!["--out", out]),
        ("bench/gpu-matrix.sh", vec!["--out", out]),
        (
            "scripts/ucx-diag.sh",
            vec![
                env!("CARGO_BIN_EXE_simple_write").trim_end_matches("/simple_write"),
                out,
            ],
        ),
    ] {
        let o = stubs.run(script, &args);
        assert_eq!(o.status.code(), Some(1), "{script}: {}", text(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains("no NVIDIA GPU on this machine"),
            "{script}: {}",
            text(&o)
        );
        assert!(
            !String::from_utf8_lossy(&o.stdout).contains("PASS"),
            "{script} passed a row without a GPU: {}",
            text(&o)
        );
        assert!(
            !Path::new(out).join("table.txt").exists(),
            "{script} wrote a table"
        );
    }
}

fn git_status() -> String {
    let o = Command::new("git")
        .args(["status", "--porcelain", "--ignored=no"])
        .current_dir(root())
        .output();
    o.map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

/// The GPU matrix run with one (stub) GPU and `args`: exit 1, its summary.
fn gpu_matrix_on_one_gpu(stubs: &Stubs, args: &[&str]) -> String {
    std::fs::write(
        stubs.dir.join("nvidia-smi"),
        "#!/bin/sh\necho 'GPU 0: stub (UUID: GPU-0)'\n",
    )
    .unwrap();
    let out = stubs.dir.join("out");
    let bin = env!("CARGO_BIN_EXE_simple_write").trim_end_matches("/simple_write");
    let mut all = vec!["--bin", bin, "--out", out.to_str().unwrap()];
    all.extend_from_slice(args);
    let o = stubs.run("bench/gpu-matrix.sh", &all);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    std::fs::read_to_string(out.join("summary.md")).unwrap()
}

/// With one GPU the GPU matrix runs nothing: every row is named in the
/// summary as not run, with the reason, and the exit status is 1; so are
/// the rows of the A/B parts (pdl, sync), which run only when --parts
/// names them.
#[test]
fn gpu_matrix_on_one_gpu_names_every_row_and_fails() {
    let stubs = Stubs::new("matrix");
    let summary = gpu_matrix_on_one_gpu(&stubs, &[]);
    let named = |summary: &str, row: &str| {
        let line = format!("- {row}: needs two GPUs or more (this machine has 1");
        assert!(summary.contains(&line), "{row} not named: {summary}");
    };
    for row in [
        "sw-0to1-pp",
        "coll-2r-graph",
        "ep2-ht",
        "pipe2-ll8",
        "faults",
    ] {
        named(&summary, row);
    }
    for part in ["pdl-2r", "sync-2r"] {
        assert!(!summary.contains(part), "{part} ran unasked: {summary}");
    }
    assert!(!summary.contains("| "), "a table without a run: {summary}");
    let summary = gpu_matrix_on_one_gpu(&stubs, &["--parts", "pdl sync"]);
    for part in ["pdl", "sync"] {
        for launch in ["stream", "graph"] {
            for row in ["on-1", "off-1", "on-2", "off-2"] {
                named(&summary, &format!("{part}-2r-{launch}-{row}"));
            }
        }
    }
    assert!(
        !summary.contains(" A/B,"),
        "an A/B without a run: {summary}"
    );
}

/// bench/call_split.py on a committed run: each operation's fastest case
/// per size up to 64 KiB (f32, 3 operations × 14 sizes, less allgather's
/// and reduce-scatter's 8 B: less than an element a rank), and the medians
/// docs/COLLECTIVES.md cites; a file that is not a run's JSON exits 2; a run
/// without NCCL's baseline keeps its row with "-" for NCCL's columns, and a
/// run without batch times is left out with its name on stderr.
#[test]
fn call_split_reads_a_committed_run() {
    let run = |files: &[&Path]| {
        Command::new("python3")
            .arg(root().join("bench/call_split.py"))
            .args(files)
            .output()
            .unwrap()
    };
    let f = root().join("docs/results/2026-11-28-h200x4-collectives/coll-4r-stream.json.gz");
    let o = run(&[&f]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    let row = |out: &str, name: &str| {
        (out.lines())
            .find(|l| l.contains(name))
            .unwrap_or_default()
            .to_string()
    };
    // ranks, launch, PDL, domain, sizes × ops, kernel, gap, events; no floor
    // in a run of 367f831; NCCL's events and the difference.
    assert!(
        row(&out, "coll-4r-stream").contains(
            "| 4 | stream | off | default | 40 | 3.04 | 1.94 | 3.05 | - | - | - | - | 2.40 | 0.65 |"
        ),
        "{out}"
    );
    let o = run(&[&root().join("README.md")]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("not a collectives run's JSON"),
        "{}",
        text(&o)
    );
    // The same run without NCCL's batch (as --no-baseline writes it) keeps
    // its own columns; with a launch floor (and the remote domain) it shows
    // the floor's and ours less the floor's events; without our batch too
    // it is left out, named, and alone leaves nothing to print: exit 2.
    let dir = scratch("call-split");
    let strip = |fields: &str, run: &str, to: &Path| {
        let code = format!(
            "import gzip, json, sys\n\
             d = json.load(gzip.open(sys.argv[1], 'rt'))\n\
             for r in d['rows']:\n    for k in {fields}: r[k] = None\n\
             {run}\n\
             json.dump(d, open(sys.argv[2], 'w'))\n"
        );
        let o = (Command::new("python3").args(["-c", &code]).arg(&f).arg(to))
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    };
    let (bare, none) = (dir.join("bare.json"), dir.join("none.json"));
    let floored = dir.join("floored.json");
    strip("['nccl_batch_us']", "pass", &bare);
    strip(
        "['nccl_batch_us']",
        "d['run']['floor'] = {'time_p50_us': 5.0, 'time_p99_us': 6.0, 'batch_us': 2.5}; \
         d['run']['config']['sync_domain'] = 'remote'",
        &floored,
    );
    strip("['nccl_batch_us', 'batch_us']", "pass", &none);
    let o = run(&[&bare, &floored, &none, &f]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        row(&out, "bare.json").ends_with("| 3.04 | 1.94 | 3.05 | - | - | - | - | - | - |"),
        "{out}"
    );
    // Floor per call, batch, its events (5 - 2.5), ours less them (3.05 - 2.5).
    assert!(
        row(&out, "floored.json")
            .ends_with("| remote | 40 | 3.04 | 1.94 | 3.05 | 5.00 | 2.50 | 2.50 | 0.55 | - | - |"),
        "{out}"
    );
    assert!(text(&o).contains("none.json: left out"), "{}", text(&o));
    let o = run(&[&none]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// bench/ab_collectives.py pairs the two sets' rows by case: a committed
/// run against itself reads 1.000 in every case and every geometric mean,
/// and no difference of configuration; against a run of another rank
/// count (the same cases, other times) it names the rank counts, and its
/// ratios are the two runs' batch times divided.
#[test]
fn ab_collectives_pairs_rows_by_case() {
    let dir = root().join("docs/results/2026-11-28-h100x4-matrix");
    let run = |a: &str, b: &str| {
        let o = Command::new("python3")
            .arg(root().join("bench/ab_collectives.py"))
            .args([dir.join(a), dir.join(b)])
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(0), "{}", text(&o));
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let same = run("coll-4r-stream.json.gz", "coll-4r-stream.json.gz");
    assert!(
        same.contains("A and B differ in: nothing in their configurations"),
        "{same}"
    );
    let cases: Vec<&str> = same
        .lines()
        .filter(|l| l.starts_with("| allreduce | ll | store | float | out | 8 B |"))
        .collect();
    assert_eq!(cases.len(), 1, "{same}");
    assert!(cases[0].contains("| 1.000 |"), "{}", cases[0]);
    for op in ["allreduce", "allgather", "reduce-scatter"] {
        let gm = same
            .lines()
            .find(|l| l.starts_with(&format!("| {op} | 1.000 | 1.000-1.000 |")));
        assert!(gm.is_some(), "{op}: {same}");
    }
    let read = "import gzip, json, sys\n\
                t = lambda f: [r for r in json.load(gzip.open(f, 'rt'))['rows'] if r['op'] == 'allreduce' \
                and r['algo'] == 'll' and r['path'] == 'store' and r['type'] == 'float' and not r['in_place'] \
                and r['size_bytes'] == 8][0]['batch_us']\n\
                print('%.3f' % (t(sys.argv[1]) / t(sys.argv[2])))\n";
    let o = Command::new("python3")
        .args(["-c", read])
        .args([
            dir.join("coll-4r-stream.json.gz"),
            dir.join("coll-2r-stream.json.gz"),
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let want = String::from_utf8_lossy(&o.stdout).trim().to_string();
    let other = run("coll-4r-stream.json.gz", "coll-2r-stream.json.gz");
    assert!(other.contains("A and B differ in: ranks 4 / 2"), "{other}");
    let line = other
        .lines()
        .find(|l| l.starts_with("| allreduce | ll | store | float | out | 8 B |"))
        .unwrap_or_else(|| panic!("{other}"));
    let cells: Vec<&str> = line.split('|').map(str::trim).collect();
    assert_eq!(cells[9], want, "{line}");
    // Where every run of both sets measured the launch floor, its medians
    // under A and B close the output (the committed runs predate it).
    assert!(!same.contains("launch floor"), "{same}");
    let tmp = scratch("ab-floor");
    let add = "import gzip, json, sys\n\
               d = json.load(gzip.open(sys.argv[1], 'rt'))\n\
               d['run']['floor'] = {'time_p50_us': float(sys.argv[3]), 'time_p99_us': 9.0, 'batch_us': 1.5}\n\
               json.dump(d, open(sys.argv[2], 'w'))\n";
    for (name, p50) in [("a-1.json", "3.0"), ("b-1.json", "2.5")] {
        let o = Command::new("python3")
            .args(["-c", add])
            .arg(dir.join("coll-4r-stream.json.gz"))
            .arg(tmp.join(name))
            .arg(p50)
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    }
    let o = Command::new("python3")
        .arg(root().join("bench/ab_collectives.py"))
        .args([tmp.join("a-1.json"), tmp.join("b-1.json")])
        .output()
        .unwrap();
    let floors = String::from_utf8_lossy(&o.stdout);
    assert!(
        floors.contains("| per call, p50 | 3.00 | 2.50 | 1.200 |"),
        "{}",
        text(&o)
    );
    std::fs::remove_dir_all(&tmp).unwrap();
}

/// Every option a script parses with a value (`need_value`, `gpu_option`),
/// given without one, is refused with exit 2 and a message naming it, as
/// the programs' parser does (not an unbound-variable error from bash).
#[test]
fn an_option_without_its_value_exits_2_naming_it() {
    let stubs = Stubs::new("novalue");
    let mut checked = 0;
    for script in scripts().into_iter().filter(|s| s.ends_with(".sh")) {
        let src = std::fs::read_to_string(root().join(&script)).unwrap();
        for line in src.lines().map(str::trim_start) {
            let Some((opts, rest)) = line.split_once(") ") else {
                continue;
            };
            let checked_value = rest.contains("need_value") || rest.contains("gpu_option");
            assert!(
                !(opts.starts_with("--") && rest.contains("$2") && !checked_value),
                "{script}: `{line}` takes $2 unchecked (use need_value)"
            );
            if !opts.starts_with("--")
                || !(rest.starts_with("need_value") || rest.starts_with("gpu_option"))
            {
                continue;
            }
            for opt in opts.split('|') {
                let o = stubs.run(&script, &[opt]);
                assert_eq!(o.status.code(), Some(2), "{script} {opt}: {}", text(&o));
                let err = String::from_utf8_lossy(&o.stderr);
                assert!(
                    err.contains(&format!("{opt} needs a value")),
                    "{script} {opt}: {}",
                    text(&o)
                );
                checked += 1;
            }
        }
    }
    assert!(
        checked >= 40,
        "only {checked} options found: has the parsing changed?"
    );
    assert_eq!(stubs.cargo_ran(), None, "a script ran cargo");
}

/// `bench/gpu_matrix.py DIR`'s summary (stdout), which must exit 0.
fn matrix_summary(dir: &Path) -> String {
    let o = Command::new("python3")
        .arg(root().join("bench/gpu_matrix.py"))
        .arg(dir)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The GPU matrix runs LL128 in rows of its own (`ll128-XtoY-bw`), and its
/// summary shows them in the pair's table beside the other paths: with the
/// committed four-H100 pair row alone there is no `ll128` column; with the
/// committed LL128 row beside it the table gains one, after `ll`, whose
/// 1 GiB cell is that row's figure.
#[test]
fn gpu_matrix_summary_shows_ll128_rows_beside_the_pair() {
    let results = root().join("docs/results/2026-11-28-h100x4-matrix");
    let dir = scratch("matrix-ll128");
    let copy = |name: &str| std::fs::copy(results.join(name), dir.join(name)).unwrap();
    copy("sw-0to1-bw.json.gz");
    assert!(
        !matrix_summary(&dir).contains("ll128"),
        "no LL128 row, no ll128 column"
    );
    copy("ll128-0to1-bw.json.gz");
    let with = matrix_summary(&dir);
    let header = with
        .lines()
        .find(|l| l.starts_with("| sw-0to1-bw, block level"))
        .unwrap_or_else(|| panic!("no pair table: {with}"));
    assert!(header.contains("| ll GB/s | ll128 GB/s |"), "{header}");
    let read = "import gzip, json, sys\n\
                d = json.load(gzip.open(sys.argv[1] + '/ll128-0to1-bw.json.gz', 'rt'))\n\
                print('%.1f' % [r for r in d['rows'] if r['size_bytes'] == 1 << 30][0]['gb_per_s'])\n";
    let o = Command::new("python3")
        .args(["-c", read])
        .arg(&dir)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let expected = String::from_utf8_lossy(&o.stdout).trim().to_string();
    let gib = with.lines().find(|l| l.starts_with("| 1 GiB |")).unwrap();
    let cells: Vec<&str> = gib.split('|').map(str::trim).collect();
    assert_eq!(cells[5], expected, "{gib}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A results folder trimmed to its cap keeps rows.jsonl but not every
/// row's JSON: regenerated from the committed four-H200 folder with one
/// row's JSON beside it, the summary shows that row's table and names the
/// rows that ran but whose JSON is gone, rather than dropping their tables
/// silently.
#[test]
fn gpu_matrix_summary_names_rows_whose_json_is_gone() {
    let results = root().join("docs/results/2026-11-28-h200x4-collectives");
    let dir = scratch("matrix-gone");
    for name in ["rows.jsonl", "coll-4r-stream.json.gz"] {
        std::fs::copy(results.join(name), dir.join(name)).unwrap();
    }
    let summary = matrix_summary(&dir);
    assert!(
        summary.contains("| collectives, 4 ranks, stream launches |"),
        "{summary}"
    );
    let gone = summary
        .lines()
        .find(|l| l.starts_with("Rows that ran but whose JSON is not in this folder"))
        .unwrap_or_else(|| panic!("no line naming the rows whose JSON is gone: {summary}"));
    assert!(
        gone.contains("coll-2r-graph") && gone.contains("coll-4r-graph"),
        "{gone}"
    );
    assert!(!gone.contains("coll-4r-stream"), "{gone}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The fault campaign tells a run that failed by MPS's shared faults from
/// the programs' own error text: the phrase it looks for is the one
/// `src/gpu/run.rs` writes.
#[test]
fn the_campaign_reads_the_mps_fault_phrase_the_programs_write() {
    let campaign = std::fs::read_to_string(root().join("bench/elastic_campaign.py")).unwrap();
    let run = std::fs::read_to_string(root().join("src/gpu/run.rs")).unwrap();
    let phrase = campaign
        .lines()
        .find_map(|l| l.split("mps_fault = rc != 0 and \"").nth(1))
        .and_then(|rest| rest.split('"').next())
        .expect("bench/elastic_campaign.py: no `mps_fault = rc != 0 and \"...\" in stderr`");
    assert!(
        run.contains(phrase),
        "src/gpu/run.rs no longer writes {phrase:?}, which the campaign looks for"
    );
}
