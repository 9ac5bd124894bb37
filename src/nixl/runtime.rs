//! Finding the NIXL library at run time.
//!
//! `nixl-sys` is built with its `stub-api` feature: its stubs
//! `dlopen("libnixl_capi.so")` by bare name on the first NIXL call, and abort
//! the process if that fails. [`load`] runs first: it finds the library by
//! full path, loads it `RTLD_GLOBAL` (so the stubs' later dlopen of the
//! soname resolves to the copy already in the process), and points
//! `NIXL_PLUGIN_DIR` at the plugins beside it. A missing library becomes an
//! error naming every place searched and the command that fixes it, instead
//! of an abort inside the stubs.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The C API library that nixl-sys binds.
pub const CAPI_LIB: &str = "libnixl_capi.so";

/// Where NIXL was found.
#[derive(Clone, Debug)]
pub struct NixlRuntime {
    /// Directory holding `libnixl_capi.so` (and `libnixl.so`).
    pub lib_dir: PathBuf,
    /// Plugin directory in effect (`NIXL_PLUGIN_DIR`).
    pub plugin_dir: PathBuf,
    /// How the directory was found, e.g. `NIXL_LIB_DIR` or `project .venv`.
    pub found_by: String,
}

/// Why NIXL could not be loaded.
#[derive(Clone, Debug, thiserror::Error)]
pub enum NixlLoadError {
    #[error(
        "NIXL library ({CAPI_LIB}) not found. Searched:\n{}\nFix: run `scripts/setup.sh` (installs the nixl-cu13 wheel into .venv), \
         or set NIXL_LIB_DIR to the folder holding {CAPI_LIB}, or NIXL_PREFIX to a NIXL install",
        .searched.iter().map(|s| format!("  - {s}")).collect::<Vec<_>>().join("\n")
    )]
    NotFound { searched: Vec<String> },
    #[error(
        "found {path} but could not load it: {reason}. Its dependencies (libnixl.so, UCX) must sit beside it as in the wheel or install"
    )]
    LoadFailed { path: PathBuf, reason: String },
}

/// The problem with `UCX_TLS`, if it leaves out cuda_ipc: the only UCX
/// transport with device-API support between GPUs of one machine, so every
/// remote memory view would fail with "lane not found". `UCX_TLS` lists
/// transports to use, or with a leading `^` to leave out; `cuda` and `all`
/// include cuda_ipc.
pub fn ucx_tls_problem() -> Option<String> {
    let tls = std::env::var("UCX_TLS").ok()?;
    let names_it = tls
        .trim_start_matches('^')
        .split(',')
        .map(str::trim)
        .any(|t| matches!(t, "cuda_ipc" | "cuda" | "all"));
    let excluded = names_it == tls.starts_with('^');
    excluded.then(|| {
        format!(
            "UCX_TLS={tls} leaves out cuda_ipc, the transport NIXL's device API uses between GPUs of one machine \
             (memory views would fail with \"lane not found\"): unset UCX_TLS or include cuda_ipc"
        )
    })
}

static LOADED: OnceLock<Result<NixlRuntime, NixlLoadError>> = OnceLock::new();

/// Finds and loads NIXL once per process; later calls return the first result.
///
/// Search order: `NIXL_LIB_DIR`; `NIXL_PREFIX` (default `/opt/nvidia/nvda_nixl`)
/// under `lib/x86_64-linux-gnu`, `lib64`, `lib`; the project's `.venv` (the
/// `nixl-cu13`/`nixl-cu12` wheel); the `python3` on `PATH`.
///
/// Sets `NIXL_PLUGIN_DIR` to `<lib_dir>/plugins` when it is unset. Call it
/// early in `main`, before other threads start, because it edits the
/// environment.
pub fn load() -> Result<NixlRuntime, NixlLoadError> {
    LOADED.get_or_init(load_uncached).clone()
}

fn load_uncached() -> Result<NixlRuntime, NixlLoadError> {
    let mut searched = Vec::new();
    let (lib_dir, found_by) = find(&mut searched).ok_or(NixlLoadError::NotFound { searched })?;
    let path = lib_dir.join(CAPI_LIB);
    // SAFETY: loading a shared library runs its initialisers; NIXL's are
    // ordinary C++ static constructors.
    let lib = unsafe {
        libloading::os::unix::Library::open(
            Some(&path),
            libloading::os::unix::RTLD_NOW | libloading::os::unix::RTLD_GLOBAL,
        )
    }
    .map_err(|e| NixlLoadError::LoadFailed {
        path: path.clone(),
        reason: e.to_string(),
    })?;
    // Keep it loaded for the life of the process: nixl-sys holds raw pointers into it.
    std::mem::forget(lib);

    let plugin_dir = match std::env::var_os("NIXL_PLUGIN_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => {
            let dir = lib_dir.join("plugins");
            // SAFETY: documented precondition — called before other threads start.
            unsafe { std::env::set_var("NIXL_PLUGIN_DIR", &dir) };
            dir
        }
    };
    Ok(NixlRuntime {
        lib_dir,
        plugin_dir,
        found_by,
    })
}

fn has_capi(dir: &Path) -> bool {
    dir.join(CAPI_LIB).is_file()
}

fn find(searched: &mut Vec<String>) -> Option<(PathBuf, String)> {
    let try_dir = |dir: PathBuf, how: &str, searched: &mut Vec<String>| {
        if has_capi(&dir) {
            Some((dir, how.to_string()))
        } else {
            searched.push(format!("{} ({how})", dir.display()));
            None
        }
    };

    if let Some(dir) = std::env::var_os("NIXL_LIB_DIR") {
        if let found @ Some(_) = try_dir(PathBuf::from(dir), "NIXL_LIB_DIR", searched) {
            return found;
        }
    } else {
        searched.push("NIXL_LIB_DIR (unset)".into());
    }

    let prefix = std::env::var("NIXL_PREFIX").unwrap_or_else(|_| "/opt/nvidia/nvda_nixl".into());
    for sub in [
        "lib/x86_64-linux-gnu",
        "lib/aarch64-linux-gnu",
        "lib64",
        "lib",
    ] {
        if let found @ Some(_) = try_dir(Path::new(&prefix).join(sub), "NIXL_PREFIX", searched) {
            return found;
        }
    }

    for venv in project_venvs() {
        for site in site_packages(&venv) {
            for wheel in ["nixl_cu13", "nixl_cu12"] {
                let dir = site.join(format!(".{wheel}.mesonpy.libs"));
                if has_capi(&dir) {
                    return Some((dir, format!("{} wheel in {}", wheel, venv.display())));
                }
            }
        }
        searched.push(format!(
            "{} (project venv: nixl-cu13/nixl-cu12 wheel)",
            venv.display()
        ));
    }

    match python_site_libs() {
        Some(dir) if has_capi(&dir) => return Some((dir, "python3 on PATH".into())),
        _ => searched.push("python3 on PATH (no importable nixl_cu13/nixl_cu12 package)".into()),
    }
    None
}

/// The project's virtual environments: the checkout this binary was built
/// from, and `.venv` in the current directory.
fn project_venvs() -> Vec<PathBuf> {
    let mut v = vec![Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv")];
    if let Ok(cwd) = std::env::current_dir() {
        let here = cwd.join(".venv");
        if !v.contains(&here) {
            v.push(here);
        }
    }
    v
}

fn site_packages(venv: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(venv.join("lib")) else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok())
        .map(|e| e.path().join("site-packages"))
        .filter(|p| p.is_dir())
        .collect()
}

/// Asks `python3` where the nixl wheel's libraries are, without importing
/// the package (its `__init__` imports numpy).
fn python_site_libs() -> Option<PathBuf> {
    let script = "import importlib.util as u\n\
                  for n in ('nixl_cu13','nixl_cu12'):\n\
                  \x20   s=u.find_spec(n)\n\
                  \x20   if s and s.origin:\n\
                  \x20       import os; print(os.path.join(os.path.dirname(os.path.dirname(s.origin)), '.'+n+'.mesonpy.libs')); break\n";
    let out = Command::new("python3").args(["-c", script]).output().ok()?;
    let line = String::from_utf8(out.stdout).ok()?;
    let line = line.trim();
    (!line.is_empty()).then(|| PathBuf::from(line))
}

impl NixlRuntime {
    /// NIXL's version when it came from a wheel (its `.dist-info` folder
    /// beside the libraries), e.g. `nixl-cu13 1.5.1`.
    pub fn nixl_version(&self) -> Option<String> {
        let site = self.lib_dir.parent()?;
        std::fs::read_dir(site)
            .ok()?
            .filter_map(|e| e.ok())
            .find_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                let stem = name.strip_suffix(".dist-info")?;
                let (pkg, ver) = stem.split_once('-')?;
                pkg.starts_with("nixl")
                    .then(|| format!("{} {ver}", pkg.replace('_', "-")))
            })
    }

    /// The version string of the UCX that NIXL's UCX plugin loads
    /// (`ucp_get_version_string`), found beside the libraries.
    pub fn ucx_version(&self) -> Option<String> {
        let dirs = [
            self.lib_dir.clone(),
            self.lib_dir.parent()?.join("nixl_cu13.libs"),
            self.lib_dir.parent()?.join("nixl_cu12.libs"),
        ];
        let lib = dirs
            .iter()
            .filter_map(|d| std::fs::read_dir(d).ok())
            .flatten()
            .filter_map(|e| e.ok())
            .map(|e| e.path())
            .find(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("libucp") && n.contains(".so"))
            })?;
        // SAFETY: loading the same UCX the plugin loads; we call one getter.
        unsafe {
            let lib = libloading::Library::new(&lib).ok()?;
            let f: libloading::Symbol<unsafe extern "C" fn() -> *const std::ffi::c_char> =
                lib.get(b"ucp_get_version_string").ok()?;
            let s = std::ffi::CStr::from_ptr(f()).to_string_lossy().into_owned();
            std::mem::forget(lib);
            Some(s)
        }
    }
}
