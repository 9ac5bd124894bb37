//! The same-run baseline: NCCL's own allreduce, allgather and
//! reduce-scatter of the same count and type, through cudarc's NCCL
//! bindings, queued and timed exactly like ours (CUDA events around each
//! call on the rank's stream, inputs filled and every output element
//! checked by the same kernels). NCCL is found and loaded as for `ep`
//! ([`crate::ranks::nccl::prepare`]).
//!
//! NCCL refuses two ranks on one GPU ("Duplicate GPU detected"); the
//! communicator is still tried, and its error is what the report says.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use cudarc::nccl::{result, sys};

use super::layout::{Dtype, Op};
use super::member::Group;
use crate::gpu::Gpu;
pub use crate::ranks::nccl::Comm;
use crate::ranks::nccl::{check, exchange_id};

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

fn data_type(d: Dtype) -> sys::ncclDataType_t {
    match d {
        Dtype::F32 => sys::ncclDataType_t::ncclFloat32,
        Dtype::Bf16 => sys::ncclDataType_t::ncclBfloat16,
    }
}

/// Queues NCCL's `op` of nccl-tests' `count` from `input` to `output`
/// (device addresses) on `stream`.
///
/// # Safety
/// The buffers must hold the call's elements until it completes.
pub unsafe fn queue(
    comm: &Comm,
    stream: &cudarc::driver::CudaStream,
    op: Op,
    dtype: Dtype,
    count: u64,
    input: u64,
    output: u64,
) -> Result<()> {
    let s = stream.cu_stream() as sys::cudaStream_t;
    let (i, o, n, t) = (
        input as *const std::ffi::c_void,
        output as *mut std::ffi::c_void,
        count as usize,
        data_type(dtype),
    );
    let sum = sys::ncclRedOp_t::ncclSum;
    // SAFETY: as the caller promised.
    unsafe {
        match op {
            Op::Allreduce => check(
                "ncclAllReduce",
                result::all_reduce(i, o, n, t, sum, comm.raw(), s),
            )?,
            Op::Allgather => check(
                "ncclAllGather",
                result::all_gather(i, o, n, t, comm.raw(), s),
            )?,
            Op::ReduceScatter => check(
                "ncclReduceScatter",
                result::reduce_scatter(i, o, n, t, sum, comm.raw(), s),
            )?,
        };
    }
    Ok(())
}
