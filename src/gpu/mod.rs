//! The GPU side: device selection and context, device buffers NIXL can
//! register, and the device-API kernels.

pub mod buffer;
pub mod context;
pub mod kernels;
pub mod run;

pub use buffer::DeviceBuffer;
pub use context::{Gpu, GpuError};
