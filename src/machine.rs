//! Can this machine run a device-API program? Everything local that must
//! hold, checked before any network and reported together, so a machine
//! that cannot run a program says every reason at once: the kernels built
//! into this binary, a GPU, NIXL loadable, and a `UCX_TLS` that keeps
//! cuda_ipc. simple_write, ep and collectives all start with it.

use anyhow::{Result, bail};

use crate::gpu::context::device_count;
use crate::gpu::module::{KernelsError, availability};
use crate::nixl::runtime;

/// Returns how many GPUs there are, or one error naming `program` and
/// listing every problem (then `note()`, something the program adds about
/// itself, e.g. that its baseline would be skipped too).
pub fn check(program: &str, note: impl FnOnce() -> String) -> Result<usize> {
    let mut problems = Vec::new();
    if let Err(why) = availability() {
        problems.push(KernelsError::NotBuilt(why).to_string());
    }
    let gpus = device_count().unwrap_or_else(|e| {
        problems.push(e.to_string());
        0
    });
    if let Err(e) = runtime::load() {
        problems.push(e.to_string());
    }
    problems.extend(runtime::ucx_tls_problem());
    if !problems.is_empty() {
        bail!(
            "this machine cannot run {program}:\n  - {}{}",
            problems.join("\n  - "),
            note()
        );
    }
    Ok(gpus)
}
