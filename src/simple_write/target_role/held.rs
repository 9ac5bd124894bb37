//! What the target holds once set up: its GPU, memory, agent,
//! registrations and the view of the initiator's acknowledgement word, in
//! the order they are torn down.

use nixl_sys::{MemView, RegistrationHandle};

use crate::gpu::{DeviceBuffer, Gpu};
use crate::nixl::agent::UcxAgent;
use crate::simple_write::kernels::{Kernels, WaitMode};
use crate::simple_write::plan::RunPlan;

/// Everything the target holds, in teardown order (fields drop in
/// declaration order): the view of the initiator's ack word, our
/// registrations, the memory they name, the agent, the GPU context.
pub(crate) struct Held {
    pub ack_view: Option<MemView>,
    pub(super) _registrations: Vec<RegistrationHandle>,
    pub data: DeviceBuffer,
    pub signal: DeviceBuffer,
    pub report: DeviceBuffer,
    pub nixl: UcxAgent,
    pub kernels: Kernels,
    pub gpu: Gpu,
    pub plan: RunPlan,
    pub wait: WaitMode,
    /// The initiator runs on another GPU: this GPU is the target's own.
    pub own_gpu: bool,
    /// Two u32 for the LL128 wait's grid (`WaitParams::done`), zeroed per round.
    pub done: DeviceBuffer,
}
