//! What the initiator holds once connected: its GPU, memory, agent,
//! registrations and memory views, in the order they are torn down.

use std::time::Duration;

use nixl_sys::{MemView, RegistrationHandle};

use crate::gpu::{DeviceBuffer, Gpu, GpuInfo};
use crate::nixl::agent::UcxAgent;
use crate::nixl::serdes::DescList;
use crate::simple_write::baseline::BaselineRig;
use crate::simple_write::kernels::{FenceScope, Kernels, WaitMode};
use crate::simple_write::plan::RunPlan;

/// Everything the initiator holds, in teardown order: Rust drops fields
/// in declaration order, so the memory views (which map the target's
/// memory) go first, then the baseline's registration, our registrations,
/// the memory they name, the agent, and the GPU context last.
pub(crate) struct Held {
    pub views: Option<Views>,
    pub baseline: Option<BaselineRig>,
    pub(super) _registrations: Vec<RegistrationHandle>,
    pub mem: Memory,
    pub nixl: UcxAgent,
    pub kernels: Kernels,
    pub gpu: Gpu,
    pub plan: RunPlan,
    pub me: GpuInfo,
    pub target: GpuInfo,
    /// The target's data buffer, for the NIXL WRITE baseline.
    pub target_data: DescList,
    pub wait: WaitMode,
    /// The release's scope (resolved: never `Auto`).
    pub fence: FenceScope,
    /// Ping-pong rounds record [`super::rounds::Breakdown`].
    pub breakdown: bool,
    pub timeout: Duration,
}

/// The three memory views the write kernel takes.
pub(crate) struct Views {
    /// Our two source buffers (index 0 and 1).
    pub src: MemView,
    /// The target's data buffer.
    pub dst: MemView,
    /// The target's 8-byte signal.
    pub signal: MemView,
}

/// The initiator's device memory.
pub(crate) struct Memory {
    /// Two sources with different patterns, alternating by iteration, so
    /// a stale iteration can never verify.
    pub sources: [DeviceBuffer; 2],
    /// The 8-byte word the target's acknowledgements increment.
    pub ack: DeviceBuffer,
    /// The kernels' [`crate::gpu::kernels::KernelReport`].
    pub report: DeviceBuffer,
}
