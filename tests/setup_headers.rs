//! NIXL's device header: how `scripts/setup.sh` gets it and how the build
//! finds it (build/cuda_kernels.rs, compiled into this test as it is).
//!
//! setup.sh runs for real (`--headers-only`, from a copy in a scratch
//! project so the checkout's `.deps` stays as it is) against a loopback HTTP
//! server standing in for NIXL's public repository (`NIXL_HEADERS_URL`):
//! good files are installed, tampered ones refused, an unreachable server
//! gives the offline message. Those need no copy of the header. The two
//! tests that do (the download of the real files, and the kernels compiling
//! with nvcc from `.venv` against files placed in `.deps`) use the copy this
//! machine has (NIXL_INCLUDE_DIR, $NIXL_PREFIX/include or the `.deps` that
//! setup.sh filled) and print a SKIP line naming why when there is none.

#[allow(dead_code)]
#[path = "../build/cuda_kernels.rs"]
mod cuda_kernels;

mod common;

use std::collections::HashMap;
use std::ffi::OsString;
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

const MANIFEST: &str = env!("CARGO_MANIFEST_DIR");
const PUBLIC: &str = "https://raw.githubusercontent.com/ai-dynamo/nixl/v1.4.0";

/// A folder under the system temp dir, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("setup-headers-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }
    fn path(&self, rel: &str) -> PathBuf {
        self.0.join(rel)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// One header file as setup.sh pins it: path in NIXL's repository, path
/// under the include folder, SHA-256.
struct Pinned {
    src: String,
    rel: String,
    sha256: String,
}

/// The pins, read from the script itself so the test follows a re-pin.
fn pinned() -> Vec<Pinned> {
    let script =
        std::fs::read_to_string(format!("{MANIFEST}/scripts/lib/nixl-headers.sh")).unwrap();
    let pins: Vec<Pinned> = script
        .lines()
        .filter_map(|l| l.trim().strip_prefix("\"src/api/"))
        .map(|l| {
            let f: Vec<&str> = l.trim_end_matches('"').split_whitespace().collect();
            Pinned {
                src: format!("src/api/{}", f[0]),
                rel: f[1].into(),
                sha256: f[2].into(),
            }
        })
        .collect();
    assert_eq!(pins.len(), 2, "nixl-headers.sh pins two files");
    assert!(
        pins.iter().all(|p| p.sha256.len() == 64),
        "SHA-256 sums are 64 hex digits"
    );
    pins
}

fn sha256(path: &Path) -> Option<String> {
    let out = Command::new("sha256sum").arg(path).output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    out.status
        .success()
        .then(|| text.split_whitespace().next().unwrap_or("").to_string())
}

/// A scratch project holding just setup.sh and what it sources.
fn project(scratch: &Scratch) -> PathBuf {
    let root = scratch.path("project");
    std::fs::create_dir_all(root.join("scripts/lib")).unwrap();
    for f in [
        "scripts/setup.sh",
        "scripts/lib/nixl-headers.sh",
        "scripts/lib/nixl-headers-next.sh",
    ] {
        std::fs::copy(format!("{MANIFEST}/{f}"), root.join(f)).unwrap();
    }
    root
}

/// `python3 -m http.server` on 127.0.0.1 (a free port it picks), serving a
/// folder; its request log goes to a file. Killed when dropped.
struct Server {
    child: Child,
    url: String,
    log: PathBuf,
}

impl Server {
    fn start(dir: &Path, log: PathBuf) -> Self {
        let mut child = Command::new("python3")
            .args([
                "-u",
                "-m",
                "http.server",
                "0",
                "--bind",
                "127.0.0.1",
                "--directory",
            ])
            .arg(dir)
            .stdout(Stdio::piped())
            .stderr(File::create(&log).unwrap())
            .spawn()
            .expect("python3 runs the loopback HTTP server");
        let (tx, rx) = mpsc::channel();
        let out = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(out).read_line(&mut line);
            let _ = tx.send(line);
        });
        let line = rx.recv_timeout(Duration::from_secs(20)).unwrap_or_default();
        // "Serving HTTP on 127.0.0.1 port 40741 (http://127.0.0.1:40741/) ..."
        let Some(port) = line.split_whitespace().skip_while(|w| *w != "port").nth(1) else {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the loopback HTTP server did not start: {line:?}");
        };
        let url = format!("http://127.0.0.1:{port}");
        Server { child, url, log }
    }

    /// Serves `files` (repository path → bytes) from `dir`.
    fn with_files(dir: PathBuf, files: &[(&str, Vec<u8>)]) -> Self {
        std::fs::create_dir_all(&dir).unwrap();
        for (src, bytes) in files {
            let path = dir.join(src);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, bytes).unwrap();
        }
        let log = dir.with_extension("log");
        Self::start(&dir, log)
    }

    fn requests(&self) -> usize {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        log.lines().filter(|l| l.contains("\"GET ")).count()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs the scratch project's `setup.sh --headers-only` with no NIXL
/// install in sight (NIXL_INCLUDE_DIR unset, NIXL_PREFIX empty), at most a
/// minute.
fn setup(root: &Path, url: &str, args: &[&str], env: &[(&str, &str)]) -> Output {
    // Through bash, not exec of the fresh copy: a child forked by another
    // test thread while the copy was open for writing would make exec fail
    // with ETXTBSY ("Text file busy"), as CI once saw.
    let mut cmd = Command::new("bash");
    cmd.arg(root.join("scripts/setup.sh"))
        .arg("--headers-only")
        .args(args)
        .env_remove("NIXL_INCLUDE_DIR")
        .env_remove("NIXL_HEADERS_DOWNLOAD")
        .env("NIXL_PREFIX", root.join("no-nixl-install"))
        .env("NIXL_HEADERS_URL", url)
        .env("no_proxy", "127.0.0.1,localhost")
        .env("NO_PROXY", "127.0.0.1,localhost")
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    wait_output(
        cmd.spawn().expect("running setup.sh"),
        Duration::from_secs(60),
    )
}

fn wait_output(child: Child, limit: Duration) -> Output {
    common::Reaped::new(child).wait_output(limit)
}

fn text(o: &Output) -> String {
    format!(
        "status {:?}\n{}{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// An environment for the build's lookups with no NIXL install in sight.
fn isolated_env(scratch: &Scratch, extra: &[(&str, &Path)]) -> HashMap<String, OsString> {
    let mut env = HashMap::new();
    env.insert(
        "NIXL_PREFIX".to_string(),
        scratch.path("no-nixl-install").into_os_string(),
    );
    for (k, v) in extra {
        env.insert(k.to_string(), v.as_os_str().to_owned());
    }
    env
}

/// The device header this machine has, found the way the build finds it.
fn local_header() -> Result<PathBuf, String> {
    let mut lines = Vec::new();
    cuda_kernels::find_nixl_include(&|k| std::env::var_os(k), Path::new(MANIFEST), &mut lines)
        .map(|(dir, _)| dir)
        .map_err(|_| {
            "no copy of NIXL's device header on this machine (NIXL_INCLUDE_DIR, $NIXL_PREFIX/include \
             and .deps/nixl-include are empty: scripts/setup.sh could not download it, no internet?)"
                .to_string()
        })
}

/// Whether setup.sh's output says the download failed with the one
/// message: why, both public URLs, where the files go, NIXL_INCLUDE_DIR.
fn assert_help(o: &Output, root: &Path, why: &str) {
    let t = text(o);
    assert!(
        o.status.success(),
        "setup.sh goes on (host side builds):\n{t}"
    );
    assert!(
        t.contains(&format!("NIXL device header not installed: {why}")),
        "{t}"
    );
    assert!(t.contains("the host side builds and runs as usual"), "{t}");
    for p in pinned() {
        assert!(
            t.contains(&format!("{PUBLIC}/{}", p.src)),
            "names the URL of {}:\n{t}",
            p.rel
        );
        let dest = root.join(".deps/nixl-include").join(&p.rel);
        assert!(
            t.contains(&dest.display().to_string()),
            "names where {} goes:\n{t}",
            p.rel
        );
    }
    assert!(
        t.contains("or set NIXL_INCLUDE_DIR to a folder holding"),
        "{t}"
    );
}

fn assert_nothing_installed(root: &Path) {
    let dir = root.join(".deps/nixl-include");
    let left: Vec<_> = walk(&dir);
    assert!(
        left.is_empty(),
        "nothing installed in {}, found {left:?}",
        dir.display()
    );
    let scratch: Vec<_> = std::fs::read_dir(root.join(".deps"))
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with(".nixl-include.")
        })
        .collect();
    assert!(
        scratch.is_empty(),
        "no download scratch folders left behind"
    );
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .flat_map(|p| if p.is_dir() { walk(&p) } else { vec![p] })
        .collect()
}

fn place(dir: &Path, files: &[(&str, &[u8])]) {
    for (rel, bytes) in files {
        let path = dir.join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, bytes).unwrap();
    }
}

const DUMMY: &[(&str, &[u8])] = &[
    ("gpu/ucx/nixl_device.cuh", b"// not NIXL's\n"),
    ("nixl_types.h", b"// not NIXL's\n"),
];

#[test]
fn the_build_looks_in_nixl_include_dir_then_the_prefix_then_deps() {
    let s = Scratch::new("order");
    let (explicit, prefix, manifest) = (s.path("explicit"), s.path("prefix"), s.path("project"));
    place(&explicit, DUMMY);
    place(&prefix.join("include"), DUMMY);
    place(&manifest.join(".deps/nixl-include"), DUMMY);
    let find = |vars: &[(&str, &Path)]| {
        let table: HashMap<String, OsString> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.as_os_str().to_owned()))
            .collect();
        let mut lines = Vec::new();
        let found =
            cuda_kernels::find_nixl_include(&|k| table.get(k).cloned(), &manifest, &mut lines)
                .map(|(dir, _)| dir);
        (found, lines)
    };
    let (found, lines) = find(&[("NIXL_INCLUDE_DIR", &explicit), ("NIXL_PREFIX", &prefix)]);
    assert_eq!(found, Ok(explicit.clone()));
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("build: NIXL device header from NIXL_INCLUDE_DIR"))
    );
    assert!(
        !lines.iter().any(|l| l.starts_with("cargo:warning")),
        "{lines:?}"
    );

    let (found, _) = find(&[("NIXL_PREFIX", &prefix)]);
    assert_eq!(found, Ok(prefix.join("include")));

    let empty = s.path("empty");
    let (found, lines) = find(&[("NIXL_INCLUDE_DIR", &empty), ("NIXL_PREFIX", &empty)]);
    assert_eq!(
        found,
        Ok(manifest.join(".deps/nixl-include")),
        "no variable needed for .deps"
    );
    let said = lines.join("\n");
    assert!(
        said.contains("build: NIXL device header from .deps/nixl-include"),
        "{said}"
    );
    assert!(
        said.contains("(no stamp: not checked; scripts/setup.sh checks them)"),
        "{said}"
    );
    assert!(
        said.contains(&format!(
            "cargo:warning=NIXL_INCLUDE_DIR={} has no",
            empty.display()
        )),
        "a NIXL_INCLUDE_DIR without the header is a warning:\n{said}"
    );
    assert!(said.contains(&format!(
        "cargo:rerun-if-changed={}",
        manifest.join(".deps/nixl-include").display()
    )));
}

#[test]
fn without_the_header_the_host_side_builds_and_says_what_is_missing() {
    let s = Scratch::new("missing");
    let manifest = s.path("project");
    std::fs::create_dir_all(manifest.join(".deps/nixl-include")).unwrap();
    let table = isolated_env(&s, &[]);
    let env = |k: &str| table.get(k).cloned();
    let lines = cuda_kernels::directives(&env, &manifest, &s.0)
        .expect("no error without NIXL_REQUIRE_KERNELS");
    let said = lines.join("\n");
    assert!(!said.contains("rustc-cfg=nixl_kernels"), "{said}");
    let warning = lines
        .iter()
        .find(|l| l.starts_with("cargo:warning=device kernels left out (host side only): "))
        .unwrap_or_else(|| panic!("a cargo warning says the kernels are left out:\n{said}"));
    // Cargo replays the warning on every command: one short line.
    for needle in ["NIXL device header", "missing;", "scripts/setup.sh"] {
        assert!(
            warning.contains(needle),
            "the warning names {needle}: {warning}"
        );
    }
    assert!(warning.len() < 200, "{warning}");
    let detail = lines
        .iter()
        .find(|l| l.starts_with("build: device kernels left out: "))
        .unwrap_or_else(|| panic!("a build: line says why in full:\n{said}"));
    for needle in [
        "NIXL device header",
        ".deps/nixl-include",
        "scripts/setup.sh",
        "NIXL_INCLUDE_DIR",
    ] {
        assert!(
            detail.contains(needle),
            "the detail names {needle}: {detail}"
        );
    }
    assert!(
        said.contains("cargo:rustc-env=NIXL_KERNELS_MISSING="),
        "simple_write learns why: {said}"
    );

    let mut strict = table.clone();
    strict.insert("NIXL_REQUIRE_KERNELS".into(), "1".into());
    let err = cuda_kernels::directives(&|k| strict.get(k).cloned(), &manifest, &s.0).unwrap_err();
    assert!(
        err.contains("NIXL_REQUIRE_KERNELS=1 but the device kernels cannot be built"),
        "{err}"
    );
    // This very test binary is what the build made of the checkout.
    println!(
        "this build: device kernels {}",
        if cfg!(nixl_kernels) {
            "included"
        } else {
            "left out (host side only)"
        }
    );
}

#[test]
fn setup_downloads_checks_and_installs_the_pinned_files() {
    let pins = pinned();
    let local = match local_header() {
        Ok(dir) => dir,
        Err(why) => return println!("SKIP download of the real header files: {why}"),
    };
    if let Some(p) = pins
        .iter()
        .find(|p| sha256(&local.join(&p.rel)).as_deref() != Some(&p.sha256))
    {
        return println!(
            "SKIP download of the real header files: {} in {} is not the pinned version",
            p.rel,
            local.display()
        );
    }
    let s = Scratch::new("good");
    let files: Vec<(&str, Vec<u8>)> = pins
        .iter()
        .map(|p| (p.src.as_str(), std::fs::read(local.join(&p.rel)).unwrap()))
        .collect();
    let server = Server::with_files(s.path("served"), &files);
    let root = project(&s);
    let o = setup(&root, &server.url, &[], &[]);
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    for p in &pins {
        assert!(
            t.contains(&format!("sha256 {}  {}  ok", p.sha256, p.rel)),
            "{t}"
        );
        let installed = root.join(".deps/nixl-include").join(&p.rel);
        assert_eq!(
            sha256(&installed).as_deref(),
            Some(p.sha256.as_str()),
            "{}",
            installed.display()
        );
    }
    let stamp =
        std::fs::read_to_string(root.join(".deps/nixl-include/nixl-headers.stamp")).unwrap();
    assert!(
        stamp.contains("tag v1.4.0") && stamp.contains(&pins[0].sha256),
        "{stamp}"
    );
    assert_eq!(server.requests(), 2);

    let again = setup(&root, &server.url, &[], &[]);
    assert!(
        text(&again).contains("(NIXL v1.4.0, SHA-256 checked)"),
        "{}",
        text(&again)
    );
    assert_eq!(server.requests(), 2, "a second run downloads nothing");

    let table = isolated_env(&s, &[]);
    let mut lines = Vec::new();
    let found = cuda_kernels::find_nixl_include(&|k| table.get(k).cloned(), &root, &mut lines);
    assert_eq!(
        found,
        Ok((
            root.join(".deps/nixl-include"),
            cuda_kernels::HeaderLayout::Ucx
        ))
    );
    assert!(
        lines
            .join("\n")
            .contains("(NIXL v1.4.0, SHA-256 checked by scripts/setup.sh)"),
        "{lines:?}"
    );
}

#[test]
fn headers_placed_in_deps_are_found_and_the_kernels_compile() {
    let local = match local_header() {
        Ok(dir) => dir,
        Err(why) => return println!("SKIP kernels compiling against .deps/nixl-include: {why}"),
    };
    let venv = Path::new(MANIFEST).join(".venv");
    let s = Scratch::new("pickup");
    let manifest = s.path("project");
    let deps = manifest.join(".deps/nixl-include");
    for rel in ["gpu/ucx/nixl_device.cuh", "nixl_types.h"] {
        std::fs::create_dir_all(deps.join(rel).parent().unwrap()).unwrap();
        std::fs::copy(local.join(rel), deps.join(rel)).unwrap();
    }
    std::os::unix::fs::symlink(format!("{MANIFEST}/cuda"), manifest.join("cuda")).unwrap();
    std::os::unix::fs::symlink(&venv, manifest.join(".venv")).unwrap();
    // No NVCC, CUDA_HOME or PATH: nvcc must come from .venv.
    let table = isolated_env(&s, &[]);
    let out = s.path("out");
    std::fs::create_dir_all(&out).unwrap();
    let lines = cuda_kernels::directives(&|k| table.get(k).cloned(), &manifest, &out).unwrap();
    let said = lines.join("\n");
    if said.contains("nvcc not found") || said.contains("UCX device headers (ucp/api") {
        return println!(
            "SKIP kernels compiling against .deps/nixl-include: no nvcc or UCX headers in .venv (run scripts/setup.sh): {said}"
        );
    }
    assert!(
        said.contains("cargo:rustc-cfg=nixl_kernels"),
        "the kernels compile:\n{said}"
    );
    assert!(
        said.contains(&format!(
            "build: NIXL device header from .deps/nixl-include (scripts/setup.sh): {}",
            deps.display()
        )),
        "{said}"
    );
    assert!(
        said.contains(&format!("build: nvcc {}", manifest.join(".venv").display())),
        "{said}"
    );
    assert!(
        said.contains("build: UCX device headers"),
        "the UCX versions are stated:\n{said}"
    );
    let fatbin = std::fs::metadata(out.join("kernels.fatbin")).expect("kernels.fatbin written");
    assert!(
        fatbin.len() > 10_000,
        "a real fatbin ({} bytes)",
        fatbin.len()
    );
    println!(
        "{}",
        lines
            .iter()
            .filter(|l| l.starts_with("build:"))
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// The kernels compile against both layouts of NIXL's device header: 1.x's
/// `gpu/ucx/nixl_device.cuh` (the copy this machine builds with) and the
/// backend-neutral `gpu/nixl_device.cuh` of upstream's main, which
/// `scripts/setup.sh` puts in `.deps/nixl-include-next`. Each layout is a
/// SKIP line naming why when its files are not here.
#[test]
fn the_kernels_compile_against_both_header_layouts() {
    let next = Path::new(MANIFEST).join(".deps/nixl-include-next");
    let layouts = [
        (local_header(), cuda_kernels::HeaderLayout::Ucx),
        (
            cuda_kernels::has_nixl_header(&next).then_some(next).ok_or_else(|| {
                "no .deps/nixl-include-next: scripts/setup.sh could not download upstream main's \
                 header files (no internet?)"
                    .to_string()
            }),
            cuda_kernels::HeaderLayout::Generic,
        ),
    ];
    for (dir, layout) in layouts {
        let dir = match dir {
            Ok(dir) => dir,
            Err(why) => {
                println!("SKIP kernels against {}: {why}", layout.header());
                continue;
            }
        };
        let s = Scratch::new(&format!("layout-{}", layout as u8));
        let table = isolated_env(&s, &[("NIXL_INCLUDE_DIR", &dir)]);
        let out = s.path("out");
        std::fs::create_dir_all(&out).unwrap();
        let lines = cuda_kernels::directives(&|k| table.get(k).cloned(), Path::new(MANIFEST), &out)
            .unwrap();
        let said = lines.join("\n");
        if said.contains("nvcc not found") || said.contains("UCX device headers (ucp/api") {
            println!(
                "SKIP kernels against {}: no nvcc or UCX headers (run scripts/setup.sh)",
                layout.header()
            );
            continue;
        }
        assert!(
            said.contains("cargo:rustc-cfg=nixl_kernels"),
            "the kernels compile:\n{said}"
        );
        assert!(
            said.contains(&format!("; layout {}", layout.header())),
            "{said}"
        );
        assert!(
            said.contains(&format!(
                "cargo:rustc-env=NIXL_DEVICE_HEADER={}",
                layout.header()
            )),
            "{said}"
        );
        for name in cuda_kernels::SOURCES {
            let fatbin =
                std::fs::metadata(out.join(format!("{name}.fatbin"))).expect("fatbin written");
            assert!(
                fatbin.len() > 10_000,
                "{name}: a real fatbin ({} bytes)",
                fatbin.len()
            );
        }
        println!(
            "kernels compile against {} in {}",
            layout.header(),
            dir.display()
        );
    }
}

#[test]
fn a_tampered_download_is_refused_and_nothing_installed() {
    let s = Scratch::new("tampered");
    let pins = pinned();
    let local = local_header().ok();
    let files: Vec<(&str, Vec<u8>)> = pins
        .iter()
        .map(|p| {
            let real = local
                .as_ref()
                .and_then(|d| std::fs::read(d.join(&p.rel)).ok());
            let mut bytes = real.unwrap_or_else(|| b"// a stand-in\n".to_vec());
            bytes.extend_from_slice(b"// one line more\n");
            (p.src.as_str(), bytes)
        })
        .collect();
    let server = Server::with_files(s.path("served"), &files);
    let root = project(&s);
    let o = setup(&root, &server.url, &[], &[]);
    assert_help(&o, &root, "checksum mismatch");
    let t = text(&o);
    assert!(t.contains("MISMATCH: setup.sh expects"), "{t}");
    assert!(
        t.contains(&format!("(this run tried NIXL_HEADERS_URL={})", server.url)),
        "{t}"
    );
    assert_nothing_installed(&root);

    let table = isolated_env(&s, &[]);
    let lines = cuda_kernels::directives(&|k| table.get(k).cloned(), &root, &s.0).unwrap();
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("cargo:warning=device kernels left out")),
        "{lines:?}"
    );
}

#[test]
fn offline_setup_names_both_urls_where_to_put_them_and_nixl_include_dir() {
    let s = Scratch::new("offline");
    let root = project(&s);
    // A loopback port nobody listens on: the download is refused at once.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}");
    let o = setup(&root, &url, &[], &[]);
    // The reason names the URL that failed (then the OS's words for it).
    let why = format!("the download failed ({url}/src/api/gpu/ucx/nixl_device.cuh: ");
    assert_help(&o, &root, &why);
    assert_nothing_installed(&root);
}

#[test]
fn the_download_can_be_turned_off() {
    let s = Scratch::new("off");
    let server = Server::with_files(s.path("served"), &[]);
    let root = project(&s);
    let o = setup(&root, &server.url, &["--no-header-download"], &[]);
    assert_help(&o, &root, "the download is turned off");
    let o = setup(&root, &server.url, &[], &[("NIXL_HEADERS_DOWNLOAD", "0")]);
    assert_help(&o, &root, "the download is turned off");
    assert_eq!(server.requests(), 0, "nothing was fetched");
    assert_nothing_installed(&root);
}

#[test]
fn a_header_already_at_hand_means_no_download() {
    let s = Scratch::new("at-hand");
    let server = Server::with_files(s.path("served"), &[]);
    let root = project(&s);
    let include = s.path("include-dir");
    place(&include, DUMMY);
    let o = setup(
        &root,
        &server.url,
        &[],
        &[("NIXL_INCLUDE_DIR", include.to_str().unwrap())],
    );
    assert!(
        text(&o).contains(&format!(
            "NIXL device header: NIXL_INCLUDE_DIR={}",
            include.display()
        )),
        "{}",
        text(&o)
    );

    let prefix = s.path("nixl-install");
    place(&prefix.join("include"), DUMMY);
    let o = setup(
        &root,
        &server.url,
        &[],
        &[("NIXL_PREFIX", prefix.to_str().unwrap())],
    );
    assert!(text(&o).contains("(a NIXL install)"), "{}", text(&o));

    // Files placed by hand that are not the pinned ones: checked, kept.
    place(&root.join(".deps/nixl-include"), DUMMY);
    let o = setup(&root, &server.url, &[], &[]);
    let t = text(&o);
    assert!(
        t.contains("are not NIXL v1.4.0's") && t.contains("kept as they are"),
        "{t}"
    );
    assert!(t.contains("MISMATCH"), "{t}");
    assert!(
        root.join(".deps/nixl-include/nixl_types.h").is_file(),
        "kept"
    );
    assert_eq!(server.requests(), 0, "nothing was fetched");
}
