//! The same-run baseline: NCCL's own allreduce, allgather and
//! reduce-scatter of the same count and type, through cudarc's NCCL
//! bindings, queued and timed exactly like ours (CUDA events around each
//! call on the rank's stream, inputs filled and every output element
//! checked by the same kernels). NCCL is found and loaded as for `ep`
//! ([`crate::ep::nccl::prepare`]).
//!
//! NCCL refuses two ranks on one GPU ("Duplicate GPU detected"); the
//! communicator is still tried, and its error is what the report says.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow, bail};
use cudarc::nccl::{result, sys};

use super::layout::{Dtype, Op};
use super::member::Group;
use crate::gpu::Gpu;
use crate::group::Bytes;

/// A live NCCL communicator of this rank.
pub struct Comm(sys::ncclComm_t);

// SAFETY: an NCCL communicator may be used from any thread, one at a time;
// it is only moved from the thread that made it to the rank's thread.
unsafe impl Send for Comm {}

impl Drop for Comm {
    fn drop(&mut self) {
        // SAFETY: the communicator is live and no call on it is queued
        // (every stream using it was synchronised first).
        let _ = unsafe { result::comm_destroy(self.0) };
    }
}

fn nccl<T>(what: &str, r: Result<T, result::NcclError>) -> Result<T> {
    r.map_err(|e| {
        // SAFETY: ncclGetErrorString returns a static NUL-terminated string.
        let text = unsafe { std::ffi::CStr::from_ptr(sys::ncclGetErrorString(e.0)) };
        anyhow!("{what} failed: {} ({:?})", text.to_string_lossy(), e.0)
    })
}

/// Makes the communicator of all ranks (rank 0's unique id through the
/// store). `ncclCommInitRank` blocks until every rank joins, so it runs on
/// a thread this one watches with the run's timeout and the group's probes;
/// a thread stuck in NCCL is left behind. Errors: NCCL's own message.
pub fn connect(group: &Group, gpu: &Gpu) -> Result<Comm> {
    let id = exchange_id(group)?;
    let (ctx, world, rank) = (gpu.ctx.clone(), group.world as i32, group.rank as i32);
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let made = ctx
            .bind_to_thread()
            .map_err(anyhow::Error::from)
            .and_then(|()| {
                let mut comm = std::mem::MaybeUninit::uninit();
                // SAFETY: NCCL writes comm on success; the id came from rank 0.
                unsafe {
                    nccl(
                        "ncclCommInitRank",
                        result::comm_init_rank(comm.as_mut_ptr(), world, id, rank),
                    )?;
                    Ok(Comm(comm.assume_init()))
                }
            });
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

/// NCCL's unique id, through the store: rank 0 makes it, the others read it.
fn exchange_id(group: &Group) -> Result<sys::ncclUniqueId> {
    let entry = group.entry::<Bytes>("nccl_id");
    let bytes = match group.rank {
        0 => {
            let id =
                result::get_uniqueid().map_err(|e| anyhow!("ncclGetUniqueId failed: {e:?}"))?;
            let b: Vec<u8> = id.internal.iter().map(|&c| c as u8).collect();
            group.put(&entry, &Bytes(b.clone()))?;
            b
        }
        _ => group.get(&entry, 0, "NCCL unique id")?.0,
    };
    anyhow::ensure!(
        bytes.len() == 128,
        "the NCCL unique id in the store has {} bytes, not 128",
        bytes.len()
    );
    let mut id = sys::ncclUniqueId { internal: [0; 128] };
    for (d, s) in id.internal.iter_mut().zip(&bytes) {
        *d = *s as _;
    }
    Ok(id)
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
            Op::Allreduce => nccl(
                "ncclAllReduce",
                result::all_reduce(i, o, n, t, sum, comm.0, s),
            )?,
            Op::Allgather => nccl("ncclAllGather", result::all_gather(i, o, n, t, comm.0, s))?,
            Op::ReduceScatter => nccl(
                "ncclReduceScatter",
                result::reduce_scatter(i, o, n, t, sum, comm.0, s),
            )?,
        };
    }
    Ok(())
}
