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

/// Byte offset of `KernelReport::cancel`, the word the host raises.
const CANCEL_OFFSET: u64 = std::mem::offset_of!(KernelReport, cancel) as u64;

/// Finished work: the kernel report and the CUDA-event time around it (which
/// includes launch overhead; the report's globaltimer stamps do not).
#[derive(Clone, Copy, Debug)]
pub struct Finished {
    pub report: KernelReport,
    /// Event-measured duration of everything queued, µs.
    pub event_us: f64,
    /// The deadline passed and the host released the stream waits (and
    /// cancelled the kernels): treat as a timeout.
    pub released: bool,
}

/// What a CUDA error from our kernels means on `gpu`. Under MPS every client
/// of the GPU's MPS server receives the fatal fault of any one of them, and
/// a client killed while its kernel runs can raise one (seen on an H100: a rank
/// killed while its kernel waited on a frozen peer failed every other rank
/// with CUDA_ERROR_ILLEGAL_ADDRESS; the same kill without MPS left them
/// going on); a process with a context of its own is not touched by
/// another's death.
fn kernel_failed(gpu: &Gpu) -> String {
    let base = "the kernel failed (a CUDA error; see above)";
    if !gpu.mps {
        return base.into();
    }
    format!(
        "{base}. GPU {} is shared under MPS, where a fatal fault of any client of the MPS server fails \
         every client, and a process killed while its kernel runs can raise one: if a peer died just before, \
         that is the cause, not this process; survive deaths with one rank per GPU, or without MPS",
        gpu.ordinal
    )
}

/// Queues `launch` on `gpu.stream` between two timing events, then waits for
/// it, calling `probe` every 20 ms; when `probe` returns a reason the work
/// is cancelled and that reason becomes the error. `report` is the kernels'
/// (zeroed here) report buffer. `release` is the device address of the u64
/// word that queued stream waits wait on, if any: stream waits have no
/// timeout of their own, so at `deadline` the host writes a huge value there
/// (and raises the kernels' cancel flag) and reports `released`.
pub fn run_watched(
    gpu: &Gpu,
    report: &DeviceBuffer,
    deadline: Duration,
    release: Option<u64>,
    launch: impl FnOnce(&CudaStream) -> Result<()>,
    mut probe: impl FnMut() -> Option<String>,
) -> Result<Finished> {
    anyhow::ensure!(
        report.len() >= std::mem::size_of::<KernelReport>(),
        "a kernel report buffer of {} bytes cannot hold a KernelReport ({} bytes)",
        report.len(),
        std::mem::size_of::<KernelReport>()
    );
    gpu.bind()?;
    report.zero(&gpu.stream)?;
    let timing = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
    let start: CudaEvent = gpu.stream.record_event(timing)?;
    launch(&gpu.stream)?;
    let end: CudaEvent = gpu.stream.record_event(timing)?;

    let began = Instant::now();
    let grace = deadline + Duration::from_secs(10);
    let mut cancelled: Option<String> = None;
    let mut released = false;
    let mut last_probe = Instant::now();
    loop {
        if end.try_is_complete().with_context(|| kernel_failed(gpu))? {
            break;
        }
        if !released && began.elapsed() > deadline {
            if let Some(word) = release {
                cancel(gpu, report, Some(word))?;
                released = true;
            }
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
                cancel(gpu, report, release)?;
                cancelled = Some(reason);
            }
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    // The whole KernelReport, or the one an EpReport begins with.
    let mut kernel_report = KernelReport::default();
    report.download(&gpu.stream, bytemuck::bytes_of_mut(&mut kernel_report))?;
    if let Some(reason) = cancelled {
        bail!("{reason}");
    }
    let event_us = start.elapsed_ms(&end)? as f64 * 1e3;
    crate::stall::progressed();
    Ok(Finished {
        report: kernel_report,
        event_us,
        released,
    })
}

/// Raises the kernels' cancel flag and releases stream waits on `word`,
/// from a separate stream (the work's own stream is blocked).
fn cancel(gpu: &Gpu, report: &DeviceBuffer, word: Option<u64>) -> Result<()> {
    let side = gpu.ctx.new_stream()?;
    // SAFETY: the report buffer holds at least a `KernelReport` (run_watched
    // reads one from it), whose u32 `cancel` is at CANCEL_OFFSET; `word` is
    // the caller's live u64.
    unsafe {
        sys::cuMemsetD32Async(report.addr() + CANCEL_OFFSET, 1, 1, side.cu_stream()).result()?;
        if let Some(w) = word {
            sys::cuStreamWriteValue64_v2(side.cu_stream(), w, u64::MAX / 2, 0).result()?;
        }
    }
    side.synchronize()?;
    Ok(())
}
