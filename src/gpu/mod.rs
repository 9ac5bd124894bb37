//! The GPU side: device selection and context, device memory NIXL can
//! register, loading the device-API kernels and what every program's
//! kernels share (the report, how they are run), the copy engine as the
//! baseline, and page-locked host staging with the copies
//! into and out of it. Depends on nothing above it.

pub mod buffer;
pub mod clock;
pub mod context;
pub mod copy;
pub mod kernels;
pub mod launch;
pub mod level;
pub mod ll;
pub mod module;
pub mod path;
pub mod pinned;
pub mod run;

pub use buffer::DeviceBuffer;
pub use context::{Gpu, GpuError, GpuInfo};
pub use pinned::PinnedBuffer;
