//! Compiles cuda/kernels.cu (and cuda/ep.cu, the expert-parallel kernels,
//! into a fatbin of its own) with nvcc; the binary embeds both.
//!
//! Needs three things; each is looked for in the order a user's machine has it:
//! - nvcc: `NVCC`, `CUDA_HOME`/`CUDA_PATH` `/bin/nvcc`, `nvcc` on PATH,
//!   `/usr/local/cuda/bin/nvcc`, the project's `.venv` (PyPI nvidia-cuda-nvcc);
//! - NIXL's device header (`gpu/ucx/nixl_device.cuh`, `nixl_types.h`):
//!   `NIXL_INCLUDE_DIR`, else `$NIXL_PREFIX/include` (default
//!   `/opt/nvidia/nvda_nixl/include`); it is on no package registry;
//! - UCX's device headers (`ucp/api/device/ucp_device_impl.h`):
//!   `UCX_INCLUDE_DIR`, the project's `.venv` (PyPI libucx-cu13),
//!   `$UCX_PREFIX/include`, `/usr/include`, `/opt/ucx/include`.
//!
//! When one is missing the host side still builds: a cargo warning says what
//! is missing and the binary's `simple_write` reports the same at run time
//! (env `NIXL_KERNELS_MISSING`; for ep.cu `NIXL_EP_KERNELS_MISSING`).
//! `NIXL_REQUIRE_KERNELS=1` turns that into a build error.

use std::path::{Path, PathBuf};
use std::process::Command;

pub fn build() {
    println!("cargo::rustc-check-cfg=cfg(nixl_kernels)");
    println!("cargo::rustc-check-cfg=cfg(nixl_ep_kernels)");
    println!("cargo:rerun-if-changed=cuda/kernels.cu");
    println!("cargo:rerun-if-changed=cuda/ep.cu");
    println!("cargo:rerun-if-changed=cuda/ep_common.cuh");
    for var in [
        "NVCC",
        "CUDA_HOME",
        "CUDA_PATH",
        "NIXL_PREFIX",
        "NIXL_INCLUDE_DIR",
        "UCX_INCLUDE_DIR",
        "UCX_PREFIX",
        "NIXL_REQUIRE_KERNELS",
        "NIXL_CUDA_ARCH",
    ] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    match compile("kernels.cu", "kernels.fatbin") {
        Ok(fatbin) => {
            println!("cargo:rustc-cfg=nixl_kernels");
            println!("cargo:rustc-env=NIXL_KERNELS_FATBIN={}", fatbin.display());
        }
        Err(why) => {
            if std::env::var("NIXL_REQUIRE_KERNELS").as_deref() == Ok("1") {
                panic!("NIXL_REQUIRE_KERNELS=1 but the device kernels cannot be built: {why}");
            }
            println!("cargo:warning=device kernels left out (host side only): {why}");
            println!("cargo:rustc-env=NIXL_KERNELS_MISSING={why}");
        }
    }
    match compile("ep.cu", "ep.fatbin") {
        Ok(fatbin) => {
            println!("cargo:rustc-cfg=nixl_ep_kernels");
            println!(
                "cargo:rustc-env=NIXL_EP_KERNELS_FATBIN={}",
                fatbin.display()
            );
        }
        Err(why) => {
            if std::env::var("NIXL_REQUIRE_KERNELS").as_deref() == Ok("1") {
                panic!("NIXL_REQUIRE_KERNELS=1 but the EP kernels cannot be built: {why}");
            }
            println!("cargo:warning=EP kernels left out (host side only): {why}");
            println!("cargo:rustc-env=NIXL_EP_KERNELS_MISSING={why}");
        }
    }
}

/// Compiles `cuda/<source>` into `$OUT_DIR/<output>`.
fn compile(source: &str, output: &str) -> Result<PathBuf, String> {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    let venv_sites = venv_site_packages(&manifest.join(".venv"));
    let nvcc = find_nvcc(&venv_sites).ok_or(
        "nvcc not found (set NVCC or CUDA_HOME, or run scripts/setup.sh for the PyPI nvcc)"
            .to_string(),
    )?;
    let nixl_inc = find_nixl_include()?;
    let ucx_inc = find_ucx_include(&venv_sites)?;
    for watched in [
        nixl_inc.join("gpu/ucx/nixl_device.cuh"),
        ucx_inc.join("ucp/api/device/ucp_device_impl.h"),
    ] {
        println!("cargo:rerun-if-changed={}", watched.display());
    }

    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap()).join(output);
    let arch = std::env::var("NIXL_CUDA_ARCH").unwrap_or_else(|_| "90".into());
    let status = Command::new(&nvcc)
        .args([
            "-std=c++17",
            "--expt-relaxed-constexpr",
            "-O3",
            "-fatbin",
            "-lineinfo",
        ])
        // SASS for Hopper, plus PTX the driver can JIT for newer GPUs.
        .arg(format!(
            "-gencode=arch=compute_{arch},code=[sm_{arch},compute_{arch}]"
        ))
        .arg("-I")
        .arg(&nixl_inc)
        .arg("-I")
        .arg(&ucx_inc)
        .arg(manifest.join("cuda").join(source))
        .arg("-o")
        .arg(&out)
        .output()
        .map_err(|e| format!("cannot run {}: {e}", nvcc.display()))?;
    if !status.status.success() {
        let stderr = String::from_utf8_lossy(&status.stderr);
        let first: Vec<&str> = stderr
            .lines()
            .filter(|l| l.contains("error"))
            .take(3)
            .collect();
        return Err(format!(
            "nvcc failed on cuda/{source}: {}",
            first.join(" | ")
        ));
    }
    Ok(out)
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

fn find_nvcc(sites: &[PathBuf]) -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("NVCC") {
        return Some(PathBuf::from(p));
    }
    let mut candidates: Vec<PathBuf> = ["CUDA_HOME", "CUDA_PATH"]
        .iter()
        .filter_map(|v| std::env::var_os(v))
        .map(|root| PathBuf::from(root).join("bin/nvcc"))
        .collect();
    if let Some(path) = std::env::var_os("PATH") {
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

fn find_nixl_include() -> Result<PathBuf, String> {
    let dir = match std::env::var_os("NIXL_INCLUDE_DIR") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(
            std::env::var("NIXL_PREFIX").unwrap_or_else(|_| "/opt/nvidia/nvda_nixl".into()),
        )
        .join("include"),
    };
    if dir.join("gpu/ucx/nixl_device.cuh").is_file() && dir.join("nixl_types.h").is_file() {
        Ok(dir)
    } else {
        Err(format!(
            "NIXL device header not found: no gpu/ucx/nixl_device.cuh + nixl_types.h under {} \
             (install NIXL with its headers and set NIXL_PREFIX, or set NIXL_INCLUDE_DIR)",
            dir.display()
        ))
    }
}

fn find_ucx_include(sites: &[PathBuf]) -> Result<PathBuf, String> {
    let mut candidates: Vec<PathBuf> = std::env::var_os("UCX_INCLUDE_DIR")
        .map(PathBuf::from)
        .into_iter()
        .collect();
    candidates.extend(sites.iter().map(|s| s.join("libucx/include")));
    candidates.extend(std::env::var_os("UCX_PREFIX").map(|p| PathBuf::from(p).join("include")));
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
