//! The same-run baseline: NCCL's own allreduce, allgather and
//! reduce-scatter of the same count and type (each operation's file in
//! [`super::ops`] makes its call, through cudarc's NCCL bindings), queued
//! and timed exactly like ours (CUDA events around each
//! call on the rank's stream, inputs filled and every output element
//! checked by the same kernels). NCCL is found and loaded as for `ep`
//! ([`crate::ranks::nccl::prepare`]).
//!
//! NCCL refuses two ranks on one GPU ("Duplicate GPU detected"); the
//! communicator is still tried ([`crate::ranks::nccl::connect_all`]), and
//! its error is what the report says.

use cudarc::nccl::sys;

use super::layout::Dtype;
pub use crate::ranks::nccl::Comm;
pub use crate::ranks::nccl::check;

/// One NCCL call as every operation makes it ([`super::ops::Collective::nccl`]):
/// nccl-tests' `count` of `dtype` from `input` to `output` (device
/// addresses) on `stream`.
pub struct NcclCall {
    pub comm: sys::ncclComm_t,
    pub stream: sys::cudaStream_t,
    pub input: *const std::ffi::c_void,
    pub output: *mut std::ffi::c_void,
    pub count: usize,
    pub dtype: sys::ncclDataType_t,
}

impl NcclCall {
    /// The call of `count` elements of `dtype` from `input` to `output` over
    /// `comm` on `stream`.
    pub fn new(
        comm: &Comm,
        stream: &cudarc::driver::CudaStream,
        (dtype, count): (Dtype, u64),
        (input, output): (u64, u64),
    ) -> Self {
        Self {
            comm: comm.raw(),
            stream: stream.cu_stream() as sys::cudaStream_t,
            input: input as *const std::ffi::c_void,
            output: output as *mut std::ffi::c_void,
            count: count as usize,
            dtype: match dtype {
                Dtype::F32 => sys::ncclDataType_t::ncclFloat32,
                Dtype::Bf16 => sys::ncclDataType_t::ncclBfloat16,
            },
        }
    }
}
