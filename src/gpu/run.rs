//! Running one of our kernels to completion without ever hanging the host.
//!
//! Every kernel here spins on memory another process writes, with its own
//! GPU-side deadline. The host adds two things: it watches the kernel with
//! an event (never a blocking sync it cannot leave), asking a caller-given
//! probe every few milliseconds whether the peer has given up; and if so it
//! raises the kernel's cancel flag from a second stream so the spin ends now
//! rather than at the deadline.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use cudarc::driver::{CudaEvent, CudaStream, sys};

use super::DeviceBuffer;
use super::Gpu;
use super::kernels::KernelReport;

/// Byte offset of `KernelReport::cancel`.
const CANCEL_OFFSET: u64 = 36;

/// A finished kernel: its report and the CUDA-event time around it (which
/// includes launch overhead; the report's globaltimer stamps do not).
#[derive(Clone, Copy, Debug)]
pub struct Finished {
    pub report: KernelReport,
    /// Event-measured duration of the whole kernel, µs.
    pub event_us: f64,
}

/// Queues `launch` on `gpu.stream` between two timing events, then waits for
/// it, calling `probe` every `poll`; when `probe` returns a reason the kernel
/// is cancelled and that reason becomes the error. `report` must be the
/// kernel's (zeroed) report buffer. `grace` bounds how long after the
/// kernel's own deadline the host keeps waiting before declaring the GPU stuck.
pub fn run_watched(
    gpu: &Gpu,
    report: &DeviceBuffer,
    deadline: Duration,
    launch: impl FnOnce(&CudaStream) -> Result<()>,
    mut probe: impl FnMut() -> Option<String>,
) -> Result<Finished> {
    gpu.bind()?;
    report.zero(&gpu.stream)?;
    let timing = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
    let start: CudaEvent = gpu.stream.record_event(timing)?;
    launch(&gpu.stream)?;
    let end: CudaEvent = gpu.stream.record_event(timing)?;

    let began = Instant::now();
    let grace = deadline + Duration::from_secs(10);
    let mut cancelled: Option<String> = None;
    let mut last_probe = Instant::now();
    loop {
        if end.try_is_complete().context("the kernel failed (a CUDA error; see above)")? {
            break;
        }
        if began.elapsed() > grace {
            bail!(
                "the kernel on GPU {} is still running {:?} after launch, past its own timeout: the GPU may be \
                 stuck; the process will exit without waiting for it",
                gpu.ordinal,
                began.elapsed()
            );
        }
        if cancelled.is_none() && last_probe.elapsed() >= Duration::from_millis(20) {
            last_probe = Instant::now();
            if let Some(reason) = probe() {
                cancel(gpu, report)?;
                cancelled = Some(reason);
            }
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    let mut raw = [0u8; 40];
    report.download(&gpu.stream, &mut raw)?;
    let report = KernelReport::from_bytes(&raw);
    if let Some(reason) = cancelled {
        bail!("{reason}");
    }
    let event_us = start.elapsed_ms(&end)? as f64 * 1e3;
    Ok(Finished { report, event_us })
}

/// Sets the kernel's cancel flag from a separate stream (the kernel's own
/// stream is busy with the kernel).
fn cancel(gpu: &Gpu, report: &DeviceBuffer) -> Result<()> {
    let side = gpu.ctx.new_stream()?;
    // SAFETY: the report buffer is 40 bytes; the flag is a u32 at offset 36.
    unsafe { sys::cuMemsetD32Async(report.addr() + CANCEL_OFFSET, 1, 1, side.cu_stream()).result()? };
    side.synchronize()?;
    Ok(())
}
