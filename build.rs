//! Build script: compiles the CUDA kernels (cuda/kernels.cu, nvcc; in
//! build/) and, with the `libtorch` feature, gives this crate's binaries the
//! rpath to the libtorch that the tcpstore crate's shim links.

#[path = "build/cuda_kernels.rs"]
mod cuda_kernels;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    cuda_kernels::build();
    // Set by crates/tcpstore/build.rs (its `links = "torchstore"`): a
    // dependency's link-arg does not reach our binaries, so without it they
    // would need LD_LIBRARY_PATH.
    if std::env::var_os("CARGO_FEATURE_LIBTORCH").is_some() {
        println!("cargo:rerun-if-env-changed=DEP_TORCHSTORE_LIBDIR");
        if let Some(lib) = std::env::var_os("DEP_TORCHSTORE_LIBDIR") {
            println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib.to_string_lossy());
        }
    }
}
