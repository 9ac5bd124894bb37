//! The same-run baseline: NCCL's own allreduce, allgather and
//! reduce-scatter of the same count and type (each operation's file in
//! [`super::ops`] makes its call, through cudarc's NCCL bindings), queued
//! and timed exactly like ours (CUDA events around each
//! call on the rank's stream, inputs filled and every output element
//! checked by the same kernels). NCCL is found and loaded as for `ep`
//! ([`crate::ranks::nccl::prepare`]).
//!
//! NCCL refuses two ranks on one GPU ("Duplicate GPU detected"); the
//! communicator is still tried, and its error is what the report says.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use cudarc::nccl::sys;

use super::layout::Dtype;
use super::member::Group;
use crate::gpu::Gpu;
pub use crate::ranks::nccl::Comm;
pub use crate::ranks::nccl::check;
use crate::ranks::nccl::exchange_id;

/// Makes the communicator of all ranks (rank 0's unique id through the
/// store). `ncclCommInitRank` blocks until every rank joins, so it runs on
/// a thread this one watches with the run's timeout and the group's probes;
/// a thread stuck in NCCL is left behind. Errors: NCCL's own message.
pub fn connect(group: &Group, gpu: &Gpu) -> Result<Comm> {
    let id = exchange_id(group, &group.entry("nccl_id"), group.rank)?;
    let (ctx, world, rank) = (gpu.ctx.clone(), group.world, group.rank);
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let made = ctx
            .bind_to_thread()
            .map_err(anyhow::Error::from)
            .and_then(|()| Comm::init(world, id, rank));
        let _ = tx.send(made);
    });
    let start = Instant::now();
    loop {
        match rx.recv_timeout(Duration::from_millis(100)) {
            Ok(made) => return made,
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => bail!("the NCCL setup thread died"),
        }
        if let Some(why) = group.probe() {
            bail!("{why} (during NCCL setup)");
        }
        if start.elapsed() > group.timeout() {
            bail!(
                "ncclCommInitRank did not return within {:?} (NCCL_DEBUG=INFO says why)",
                group.timeout()
            );
        }
    }
}

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
