//! Build script: compiles the CUDA kernels (cuda/kernels.cu, nvcc) and, with
//! the `libtorch` feature, the c10d::TCPStore shim (cc + bindgen).
//! Each part lives in build/ so this file stays a table of contents.

#[path = "build/cuda_kernels.rs"]
mod cuda_kernels;
#[path = "build/libtorch_shim.rs"]
mod libtorch_shim;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    cuda_kernels::build();
    if std::env::var_os("CARGO_FEATURE_LIBTORCH").is_some() {
        libtorch_shim::build();
    }
}
