//! The kernels of `cuda/collectives.cu`, host side: their structs (mirrored
//! field for field; the sizes and key offsets are asserted on both sides)
//! and typed launchers. Each operation's algorithm is a kernel entry of its
//! own, named by its file in [`super::ops`].

use std::collections::BTreeMap;
use std::mem::size_of;
use std::sync::Arc;

use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaStream, DeviceRepr, DriverError, PushKernelArg, sys,
};

use super::case::Case;
use super::layout::{Algo, MAX_RANKS, THREADS};
use super::ops::Op;
use crate::gpu::clock::{Span, ns_per_cycle};
use crate::gpu::kernels::KernelReport;
use crate::gpu::launch::{self, LaunchAs, grid};

/// `CollParams`: one call of one collective, what every kernel entry
/// takes. Offsets are bytes into the rank's window
/// ([`super::layout::WindowLayout`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CollParams {
    /// `nixlMemViewH` of the local view of the window (one buffer, index 0).
    pub local_mvh: u64,
    /// `nixlMemViewH` of the remote view: element `r` is rank `r`'s window.
    pub remote_mvh: u64,
    pub window: u64,
    /// [`CollReport`].
    pub report: u64,
    /// `[2][MAX_BLOCKS][MAX_RANKS]` u64: the last epoch this rank's block
    /// added to each rank's flag slot, per phase (put path); local memory,
    /// zeroed once.
    pub sent: u64,
    /// This call's [`CollTiming`].
    pub timing: u64,
    pub off_flags: u64,
    pub off_in: u64,
    pub off_out: u64,
    /// This call's receive area (by call parity).
    pub off_recv: u64,
    pub recv_stride: u64,
    /// nccl-tests' count ([`super::case::count_for`]).
    pub count: u64,
    /// The call's sequence number, from 1: what every signal carries.
    pub epoch: u64,
    /// GPU-side limit of every wait, ns.
    pub timeout_ns: u64,
    /// This rank's index among the members.
    pub rank: u32,
    /// The call's members (`members[..ranks]`).
    pub ranks: u32,
    /// `COLL_*` of the operation ([`super::ops::Collective::code`]) and of
    /// the algorithm: for the record, the entry already is one.
    pub op: u32,
    pub algo: u32,
    pub path: u32,
    pub dtype: u32,
    /// 1 when every rank runs on this GPU: fences and signals at GPU scope.
    pub same_gpu: u32,
    /// 1: `peer_ptr` holds the members' windows (the store path, looked up
    /// once per session); 0: the kernel calls `nixlGetPtr` itself.
    pub has_peer_ptr: u32,
    /// The abort slots in the window, `[rank]` u64: the last step that rank
    /// abandoned (elastic runs).
    pub off_abort: u64,
    /// The call's step, from 1; 0: a fixed run (every wait fatal after
    /// `timeout_ns`).
    pub step: u64,
    /// Elastic runs: a wait on a rank masks it after this long, ns.
    pub fault_timeout_ns: u64,
    /// `[MAX_RANKS]` u64: the last step this rank's abort added to each
    /// rank's slot (put path); local memory.
    pub abort_sent: u64,
    /// `[index]`: member `i` is rank `members[i]` (its window, flag slots and
    /// receive rows); chunks and output slots follow the index.
    pub members: [u8; MAX_RANKS as usize],
    /// `[index]`: member `i`'s window as `nixlGetPtr` gave it (with
    /// `has_peer_ptr`), passed by value so that a call reads it from the
    /// kernel's parameters instead of loading it from device memory.
    pub peer_ptr: [u64; MAX_RANKS as usize],
    /// One-shot and two-shot: elements per piece at most, a multiple of
    /// [`super::layout::ALIGN_ELEMS`] ([`super::layout::pieces`]).
    pub piece_elems: u64,
}

/// `CollReport`: what went wrong in a call. It begins with the suite's
/// [`KernelReport`], so [`crate::gpu::run::run_watched`] zeroes it, reads it
/// and cancels through it (`cuda/collectives.cu` embeds it the same way).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct CollReport {
    /// Errors, the last value a wait saw, timed out, the host's cancel word.
    pub base: KernelReport,
    pub wait_phase: u32,
    pub wait_rank: u32,
    pub wait_block: u32,
    /// 1 + the rank `nixlGetPtr` returned no pointer for.
    pub null_ptr_rank: u32,
    pub wait_target: u64,
    /// 1: this rank abandoned the step (elastic runs; not a failure).
    pub aborted: u32,
    /// 1: this rank told the other members.
    pub raised: u32,
    /// Bit r: a wait on rank r passed the fault timeout.
    pub masked_bits: u64,
    /// `%globaltimer` when the wait that masked first began, and masked.
    pub first_wait_ns: u64,
    pub first_mask_ns: u64,
}

/// `CollTiming`: block 0's clock at a call's first instruction and after
/// its last wait and its share of the work.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct CollTiming {
    /// `clock64` (cycles of block 0's SM).
    pub clock_start: u64,
    pub clock_end: u64,
    /// `%globaltimer` (ns), to calibrate the cycles.
    pub gt_start: u64,
    pub gt_end: u64,
    /// `clock64` where phase 0's steps end: peer pointers looked up, data
    /// pushed, fence and signals done, every peer's signal seen.
    pub clock_setup: u64,
    pub clock_sent: u64,
    pub clock_signalled: u64,
    pub clock_waited: u64,
    /// `%globaltimer` at the end of the call's last block (every block's
    /// `atomicMax`; a slot keeps an earlier call's, always earlier).
    pub gt_last_end: u64,
}

/// Per-call times from the stamps, ns: cycle counts (their resolution)
/// scaled by the `%globaltimer` nanoseconds per cycle over all of them (the
/// timer's long-run accuracy).
pub fn calibrate(slots: &[CollTiming]) -> anyhow::Result<Vec<f64>> {
    let k = ns_per_cycle(slots.iter().map(CollTiming::span))?;
    Ok(slots
        .iter()
        .map(|s| s.clock_end.wrapping_sub(s.clock_start) as f64 * k)
        .collect())
}

impl CollTiming {
    /// The call's span, for [`crate::gpu::clock::ns_per_cycle`].
    fn span(&self) -> Span {
        Span {
            clock_start: self.clock_start,
            clock_end: self.clock_end,
            gt_start: self.gt_start,
            gt_end: self.gt_end,
        }
    }
}

/// Per call, ns, from block 0's first instruction to the end of the
/// call's last block, by `%globaltimer` (its resolution: at least block
/// 0's own time, [`calibrate`], when the timer cannot tell them apart).
pub fn last_block(slots: &[CollTiming], block0: &[f64]) -> Vec<f64> {
    (slots.iter().zip(block0))
        .map(|(s, &b0)| (s.gt_last_end.saturating_sub(s.gt_start) as f64).max(b0))
        .collect()
}

/// Per call, ns, where block 0's time in phase 0 went: looking up the peer
/// pointers, pushing the data, fencing and signalling, waiting for every
/// peer's signal (calibrated as [`calibrate`]).
pub fn phases(slots: &[CollTiming]) -> anyhow::Result<Vec<[f64; 4]>> {
    let k = ns_per_cycle(slots.iter().map(CollTiming::span))?;
    let d = |a: u64, b: u64| b.wrapping_sub(a) as f64 * k;
    Ok(slots
        .iter()
        .map(|s| {
            [
                d(s.clock_start, s.clock_setup),
                d(s.clock_setup, s.clock_sent),
                d(s.clock_sent, s.clock_signalled),
                d(s.clock_signalled, s.clock_waited),
            ]
        })
        .collect())
}

/// `CollData`: what the fill and check kernels work on (device addresses).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CollData {
    pub input: u64,
    pub output: u64,
    /// [`CollVerify`].
    pub verify: u64,
    pub count: u64,
    pub rank: u32,
    pub ranks: u32,
    pub op: u32,
    pub dtype: u32,
    pub call: u32,
    /// 1: random inputs, compared within the bound of `--data random`.
    pub random: u32,
    /// The calls' [`CollReport`] (elastic runs: a call of an abandoned step
    /// is counted lost instead of checked); 0: none.
    pub report: u64,
    /// As [`CollParams::members`]: whose inputs each index holds.
    pub members: [u8; MAX_RANKS as usize],
}

/// `CollVerify`: the first wrong output element since it was zeroed.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct CollVerify {
    pub mismatches: u32,
    pub call: u32,
    pub element: u64,
    pub expected: f32,
    pub got: f32,
    /// Output elements compared.
    pub checked: u64,
    /// Calls not checked: their step was abandoned.
    pub lost: u32,
    pub reserved: u32,
}

const _: () = {
    assert!(size_of::<CollParams>() == 328);
    assert!(std::mem::offset_of!(CollParams, members) == 176);
    assert!(std::mem::offset_of!(CollParams, rank) == 112);
    assert!(size_of::<CollTiming>() == 72);
    assert!(size_of::<CollReport>() == 96);
    assert!(std::mem::offset_of!(CollReport, base) == 0);
    assert!(size_of::<CollData>() == 80);
    assert!(size_of::<CollVerify>() == 40);
};

// SAFETY: plain #[repr(C)] data whose layout matches the kernel parameters.
unsafe impl DeviceRepr for CollParams {}
// SAFETY: as above.
unsafe impl DeviceRepr for CollData {}

/// The collective kernels loaded into one GPU's context.
pub struct CollKernels {
    _module: Arc<CudaModule>,
    /// Every operation's algorithms' entries.
    run: BTreeMap<(Op, Algo), CudaFunction>,
    /// `coll_empty`: the launch floor.
    empty: CudaFunction,
    fill: CudaFunction,
    check: CudaFunction,
    probe: CudaFunction,
}

impl CollKernels {
    /// Loads the embedded fatbin into `ctx`.
    pub fn load(ctx: &Arc<CudaContext>) -> anyhow::Result<Self> {
        let module = crate::gpu::module::load(ctx, crate::gpu::module::Fatbin::Collectives)?;
        let f = |name: &str| {
            module.load_function(name).map_err(|e| {
                anyhow::anyhow!("kernel {name} missing from the collectives fatbin: {e}")
            })
        };
        let run = Op::every_algorithm()
            .map(|(op, a)| Ok(((op, a), f(op.spec().kernel(a))?)))
            .collect::<anyhow::Result<_>>()?;
        Ok(Self {
            run,
            empty: f("coll_empty")?,
            fill: f("coll_fill")?,
            check: f("coll_check")?,
            probe: f("coll_probe_ptrs")?,
            _module: module,
        })
    }

    /// Queues one call of `case` (its operation's entry for its algorithm)
    /// with `blocks` blocks, launched as `how` says (with programmatic
    /// dependent launch every entry waits for the kernel before it in
    /// `start_call`, after looking the peer windows up).
    ///
    /// # Safety
    /// Every address in `p` must stay valid until the kernel completes.
    pub unsafe fn launch_run(
        &self,
        s: &CudaStream,
        case: &Case,
        blocks: u32,
        p: &CollParams,
        how: LaunchAs,
    ) -> Result<(), DriverError> {
        let missing = DriverError(sys::cudaError_enum::CUDA_ERROR_NOT_FOUND);
        let f = self.run.get(&(case.op, case.algo)).ok_or(missing)?;
        // SAFETY: as this function's contract; `CollParams` is the entry's,
        // which waits for the previous kernel before touching memory.
        unsafe { launch::launch_as(s, f, (blocks, THREADS), p, how) }
    }

    /// Queues `coll_empty`, the launch floor: one block that only starts
    /// and ends as a call does, taking a call's parameters (zeroed: it
    /// reads none), launched as [`Self::launch_run`] launches a call.
    pub fn launch_empty(&self, s: &CudaStream, how: LaunchAs) -> Result<(), DriverError> {
        let p = CollParams::default();
        // SAFETY: coll_empty touches no memory.
        unsafe { launch::launch_as(s, &self.empty, (1, THREADS), &p, how) }
    }

    /// Queues the fill (`check == false`) or the check of `d`.
    ///
    /// # Safety
    /// The buffers in `d` must hold its elements until the kernel completes.
    pub unsafe fn launch_data(
        &self,
        s: &CudaStream,
        check: bool,
        d: &CollData,
    ) -> Result<(), DriverError> {
        let f = if check { &self.check } else { &self.fill };
        // SAFETY: as this function's contract; `CollData` is their parameter.
        unsafe { launch::launch(s, f, (128, 256), d) }
    }

    /// Queues `coll_probe_ptrs` (one block of 64 threads): `out[d]` =
    /// `nixlGetPtr(remote, d)` for every rank `d` whose bit is set in
    /// `wanted`, 1 for `rank`, 0 for the rest.
    ///
    /// # Safety
    /// `remote_mvh` must be a live view whose elements of `wanted` hold
    /// connected peers, and `out` hold `ranks` u64.
    pub unsafe fn launch_probe(
        &self,
        s: &CudaStream,
        remote_mvh: u64,
        (ranks, rank, wanted): (u32, u32, u64),
        out: u64,
    ) -> Result<(), DriverError> {
        let mut b = s.launch_builder(&self.probe);
        b.arg(&remote_mvh)
            .arg(&ranks)
            .arg(&rank)
            .arg(&wanted)
            .arg(&out);
        // SAFETY: as this function's contract; the arguments are the kernel's.
        unsafe { b.launch(grid(1, 64)) }.map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_kernel_loaded_by_name_is_defined() {
        // The entries are checked in super::super::ops; these are the
        // others. A name without its kernel would fail only on a GPU.
        let cu = include_str!("../../cuda/collectives.cu");
        let rs = include_str!("kernels.rs");
        let names: Vec<&str> = (rs.split("f(\"").skip(1))
            .filter_map(|s| s.split('"').next())
            .filter(|s| s.starts_with("coll_"))
            .collect();
        assert_eq!(names.len(), 4, "{names:?}");
        for name in names {
            let defined = cu.lines().any(|l| {
                l.starts_with("extern \"C\" __global__") && l.contains(&format!(" {name}("))
            });
            assert!(
                defined,
                "kernels.rs loads {name}, which cuda/collectives.cu does not define"
            );
        }
    }
}
