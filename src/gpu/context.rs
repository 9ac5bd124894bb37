//! Opening a GPU: driver presence, device index checks, context, stream.

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaStream, DriverError, sys};

/// Why a GPU could not be used. Messages name the fix.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    #[error(
        "no NVIDIA driver on this machine (libcuda.so not loadable): run on a machine with a GPU, or try the host-API example `cargo run --example two_proc`"
    )]
    NoDriver,
    #[error(
        "the NVIDIA driver found no GPU ({0}): run on a machine with a GPU, or try the host-API example `cargo run --example two_proc`"
    )]
    NoDevice(String),
    #[error(
        "GPU {index} does not exist: this machine has {count} GPU(s), numbered 0 to {last}; pick one with --gpu",
        last = .count.saturating_sub(1)
    )]
    BadIndex { index: usize, count: usize },
    #[error("{what} needs about {need_mib} MiB on GPU {gpu}, which has {free_mib} MiB free: {fix}")]
    OutOfMemory {
        gpu: usize,
        need_mib: u64,
        free_mib: u64,
        what: String,
        fix: String,
    },
    #[error("CUDA error on GPU {gpu} during {what}: {source}")]
    Driver {
        gpu: usize,
        what: &'static str,
        #[source]
        source: DriverError,
    },
}

/// Whether `libcuda.so` can be loaded at all.
pub fn driver_present() -> bool {
    // SAFETY: only probes dlopen; calls nothing in the library.
    unsafe { sys::is_culib_present() }
}

/// Number of visible GPUs; errors (rather than panics) without a driver.
pub fn device_count() -> Result<usize, GpuError> {
    if !driver_present() {
        return Err(GpuError::NoDriver);
    }
    match CudaContext::device_count() {
        Ok(0) => Err(GpuError::NoDevice("0 devices".into())),
        Ok(n) => Ok(n as usize),
        Err(e) => Err(GpuError::NoDevice(e.to_string())),
    }
}

/// One GPU as reports and the peer identify it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct GpuInfo {
    /// CUDA ordinal in the process that reported it.
    pub ordinal: usize,
    /// Device name, e.g. `NVIDIA H200`.
    pub name: String,
    /// UUID as 32 lowercase hex digits ([`uuid_string`]).
    pub uuid: String,
    /// Whether the process's context on it is an MPS client.
    #[serde(default)]
    pub mps: bool,
    /// Its L2 cache, bytes (0: not reported).
    #[serde(default)]
    pub l2_bytes: u64,
}

/// A GPU UUID as 32 lowercase hex digits.
pub fn uuid_string(u: &sys::CUuuid) -> String {
    u.bytes
        .iter()
        .map(|b| format!("{:02x}", *b as u8))
        .collect()
}

/// The ordinal of the GPU whose UUID is `uuid` ([`uuid_string`] form)
/// among this process's visible GPUs, if it is one of them.
pub fn find_gpu(uuid: &str) -> Option<usize> {
    let n = device_count().ok()?;
    // Device handles, not contexts: a context would take memory on every GPU.
    (0..n).find(|&i| {
        cudarc::driver::result::device::get(i as i32)
            .ok()
            .and_then(|d| cudarc::driver::result::device::get_uuid(d).ok())
            .map(|u| uuid_string(&u))
            .as_deref()
            == Some(uuid)
    })
}

/// One GPU, its primary context made current on the calling thread, and a
/// non-blocking stream for this role's work.
///
/// The context must exist before the NIXL agent is created: UCX probes CUDA
/// when the backend starts and otherwise reports "UCX CUDA support was not
/// found", and memory views cannot be prepared.
pub struct Gpu {
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
    pub ordinal: usize,
    pub name: String,
    /// Streaming multiprocessors; the ceiling on co-resident blocks.
    pub sm_count: u32,
    /// L2 cache size, bytes.
    pub l2_bytes: u64,
    /// Whether this context is an MPS client: other processes' kernels
    /// then run on this GPU at the same time as ours (without MPS the GPU
    /// time-slices between processes).
    pub mps: bool,
}

impl Gpu {
    /// Opens GPU `ordinal` (0-based).
    pub fn open(ordinal: usize) -> Result<Self, GpuError> {
        let count = device_count()?;
        if ordinal >= count {
            return Err(GpuError::BadIndex {
                index: ordinal,
                count,
            });
        }
        let drv = |what| {
            move |source| GpuError::Driver {
                gpu: ordinal,
                what,
                source,
            }
        };
        let ctx = CudaContext::new(ordinal).map_err(drv("creating the context"))?;
        let stream = ctx.new_stream().map_err(drv("creating a stream"))?;
        let name = ctx.name().map_err(drv("reading the device name"))?;
        let sm_count = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(drv("reading the SM count"))? as u32;
        let mps = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MPS_ENABLED)
            .map_err(drv("asking whether MPS is on"))?
            != 0;
        let l2_bytes = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)
            .map_err(drv("reading the L2 cache size"))? as u64;
        Ok(Self {
            ctx,
            stream,
            ordinal,
            name,
            sm_count,
            l2_bytes,
            mps,
        })
    }

    /// Makes this GPU's context current on the calling thread (each thread
    /// that touches CUDA or NIXL memory views needs it).
    pub fn bind(&self) -> Result<(), GpuError> {
        self.ctx
            .bind_to_thread()
            .map_err(|source| GpuError::Driver {
                gpu: self.ordinal,
                what: "binding the context",
                source,
            })
    }

    /// Free device memory in bytes.
    pub fn free_memory(&self) -> Result<usize, GpuError> {
        self.ctx
            .mem_get_info()
            .map(|(free, _)| free)
            .map_err(|source| GpuError::Driver {
                gpu: self.ordinal,
                what: "querying free memory",
                source,
            })
    }

    /// Ordinal, name and UUID, as reports and the peer identify this GPU.
    pub fn info(&self) -> Result<GpuInfo, GpuError> {
        let uuid = self.ctx.uuid().map_err(|source| GpuError::Driver {
            gpu: self.ordinal,
            what: "reading the UUID",
            source,
        })?;
        Ok(GpuInfo {
            ordinal: self.ordinal,
            name: self.name.clone(),
            uuid: uuid_string(&uuid),
            mps: self.mps,
            l2_bytes: self.l2_bytes,
        })
    }

    /// Fails, naming `what` needs the memory and the fix, unless `need`
    /// bytes are free on this GPU. The one memory check every program here
    /// makes before allocating.
    pub fn ensure_free(&self, need: u64, what: &str, fix: &str) -> Result<(), GpuError> {
        let free = self.free_memory()? as u64;
        if need > free {
            return Err(GpuError::OutOfMemory {
                gpu: self.ordinal,
                need_mib: need >> 20,
                free_mib: free >> 20,
                what: what.to_string(),
                fix: fix.to_string(),
            });
        }
        Ok(())
    }

    /// Waits for all work queued on this role's stream.
    pub fn sync(&self) -> Result<(), GpuError> {
        self.stream
            .synchronize()
            .map_err(|source| GpuError::Driver {
                gpu: self.ordinal,
                what: "synchronizing the stream",
                source,
            })
    }
}

/// The driver's CUDA version, e.g. `13.0`, if a driver is present.
pub fn driver_version() -> Option<String> {
    if !driver_present() {
        return None;
    }
    let mut v: std::ffi::c_int = 0;
    // SAFETY: writes one int; the library is present.
    unsafe { sys::cuDriverGetVersion(&mut v) }.result().ok()?;
    Some(format!("{}.{}", v / 1000, (v % 1000) / 10))
}
