//! One kernel launch as this suite makes them: a one-dimensional grid,
//! no dynamic shared memory, and the kernel's one parameter struct passed
//! by value (`#[repr(C)]`, mirrored field for field in `cuda/`).

use cudarc::driver::{
    CudaFunction, CudaStream, DeviceRepr, DriverError, LaunchConfig, PushKernelArg,
};

/// `blocks` blocks of `threads` threads, one dimension each, no dynamic
/// shared memory (every kernel of the suite declares its shared memory
/// statically).
pub const fn grid(blocks: u32, threads: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Queues `f` over [`grid`]`(blocks, threads)` on `stream`, `p` its one
/// parameter. Errors: the driver's, e.g. `CUDA_ERROR_INVALID_VALUE` for 0
/// blocks or more threads than the kernel's `__launch_bounds__`.
///
/// # Safety
/// `P` must be the kernel's parameter type, laid out as `cuda/` declares
/// it, and every device address in `p` must stay valid until the kernel
/// completes.
pub unsafe fn launch<P: DeviceRepr>(
    stream: &CudaStream,
    f: &CudaFunction,
    (blocks, threads): (u32, u32),
    p: &P,
) -> Result<(), DriverError> {
    let mut b = stream.launch_builder(f);
    b.arg(p);
    // SAFETY: as this function's contract.
    unsafe { b.launch(grid(blocks, threads)) }.map(|_| ())
}
