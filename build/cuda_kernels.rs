//! Compiles cuda/kernels.cu with nvcc into a fatbin the binary embeds.
//!
//! Needs three things; each is looked for in the order a user's machine has it:
//! - nvcc: `NVCC`, `CUDA_HOME`/`CUDA_PATH` `/bin/nvcc`, `nvcc` on PATH,
//!   `/usr/local/cuda/bin/nvcc`, the project's `.venv` (PyPI nvidia-cuda-nvcc);
//! - NIXL's device header (on no package registry), in either layout: NIXL
//!   1.x's `gpu/ucx/nixl_device.cuh`, or the backend-neutral
//!   `gpu/nixl_device.cuh` (with `gpu/common/`, `gpu/ucx/nixl_device_impl.cuh`
//!   and `gpu/nixl_device_config.h`) of upstream's main after it, each with
//!   the `nixl_types.h` it includes. The kernels compile against either
//!   (`cuda/device_common.cuh`; the build defines `NIXL_DEVICE_API_GENERIC`
//!   and says which it found); the first folder holding one of
//!   1. `NIXL_INCLUDE_DIR`,
//!   2. `$NIXL_PREFIX/include` (default `/opt/nvidia/nvda_nixl/include`), a
//!      NIXL install,
//!   3. `.deps/nixl-include`, where `scripts/setup.sh` puts NIXL v1.4.0's two
//!      files from NIXL's public repository once their SHA-256 matched (its
//!      stamp `nixl-headers.stamp` records tag and sums);
//! - UCX's device headers (`ucp/api/device/ucp_device_impl.h`):
//!   `UCX_INCLUDE_DIR`, the project's `.venv` (PyPI libucx-cu13),
//!   `$UCX_PREFIX/include`, `/usr/include`, `/opt/ucx/include`.
//!
//! What it used is printed as `build: …` lines (`cargo build -vv`, or the
//! `output` file under `target/*/build/nixl-device-examples-*/`). When one
//! is missing the host side still builds: a cargo warning says what is
//! missing and the binary's `simple_write` reports the same at run time (env
//! `NIXL_KERNELS_MISSING`). `NIXL_REQUIRE_KERNELS=1` turns that into a build
//! error. A `NIXL_INCLUDE_DIR` without the header is also a cargo warning.
//!
//! UCX versions. The kernels inline UCX's device code from the headers; the
//! host side is the UCX that NIXL's wheel bundles. PyPI's newest
//! libucx-cu13 is 1.22.0, while nixl-cu13 1.5.1 bundles a 1.23 development
//! build. They share one structure: the device memory list behind every
//! memory view handle, which starts with a u16 layout version
//! (`UCP_DEVICE_MEM_LIST_VERSION_V1`, 2 in both). The build passes the
//! headers' value to the library (`NIXL_UCX_MEM_LIST_VERSION`), and the host
//! reads each memory view's version once, right after preparing it
//! (`gpu::kernels::check_view`), refusing a view whose layout the kernels
//! would misread. (UCX's own per-call device check,
//! `UCP_DEVICE_ENABLE_PARAMS_CHECK`, does the same on every put and atomic
//! add; measured on two H200s it cost 0.27 µs of each 8-byte half round
//! trip, so it is left off.) Between UCX v1.22.0 and the 1.23 line
//! (openucx/ucx main) the structures on the cuda_ipc path are unchanged
//! (device memory lists, the 8-byte union of transport memory elements, the
//! cuda_ipc transport id).

use std::ffi::{CString, OsString, c_char, c_int, c_uint, c_void};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Reads one environment variable: the build passes the process's, the
/// tests (tests/setup_headers.rs) a table of their own.
pub type Env<'a> = &'a dyn Fn(&str) -> Option<OsString>;

/// The variables the lookups read; a change reruns the build script.
pub const WATCHED_ENV: [&str; 9] = [
    "NVCC",
    "CUDA_HOME",
    "CUDA_PATH",
    "NIXL_PREFIX",
    "NIXL_INCLUDE_DIR",
    "UCX_INCLUDE_DIR",
    "UCX_PREFIX",
    "NIXL_REQUIRE_KERNELS",
    "NIXL_CUDA_ARCH",
];

/// The kernel sources `cuda/<name>.cu`, each built into its own fatbin
/// that the library embeds as `NIXL_FATBIN_<NAME>`.
pub const SOURCES: [&str; 5] = ["kernels", "put_and_signal", "ep", "collectives", "pipeline"];

/// Called by build.rs: prints the directives of [`directives`] for this
/// build; panics (fails the build) only with `NIXL_REQUIRE_KERNELS=1`.
pub fn build() {
    println!("cargo::rustc-check-cfg=cfg(nixl_kernels)");
    for name in SOURCES {
        println!("cargo:rerun-if-changed=cuda/{name}.cu");
    }
    println!("cargo:rerun-if-changed=cuda/ep_common.cuh");
    println!("cargo:rerun-if-changed=cuda/kernel_report.h");
    println!("cargo:rerun-if-changed=cuda/device_common.cuh");
    println!("cargo:rerun-if-changed=cuda/ll.cuh");
    for var in WATCHED_ENV {
        println!("cargo:rerun-if-env-changed={var}");
    }
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap());
    let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").unwrap());
    match directives(&|k| std::env::var_os(k), &manifest, &out_dir) {
        Ok(lines) => lines.iter().for_each(|l| println!("{l}")),
        Err(why) => panic!("{why}"),
    }
}

/// The lines the build script prints for one kernel build in `out_dir`:
/// `build: …` notes, `cargo:` directives, and either `rustc-cfg=nixl_kernels`
/// with the fatbin's path or a `cargo:warning` saying what is missing.
/// Errors only with `NIXL_REQUIRE_KERNELS=1` when the kernels cannot be built.
pub fn directives(env: Env, manifest: &Path, out_dir: &Path) -> Result<Vec<String>, String> {
    let mut lines = Vec::new();
    match compile(env, manifest, out_dir, &mut lines) {
        Ok(fatbins) => {
            lines.push("cargo:rustc-cfg=nixl_kernels".into());
            for (name, fatbin) in SOURCES.iter().zip(fatbins) {
                let var = format!("NIXL_FATBIN_{}", name.to_uppercase());
                lines.push(format!("cargo:rustc-env={var}={}", fatbin.display()));
            }
        }
        Err(why) => {
            if env("NIXL_REQUIRE_KERNELS").is_some_and(|v| v == "1") {
                return Err(format!(
                    "NIXL_REQUIRE_KERNELS=1 but the device kernels cannot be built: {why}"
                ));
            }
            // Cargo replays a build script's warnings on every later
            // command, rebuilt or not: one short line, the whole story in a
            // `build:` line (`cargo build -vv`) and in the programs' message.
            lines.push(format!("build: device kernels left out: {why}"));
            lines.push(format!(
                "cargo:warning=device kernels left out (host side only): {} missing; \
                 scripts/setup.sh installs them (details: cargo build -vv)",
                missing_pieces(&why)
            ));
            lines.push(format!("cargo:rustc-env=NIXL_KERNELS_MISSING={why}"));
        }
    }
    Ok(lines)
}

/// The names of the missing pieces in [`compile`]'s error (`nvcc`, `NIXL
/// device header`, `UCX device headers`), or the error itself when it is
/// not a list of missing pieces (nvcc failed).
fn missing_pieces(why: &str) -> String {
    let pieces: Vec<&str> = ["nvcc", "NIXL device header", "UCX device headers"]
        .into_iter()
        .filter(|p| {
            why.split("; ")
                .any(|m| m.starts_with(p) && m.contains("not found"))
        })
        .collect();
    if pieces.is_empty() {
        why.to_string()
    } else {
        pieces.join(", ")
    }
}

/// Finds nvcc and both header sets, then compiles each of [`SOURCES`]
/// (`manifest/cuda/<name>.cu`) into `out_dir/<name>.fatbin`: all or none.
/// Errors name every missing piece at once (one line), or nvcc's first errors.
pub fn compile(
    env: Env,
    manifest: &Path,
    out_dir: &Path,
    lines: &mut Vec<String>,
) -> Result<Vec<PathBuf>, String> {
    let sites = venv_site_packages(&manifest.join(".venv"));
    let nvcc = find_nvcc(env, &sites).ok_or_else(|| {
        "nvcc not found (set NVCC or CUDA_HOME, or run scripts/setup.sh for the PyPI nvcc)"
            .to_string()
    });
    let nixl = find_nixl_include(env, manifest, lines);
    let ucx = find_ucx_include(env, &sites);
    let (nvcc, (nixl_inc, layout), ucx_inc) = match (nvcc, nixl, ucx) {
        (Ok(n), Ok(x), Ok(u)) => (n, x, u),
        (n, x, u) => {
            let missing: Vec<String> = [n.err(), x.err(), u.err()].into_iter().flatten().collect();
            return Err(missing.join("; "));
        }
    };
    lines.push(format!(
        "cargo:rerun-if-changed={}",
        ucx_inc.join("ucp/api/device/ucp_device_impl.h").display()
    ));
    lines.push(format!("build: nvcc {}", nvcc.display()));
    let mut defines = ucx_version_check(&ucx_inc, &sites, lines);
    defines.push(format!("-DNIXL_DEVICE_API_GENERIC={}", layout as u8));
    lines.push(format!(
        "cargo:rustc-env=NIXL_DEVICE_HEADER={}",
        layout.header()
    ));
    let arch = env("NIXL_CUDA_ARCH")
        .and_then(|a| a.into_string().ok())
        .unwrap_or_else(|| "90".into());
    let nvcc = Nvcc {
        path: nvcc,
        arch,
        defines,
        includes: [nixl_inc, ucx_inc],
    };
    SOURCES
        .iter()
        .map(|name| {
            nvcc.fatbin(
                &manifest.join(format!("cuda/{name}.cu")),
                &out_dir.join(format!("{name}.fatbin")),
            )
        })
        .collect()
}

/// nvcc as the kernels are built with it.
struct Nvcc {
    path: PathBuf,
    arch: String,
    defines: Vec<String>,
    includes: [PathBuf; 2],
}

impl Nvcc {
    /// Compiles `source` into the fatbin `out`; on failure, nvcc's first errors.
    fn fatbin(&self, source: &Path, out: &Path) -> Result<PathBuf, String> {
        let arch = &self.arch;
        let output = Command::new(&self.path)
            .args([
                "-std=c++17",
                "--expt-relaxed-constexpr",
                "-O3",
                "-fatbin",
                "-lineinfo",
            ])
            .args(&self.defines)
            // SASS for Hopper, plus PTX the driver can JIT for newer GPUs.
            .arg(format!(
                "-gencode=arch=compute_{arch},code=[sm_{arch},compute_{arch}]"
            ))
            .arg("-I")
            .arg(&self.includes[0])
            .arg("-I")
            .arg(&self.includes[1])
            .arg(source)
            .arg("-o")
            .arg(out)
            .output()
            .map_err(|e| format!("cannot run {}: {e}", self.path.display()))?;
        if !output.status.success() {
            let stderr = String::from_utf8_lossy(&output.stderr);
            let first: Vec<&str> = stderr
                .lines()
                .filter(|l| l.contains("error"))
                .take(3)
                .collect();
            return Err(format!(
                "nvcc failed on {}: {}",
                source.display(),
                first.join(" | ")
            ));
        }
        Ok(out.to_path_buf())
    }
}

fn venv_site_packages(venv: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(venv.join("lib")) else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok())
        .map(|e| e.path().join("site-packages"))
        .filter(|p| p.is_dir())
        .collect()
}

fn find_nvcc(env: Env, sites: &[PathBuf]) -> Option<PathBuf> {
    if let Some(p) = env("NVCC") {
        return Some(PathBuf::from(p));
    }
    let mut candidates: Vec<PathBuf> = ["CUDA_HOME", "CUDA_PATH"]
        .iter()
        .filter_map(|v| env(v))
        .map(|root| PathBuf::from(root).join("bin/nvcc"))
        .collect();
    if let Some(path) = env("PATH") {
        candidates.extend(std::env::split_paths(&path).map(|d| d.join("nvcc")));
    }
    candidates.push("/usr/local/cuda/bin/nvcc".into());
    candidates.extend(sites.iter().flat_map(|s| {
        [
            s.join("nvidia/cu13/bin/nvcc"),
            s.join("nvidia/cuda_nvcc/bin/nvcc"),
        ]
    }));
    candidates.into_iter().find(|p| p.is_file())
}

/// The two layouts of NIXL's device header the kernels compile against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeaderLayout {
    /// NIXL 1.x: `gpu/ucx/nixl_device.cuh`.
    Ucx = 0,
    /// Upstream's main after 1.x: the backend-neutral `gpu/nixl_device.cuh`.
    Generic = 1,
}

impl HeaderLayout {
    /// The header the kernels include.
    pub fn header(self) -> &'static str {
        match self {
            HeaderLayout::Ucx => "gpu/ucx/nixl_device.cuh",
            HeaderLayout::Generic => "gpu/nixl_device.cuh",
        }
    }

    /// Every file of the layout that must be there (besides `nixl_types.h`).
    pub fn files(self) -> &'static [&'static str] {
        match self {
            HeaderLayout::Ucx => &["gpu/ucx/nixl_device.cuh"],
            HeaderLayout::Generic => &[
                "gpu/nixl_device.cuh",
                "gpu/nixl_device_config.h",
                "gpu/common/nixl_device_api.cuh",
                "gpu/ucx/nixl_device_impl.cuh",
            ],
        }
    }
}

/// Which layout of NIXL's device header `dir` holds, if any (the
/// backend-neutral one first: an install that has it prepares its views for it).
pub fn nixl_header_layout(dir: &Path) -> Option<HeaderLayout> {
    if !dir.join("nixl_types.h").is_file() {
        return None;
    }
    [HeaderLayout::Generic, HeaderLayout::Ucx]
        .into_iter()
        .find(|l| l.files().iter().all(|f| dir.join(f).is_file()))
}

/// Whether `dir` holds NIXL's device header, in either layout (what
/// tests/setup_headers.rs asks; the build needs the layout).
#[allow(dead_code)]
pub fn has_nixl_header(dir: &Path) -> bool {
    nixl_header_layout(dir).is_some()
}

/// The folder to pass as `-I` for NIXL's device header, in the order of the
/// module docs. Adds a `build:` line naming the one used, a cargo warning
/// for a `NIXL_INCLUDE_DIR` without the header, and the paths to watch.
pub fn find_nixl_include(
    env: Env,
    manifest: &Path,
    lines: &mut Vec<String>,
) -> Result<(PathBuf, HeaderLayout), String> {
    let deps = manifest.join(".deps/nixl-include");
    // Watch the folder setup.sh fills, so files arriving there rebuild. A
    // path that does not exist would rerun the build every time: then its
    // parent (setup.sh creates the folder on every run).
    if let Some(watch) = [deps.clone(), manifest.join(".deps")]
        .iter()
        .find(|d| d.is_dir())
    {
        lines.push(format!("cargo:rerun-if-changed={}", watch.display()));
    }
    let explicit = env("NIXL_INCLUDE_DIR").map(PathBuf::from);
    let prefix = env("NIXL_PREFIX").map_or_else(|| "/opt/nvidia/nvda_nixl".into(), PathBuf::from);
    let mut candidates: Vec<(PathBuf, &str)> = Vec::new();
    if let Some(dir) = &explicit {
        candidates.push((dir.clone(), "NIXL_INCLUDE_DIR"));
    }
    candidates.push((prefix.join("include"), "$NIXL_PREFIX/include"));
    candidates.push((deps.clone(), ".deps/nixl-include (scripts/setup.sh)"));
    for (dir, label) in &candidates {
        if let Some(layout) = nixl_header_layout(dir) {
            for file in layout.files().iter().chain(&["nixl_types.h"]) {
                lines.push(format!(
                    "cargo:rerun-if-changed={}",
                    dir.join(file).display()
                ));
            }
            let stamp = stamp_note(dir, *dir == deps);
            lines.push(format!(
                "build: NIXL device header from {label}: {}{stamp}; layout {}",
                dir.display(),
                layout.header()
            ));
            return Ok((dir.clone(), layout));
        }
        if explicit.as_ref() == Some(dir) {
            lines.push(format!(
                "cargo:warning=NIXL_INCLUDE_DIR={} has no gpu/ucx/nixl_device.cuh or gpu/nixl_device.cuh + nixl_types.h; \
                 looking in $NIXL_PREFIX/include and .deps/nixl-include",
                dir.display()
            ));
        }
    }
    let looked: Vec<String> = candidates
        .iter()
        .map(|(d, _)| d.display().to_string())
        .collect();
    Err(format!(
        "NIXL device header (gpu/ucx/nixl_device.cuh or gpu/nixl_device.cuh, + nixl_types.h) not found in {}: run \
         scripts/setup.sh (it downloads NIXL v1.4.0's two files into .deps/nixl-include; \
         without internet it says where to get them), or set NIXL_INCLUDE_DIR (or NIXL_PREFIX) \
         to a NIXL install's headers",
        looked.join(", ")
    ))
}

/// What setup.sh's stamp says about the files in `dir`.
fn stamp_note(dir: &Path, is_deps: bool) -> String {
    let stamp = std::fs::read_to_string(dir.join("nixl-headers.stamp")).unwrap_or_default();
    match stamp.lines().find_map(|l| l.strip_prefix("tag ")) {
        Some(tag) => format!(" (NIXL {tag}, SHA-256 checked by scripts/setup.sh)"),
        None if is_deps => " (no stamp: not checked; scripts/setup.sh checks them)".into(),
        None => String::new(),
    }
}

fn find_ucx_include(env: Env, sites: &[PathBuf]) -> Result<PathBuf, String> {
    let mut candidates: Vec<PathBuf> = env("UCX_INCLUDE_DIR")
        .map(PathBuf::from)
        .into_iter()
        .collect();
    candidates.extend(sites.iter().map(|s| s.join("libucx/include")));
    candidates.extend(env("UCX_PREFIX").map(|p| PathBuf::from(p).join("include")));
    candidates
        .extend(["/usr/include", "/usr/local/include", "/opt/ucx/include"].map(PathBuf::from));
    candidates
        .iter()
        .find(|d| d.join("ucp/api/device/ucp_device_impl.h").is_file())
        .cloned()
        .ok_or_else(|| {
            "UCX device headers (ucp/api/device/ucp_device_impl.h) not found: run scripts/setup.sh \
             (PyPI libucx-cu13) or set UCX_INCLUDE_DIR"
                .to_string()
        })
}

/// Compares the UCX device headers' version with the UCX that NIXL's wheel
/// bundles and returns the nvcc defines that make a difference safe (module
/// docs), with a `build:` line stating the versions and the decision.
pub fn ucx_version_check(
    ucx_inc: &Path,
    sites: &[PathBuf],
    lines: &mut Vec<String>,
) -> Vec<String> {
    let headers = ucx_header_version(ucx_inc);
    let bundled = bundled_ucx_version(sites);
    let same = match (&headers, &bundled) {
        (Some((major, minor)), Some(v)) => v.starts_with(&format!("{major}.{minor}.")),
        _ => false,
    };
    let shown_headers = headers.map_or("unknown".into(), |(a, b)| format!("{a}.{b}"));
    let shown_bundled = bundled.unwrap_or_else(|| "unknown (no nixl-cu1x wheel in .venv)".into());
    let list = std::fs::read_to_string(ucx_inc.join("ucp/api/device/ucp_device_types.h"))
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("#define UCP_DEVICE_MEM_LIST_VERSION_V1"))
                .map(|v| v.trim().to_string())
        })
        .unwrap_or_else(|| "0".into());
    lines.push(format!("cargo:rustc-env=NIXL_UCX_MEM_LIST_VERSION={list}"));
    let relation = if same { "match" } else { "differ from" };
    lines.push(format!(
        "build: UCX device headers {shown_headers} ({}) {relation} NIXL's bundled UCX {shown_bundled}; \
         each memory view's layout version is checked against the headers' {list} when it is \
         prepared (the cuda_ipc layouts of 1.22 and 1.23 are the same)",
        ucx_inc.display()
    ));
    Vec::new()
}

/// `(UCP_API_MAJOR, UCP_API_MINOR)` from `ucp/api/ucp_version.h`.
fn ucx_header_version(ucx_inc: &Path) -> Option<(u32, u32)> {
    let text = std::fs::read_to_string(ucx_inc.join("ucp/api/ucp_version.h")).ok()?;
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse().ok())
    };
    Some((
        field("#define UCP_API_MAJOR")?,
        field("#define UCP_API_MINOR")?,
    ))
}

unsafe extern "C" {
    fn dlopen(filename: *const c_char, flags: c_int) -> *mut c_void;
    fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void;
}

/// The version the UCX bundled with NIXL's wheel reports
/// (`ucp_get_version`, e.g. "1.23.0"), from `nixl_cu13.libs/libucp*.so*`
/// in the project's `.venv`.
pub fn bundled_ucx_version(sites: &[PathBuf]) -> Option<String> {
    let lib = sites
        .iter()
        .flat_map(|s| [s.join("nixl_cu13.libs"), s.join("nixl_cu12.libs")])
        .filter_map(|d| std::fs::read_dir(d).ok())
        .flatten()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("libucp") && n.contains(".so"))
        })?;
    let path = CString::new(lib.to_str()?).ok()?;
    // SAFETY: loads the library NIXL's UCX plugin loads at run time (its
    // constructors only set up UCX's globals) and calls one getter with
    // three out-parameters; the library stays loaded until the script exits.
    unsafe {
        let handle = dlopen(path.as_ptr(), 2 /* RTLD_NOW */);
        if handle.is_null() {
            return None;
        }
        let sym = dlsym(handle, c"ucp_get_version".as_ptr());
        if sym.is_null() {
            return None;
        }
        let get: unsafe extern "C" fn(*mut c_uint, *mut c_uint, *mut c_uint) =
            std::mem::transmute(sym);
        let (mut major, mut minor, mut release) = (0, 0, 0);
        get(&mut major, &mut minor, &mut release);
        Some(format!("{major}.{minor}.{release}"))
    }
}
