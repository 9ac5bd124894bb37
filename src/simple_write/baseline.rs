//! Same-run baselines for the device puts: what the copy engine and NIXL's
//! host API achieve between the same two GPUs, at the same size.
//!
//! - copy engine: a peer copy to a buffer on the target's GPU, peer access
//!   enabled first ([`crate::gpu::copy`]), or a device-to-device copy when
//!   both processes share a GPU; CUDA events around back-to-back copies,
//!   warm-up excluded;
//! - NIXL host API: a WRITE of the same bytes into the target's registered
//!   buffer through the initiator's agent (UCX picks cuda_ipc, which drives
//!   the copy engine), posted and completed `iters` times, timed on the host
//!   (so it carries per-transfer host overhead).

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use cudarc::driver::CudaContext;
use nixl_sys::{Agent, RegistrationHandle, XferOp};

use crate::gpu::copy::{copy_rate, enable_peer_access};
use crate::gpu::{DeviceBuffer, Gpu};
use crate::nixl::serdes::{Desc, DescList, MemType};
use crate::nixl::xfer::post_and_wait;

/// Baselines measured for one size. Rates in GB/s (1e9 B/s).
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct Baselines {
    /// Copy engine, CUDA-event timed.
    pub copy_engine_gbps: Option<f64>,
    /// NIXL host-API WRITE, host timed.
    pub nixl_write_gbps: Option<f64>,
}

impl Baselines {
    /// The best of the two, the reference each device-put row is compared to.
    pub fn best(&self) -> Option<f64> {
        match (self.copy_engine_gbps, self.nixl_write_gbps) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        }
    }
}

/// Buffers for the baselines, allocated once for the largest size. Fields
/// drop in order: the registration before the scratch buffer it registers.
pub struct BaselineRig {
    _registration: RegistrationHandle,
    /// Zeroed source of the NIXL WRITE: the target's buffer must never hold
    /// valid pattern data that a later round did not write.
    scratch: DeviceBuffer,
    /// Where the copy engine copies to: on the target's GPU.
    dest: DeviceBuffer,
}

impl BaselineRig {
    /// Allocates `size` bytes of scratch on the initiator's GPU (registered
    /// with `agent`) and a copy destination on `target_gpu` (an ordinal of
    /// this process), enabling peer access between the two GPUs.
    pub fn new(gpu: &Gpu, agent: &Agent, target_gpu: usize, size: usize) -> Result<Self> {
        let scratch = DeviceBuffer::zeroed(&gpu.ctx, size)?;
        let dest = if target_gpu == gpu.ordinal {
            DeviceBuffer::zeroed(&gpu.ctx, size)?
        } else {
            let peer = CudaContext::new(target_gpu)
                .context("opening a context on the target's GPU for the copy-engine baseline")?;
            let dest = DeviceBuffer::zeroed(&peer, size)?;
            enable_peer_access(&gpu.ctx, &peer)?;
            enable_peer_access(&peer, &gpu.ctx)?;
            dest
        };
        gpu.bind()?;
        let registration = agent
            .register_memory(&scratch, None)
            .context("registering the baseline scratch buffer")?;
        Ok(Self {
            _registration: registration,
            scratch,
            dest,
        })
    }

    /// Both baselines for `size` bytes: the copy engine from `src`, and a
    /// NIXL WRITE into `remote` (the target's data buffer, agent `target`).
    pub fn measure(
        &self,
        gpu: &Gpu,
        src: &DeviceBuffer,
        agent: &Agent,
        remote: (&DescList, &str),
        size: u64,
        timeout: Duration,
    ) -> Result<Baselines> {
        gpu.bind()?;
        let n = size as usize;
        let ce = copy_rate(&self.dest, src, n, ce_iters(size), &gpu.stream)?;
        let nixl = self.nixl_write(agent, remote, n, nixl_iters(size), timeout)?;
        Ok(Baselines {
            copy_engine_gbps: Some(ce),
            nixl_write_gbps: Some(nixl),
        })
    }

    /// NIXL host-API WRITE rate for `size` bytes into `remote`, GB/s, host timed.
    fn nixl_write(
        &self,
        agent: &Agent,
        (remote, target): (&DescList, &str),
        size: usize,
        iters: u32,
        timeout: Duration,
    ) -> Result<f64> {
        let local = DescList::new(
            MemType::Vram,
            vec![Desc {
                len: size as u64,
                ..Desc::of(&self.scratch)
            }],
        );
        let remote = DescList::new(
            MemType::Vram,
            vec![Desc {
                len: size as u64,
                ..remote.descs[0]
            }],
        );
        let req = agent
            .create_xfer_req(
                XferOp::Write,
                &local.to_xfer_dlist()?,
                &remote.to_xfer_dlist()?,
                target,
                None,
            )
            .context("creating the NIXL WRITE baseline request")?;
        let run = |n: u32| -> Result<Duration> {
            let start = Instant::now();
            for _ in 0..n {
                post_and_wait(agent, &req, "the NIXL WRITE baseline", timeout)?;
            }
            Ok(start.elapsed())
        };
        run(2)?;
        let t = run(iters)?;
        Ok(size as f64 * iters as f64 / t.as_nanos() as f64)
    }
}

/// Iterations for the copy-engine baseline: about a quarter second at
/// 400 GB/s, between 5 and 1000.
fn ce_iters(size: u64) -> u32 {
    (0.25 * 400e9 / size.max(1) as f64).clamp(5.0, 1000.0) as u32
}

/// Iterations for the NIXL WRITE baseline: fewer, each carries host round trips.
fn nixl_iters(size: u64) -> u32 {
    (0.1 * 400e9 / size.max(1) as f64).clamp(3.0, 200.0) as u32
}
