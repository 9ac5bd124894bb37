//! The same-run baseline: NCCL all-to-all of exactly the bytes dispatch and
//! combine move between every pair of ranks (`ncclGroupStart`, one
//! `ncclSend` + `ncclRecv` per peer with those byte counts, the local pair
//! included, `ncclGroupEnd`), each iteration timed with CUDA events,
//! warm-up excluded. Through cudarc's NCCL bindings.
//!
//! NCCL is found and loaded by [`crate::ranks::nccl::prepare`].

use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use cudarc::nccl::{result, sys};

use super::keys::EpKeys;
use super::layout::PairBytes;
pub use super::report::NcclTimes;
use crate::gpu::{DeviceBuffer, Gpu};
use crate::ranks::group::Group;
use crate::ranks::nccl::{Comm, check, exchange_id};
pub use crate::ranks::nccl::{NcclStatus, prepare, start};

/// Runs the baseline for both phases. NCCL calls can block forever when a
/// rank is gone, so they run on a worker thread; this thread waits with the
/// run's timeout and the group's probes.
/// `version`: from [`prepare`], which must have found NCCL.
pub fn baseline(
    group: &Group,
    gpu: &Gpu,
    version: String,
    pairs: &(PairBytes, PairBytes),
    warmup: u32,
    iters: u32,
) -> Result<NcclTimes> {
    let id = exchange_id(group, &group.keys.nccl_id(), group.rank)?;
    let send_max = pairs
        .0
        .send
        .iter()
        .sum::<u64>()
        .max(pairs.1.send.iter().sum());
    let recv_max = pairs
        .0
        .recv
        .iter()
        .sum::<u64>()
        .max(pairs.1.recv.iter().sum());
    let send = DeviceBuffer::zeroed(&gpu.ctx, send_max.max(16) as usize)?;
    let recv = DeviceBuffer::zeroed(&gpu.ctx, recv_max.max(16) as usize)?;
    let job = Job {
        ctx: gpu.ctx.clone(),
        stream: gpu.stream.clone(),
        rank: group.rank,
        world: group.world,
        id,
        pairs: pairs.clone(),
        warmup,
        iters,
        send,
        recv,
    };
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(job.run());
    });
    let start = Instant::now();
    let limit = group.timeout() + Duration::from_secs(10);
    loop {
        match rx.recv_timeout(Duration::from_millis(100)) {
            Ok(r) => {
                let (dispatch_ns, combine_ns) = r?;
                return Ok(NcclTimes {
                    version,
                    dispatch_ns,
                    combine_ns,
                });
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => bail!("the NCCL baseline thread died"),
        }
        if let Some(why) = group.probe() {
            bail!("{why} (during the NCCL baseline)");
        }
        if start.elapsed() > limit {
            bail!(
                "the NCCL baseline did not finish within {limit:?}: a rank stopped, or NCCL hangs (NCCL_DEBUG=INFO says more)"
            );
        }
    }
}

/// What the worker thread needs; it owns the buffers (a hung NCCL call then
/// keeps them alive with it).
struct Job {
    ctx: std::sync::Arc<cudarc::driver::CudaContext>,
    stream: std::sync::Arc<cudarc::driver::CudaStream>,
    rank: u32,
    world: u32,
    id: sys::ncclUniqueId,
    pairs: (PairBytes, PairBytes),
    warmup: u32,
    iters: u32,
    send: DeviceBuffer,
    recv: DeviceBuffer,
}

impl Job {
    fn run(self) -> Result<(Vec<f64>, Vec<f64>)> {
        self.ctx
            .bind_to_thread()
            .context("binding the CUDA context for NCCL")?;
        let comm = Comm::init(self.world, self.id, self.rank)?;
        let dispatch = self.phase(comm.raw(), &self.pairs.0)?;
        Ok((dispatch, self.phase(comm.raw(), &self.pairs.1)?))
    }

    /// `warmup + iters` all-to-alls of `pairs`, each between two events.
    fn phase(&self, comm: sys::ncclComm_t, pairs: &PairBytes) -> Result<Vec<f64>> {
        let stream = self.stream.cu_stream() as sys::cudaStream_t;
        let offsets = |v: &[u64]| -> Vec<u64> {
            v.iter()
                .scan(0, |a, &b| {
                    let o = *a;
                    *a += b;
                    Some(o)
                })
                .collect()
        };
        let (so, ro) = (offsets(&pairs.send), offsets(&pairs.recv));
        let timing = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
        let mut events = Vec::new();
        for _ in 0..self.warmup + self.iters {
            let e0 = self.stream.record_event(timing)?;
            check("ncclGroupStart", result::group_start())?;
            for peer in 0..self.world as usize {
                // SAFETY: offsets and sizes stay within the buffers sized from these sums.
                unsafe {
                    if pairs.send[peer] > 0 {
                        let p = (self.send.addr() + so[peer]) as *const std::ffi::c_void;
                        check(
                            "ncclSend",
                            result::send(
                                p,
                                pairs.send[peer] as usize,
                                sys::ncclDataType_t::ncclUint8,
                                peer as i32,
                                comm,
                                stream,
                            ),
                        )?;
                    }
                    if pairs.recv[peer] > 0 {
                        let p = (self.recv.addr() + ro[peer]) as *mut std::ffi::c_void;
                        check(
                            "ncclRecv",
                            result::recv(
                                p,
                                pairs.recv[peer] as usize,
                                sys::ncclDataType_t::ncclUint8,
                                peer as i32,
                                comm,
                                stream,
                            ),
                        )?;
                    }
                }
            }
            check("ncclGroupEnd", result::group_end())?;
            events.push((e0, self.stream.record_event(timing)?));
        }
        self.stream.synchronize()?;
        events
            .iter()
            .skip(self.warmup as usize)
            .map(|(a, b)| Ok(f64::from(a.elapsed_ms(b)?) * 1e6))
            .collect()
    }
}
