//! One kernel launch as this suite makes them: a one-dimensional grid,
//! no dynamic shared memory, and the kernel's one parameter struct passed
//! by value (`#[repr(C)]`, mirrored field for field in `cuda/`).

use cudarc::driver::{
    CudaFunction, CudaStream, DeviceRepr, DriverError, LaunchConfig, PushKernelArg, sys,
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

/// How a kernel is launched beyond its grid: the launch attributes of
/// `cuLaunchKernelEx` this suite uses. The default is a plain launch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LaunchAs {
    /// CUDA's programmatic stream serialization (Hopper's programmatic
    /// dependent launch, `CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION`):
    /// the kernel may start while the kernel before it on the stream still
    /// runs, once every block of that kernel has called `allow_next_launch`
    /// (or exited), and its launch and everything before its
    /// `wait_previous_grid` overlap that kernel's tail
    /// (`cuda/device_common.cuh`). Only a kernel right behind another can
    /// overlap; after anything else (an event, a copy) it launches as a
    /// plain one would. Inside a stream capture it becomes a programmatic
    /// edge of the graph.
    pub pdl: bool,
    /// The remote memory-synchronization domain
    /// (`CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN` =
    /// `CU_LAUNCH_MEM_SYNC_DOMAIN_REMOTE`, Hopper): a fence the kernel
    /// issues orders only memory operations of that domain, and one issued
    /// in the default domain does not wait for the kernel's traffic. NCCL
    /// launches its kernels there on sm90 (`NCCL_MEM_SYNC_DOMAIN`, 1 by
    /// default). Kernels in different domains are system-scope apart even
    /// on one GPU: every kernel that synchronizes with another at GPU scope
    /// must be launched in the same domain.
    pub remote_domain: bool,
}

/// As [`launch`], by `cuLaunchKernelEx` with the attributes `how` asks for
/// (none for the default), so that an A/B of one attribute changes only
/// it. Errors: the driver's, as [`launch`].
///
/// # Safety
/// As [`launch`]; and with `how.pdl`, `f` must call `wait_previous_grid`
/// before it reads or writes memory an earlier kernel on the stream writes
/// or reads.
pub unsafe fn launch_as<P: DeviceRepr>(
    stream: &CudaStream,
    f: &CudaFunction,
    (blocks, threads): (u32, u32),
    p: &P,
    how: LaunchAs,
) -> Result<(), DriverError> {
    // On the stack, not the heap: this runs once per launch.
    // SAFETY: zeroed attributes are valid C structs; ids and values set below.
    let mut attrs: [sys::CUlaunchAttribute; 2] = unsafe { std::mem::zeroed() };
    let mut n = 0;
    if how.pdl {
        attrs[n].id =
            sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attrs[n].value.programmaticStreamSerializationAllowed = 1;
        n += 1;
    }
    if how.remote_domain {
        attrs[n].id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN;
        attrs[n].value.memSyncDomain = sys::CUlaunchMemSyncDomain::CU_LAUNCH_MEM_SYNC_DOMAIN_REMOTE;
        n += 1;
    }
    let cfg = sys::CUlaunchConfig {
        gridDimX: blocks,
        gridDimY: 1,
        gridDimZ: 1,
        blockDimX: threads,
        blockDimY: 1,
        blockDimZ: 1,
        sharedMemBytes: 0,
        hStream: stream.cu_stream(),
        attrs: match n {
            0 => std::ptr::null_mut(),
            _ => attrs.as_mut_ptr(),
        },
        numAttrs: n as u32,
    };
    // The driver copies the parameter out of `p` at launch.
    let mut args = [p as *const P as *mut std::ffi::c_void];
    stream.context().bind_to_thread()?;
    // SAFETY: a live function and stream of this context; `args` holds the
    // kernel's one parameter, of its type (this function's contract).
    unsafe {
        sys::cuLaunchKernelEx(
            &cfg,
            f.cu_function(),
            args.as_mut_ptr(),
            std::ptr::null_mut(),
        )
        .result()
    }
}
