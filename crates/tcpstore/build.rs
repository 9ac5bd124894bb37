//! Build script: with the `libtorch` feature, the C++ shim over
//! c10d::TCPStore; without it, nothing.
//!
//! Finds libtorch, compiles `src/libtorch/shim.cpp` with the `cc`
//! crate, generates Rust bindings for `shim.h` with bindgen into
//! `$OUT_DIR/torchstore_shim.rs`, and links `torch_cpu` + `c10` with an rpath
//! to their directory so binaries and tests run without LD_LIBRARY_PATH
//! (and tells dependents that directory: `DEP_TORCHSTORE_LIBDIR`).

use std::env;
use std::path::{Path, PathBuf};

const SHIM_DIR: &str = "src/libtorch";

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    if env::var_os("CARGO_FEATURE_LIBTORCH").is_none() {
        return;
    }
    let manifest =
        PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    println!("cargo:rerun-if-changed={SHIM_DIR}/shim.cpp");
    println!("cargo:rerun-if-changed={SHIM_DIR}/shim.h");

    let torch = match find_libtorch(&manifest) {
        Ok(dir) => dir,
        Err(looked) => {
            // A build script can only fail by panicking; the message is what
            // the user sees, so make it the fix.
            panic!(
                "\n\nfeature `libtorch`: no libtorch found. Looked in:\n{looked}\n\
                 Run `scripts/setup.sh` (unpacks libtorch into .deps/libtorch/torch), \
                 or set LIBTORCH to a directory with include/ and lib/libtorch_cpu.so.\n\n"
            );
        }
    };
    let include = torch.join("include");
    let lib = torch.join("lib");

    let mut shim = cc::Build::new();
    shim.cpp(true)
        .file(manifest.join(SHIM_DIR).join("shim.cpp"))
        .include(manifest.join(SHIM_DIR))
        .flag("-std=c++20")
        .define("_GLIBCXX_USE_CXX11_ABI", "1");
    // As system headers: torch's are not -Wextra clean, ours must stay so.
    for dir in [include.clone(), include.join("torch/csrc/api/include")] {
        shim.flag("-isystem").flag(dir.to_string_lossy().as_ref());
    }
    shim.compile("torchstore_shim");

    println!("cargo:rustc-link-search=native={}", lib.display());
    println!("cargo:rustc-link-lib=dylib=torch_cpu");
    println!("cargo:rustc-link-lib=dylib=c10");
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib.display());
    // A link-arg reaches only this package's own binaries and tests; the
    // crates that depend on this one read the directory (`links` metadata,
    // DEP_TORCHSTORE_LIBDIR) to give theirs the same rpath.
    println!("cargo:libdir={}", lib.display());

    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    bindgen::Builder::default()
        .header(manifest.join(SHIM_DIR).join("shim.h").to_string_lossy())
        .allowlist_function("torchstore_.*")
        .allowlist_type("torchstore_.*")
        .rustified_non_exhaustive_enum("torchstore_error_kind")
        // The crate's edition: `unsafe extern` blocks need Rust 1.85.
        .rust_target(bindgen::RustTarget::stable(85, 0).unwrap_or_else(|e| panic!("bindgen rust target 1.85: {e}")))
        .rust_edition(bindgen::RustEdition::Edition2024)
        .generate()
        .unwrap_or_else(|e| panic!("bindgen failed on {SHIM_DIR}/shim.h (libclang is needed: apt install libclang-dev): {e}"))
        .write_to_file(out.join("torchstore_shim.rs"))
        .expect("writing the shim bindings to OUT_DIR");
}

/// libtorch as the Rust ecosystem looks for it: `$LIBTORCH`, then the copy
/// `scripts/setup.sh` unpacks, then a full torch in the project's venv.
/// Returns the directory holding `include/` and `lib/`, or what was tried.
fn find_libtorch(manifest: &Path) -> Result<PathBuf, String> {
    let mut looked = Vec::new();
    let mut candidates = Vec::new();
    // An explicit LIBTORCH is authoritative (as for torch-sys): a wrong one
    // must fail loudly rather than silently pick another copy.
    if let Some(dir) = env::var_os("LIBTORCH") {
        candidates.push(("LIBTORCH", PathBuf::from(dir)));
    } else {
        candidates.extend(default_candidates(manifest));
    }
    for (source, dir) in candidates {
        let ok = dir.join("lib/libtorch_cpu.so").is_file()
            && dir.join("lib/libc10.so").is_file()
            && dir
                .join("include/torch/csrc/distributed/c10d/TCPStore.hpp")
                .is_file();
        looked.push(format!(
            "  - {} ({source}){}",
            dir.display(),
            if ok { "" } else { ": no" }
        ));
        if ok {
            return Ok(dir);
        }
    }
    Err(looked.join("\n"))
}

/// The project's own copies, in this crate's directory or the workspace's
/// (two levels up, `crates/tcpstore`): `.deps` from `scripts/setup.sh`,
/// then a full torch in `.venv`.
fn default_candidates(manifest: &Path) -> Vec<(&'static str, PathBuf)> {
    let mut candidates = Vec::new();
    let workspace = manifest.ancestors().nth(2).unwrap_or(manifest);
    for root in [manifest, workspace] {
        candidates.push((
            ".deps (scripts/setup.sh)",
            root.join(".deps/libtorch/torch"),
        ));
        if let Ok(entries) = std::fs::read_dir(root.join(".venv/lib")) {
            for entry in entries.flatten() {
                candidates.push((".venv torch", entry.path().join("site-packages/torch")));
            }
        }
    }
    candidates
}
