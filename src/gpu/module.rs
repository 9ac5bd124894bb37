//! The CUDA kernels compiled into this library (`cuda/*.cu`, by nvcc from
//! build.rs), and loading them into a GPU's context.

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaModule, DriverError};

/// One `cuda/<name>.cu`, compiled to a fatbin (sm_90 SASS + compute_90 PTX).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fatbin {
    /// `cuda/kernels.cu`: `simple_write`'s write + signal, wait, stamp and ack.
    Kernels,
    /// `cuda/put_and_signal.cu`: the minimal example's two kernels.
    PutAndSignal,
    /// `cuda/ep.cu`: expert-parallel dispatch and combine.
    Ep,
    /// `cuda/collectives.cu`: allreduce, allgather and reduce-scatter.
    Collectives,
    /// `cuda/pipeline.cu`: the streaming pipeline's stage kernels.
    Pipeline,
}

/// Why the kernels are not available in this binary, or not on this GPU.
#[derive(Debug, thiserror::Error)]
pub enum KernelsError {
    #[error("this binary was built without the device kernels: {0}; then rebuild (cargo build)")]
    NotBuilt(&'static str),
    #[error("loading the kernels into GPU {gpu}: {source}")]
    Load {
        gpu: usize,
        #[source]
        source: DriverError,
    },
}

#[cfg(nixl_kernels)]
fn image(which: Fatbin) -> Result<&'static [u8], &'static str> {
    Ok(match which {
        Fatbin::Kernels => include_bytes!(env!("NIXL_FATBIN_KERNELS")),
        Fatbin::PutAndSignal => include_bytes!(env!("NIXL_FATBIN_PUT_AND_SIGNAL")),
        Fatbin::Ep => include_bytes!(env!("NIXL_FATBIN_EP")),
        Fatbin::Collectives => include_bytes!(env!("NIXL_FATBIN_COLLECTIVES")),
        Fatbin::Pipeline => include_bytes!(env!("NIXL_FATBIN_PIPELINE")),
    })
}

#[cfg(not(nixl_kernels))]
fn image(_: Fatbin) -> Result<&'static [u8], &'static str> {
    Err(env!("NIXL_KERNELS_MISSING"))
}

/// Whether the kernels were compiled in, and if not, why (what the build
/// could not find, and how to provide it).
pub fn availability() -> Result<(), &'static str> {
    image(Fatbin::Kernels).map(|_| ())
}

/// Loads `which` into `ctx`.
pub fn load(ctx: &Arc<CudaContext>, which: Fatbin) -> Result<Arc<CudaModule>, KernelsError> {
    let image = image(which).map_err(KernelsError::NotBuilt)?;
    ctx.load_module(cudarc::nvrtc::Ptx::from_binary(image.to_vec()))
        .map_err(|source| KernelsError::Load {
            gpu: ctx.ordinal(),
            source,
        })
}
