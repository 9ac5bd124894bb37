//! One step of the run — fill, dispatch, check, the stand-in experts,
//! combine, check — queued on the rank's stream, watched until done, and
//! its reports read: a wait that gave up or a failed NIXL call (exit 1), a
//! wrong value (exit 3, naming rank, token and expert). Then the GPU times
//! of a run of steps, from the phase kernels' stamps.
//!
//! Each step is watched by [`crate::gpu::run::run_watched`]: the host polls,
//! asks the caller's probe whether a rank gave up, and cancels the kernels
//! if one did.

use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use cudarc::driver::{CudaGraph, CudaStream, result, sys};

use super::config::{Grid, Path, RunConfig};
use super::kernels::{self, EpKernels, EpParams, EpReport, EpTiming, EpVerify, Step};
use super::mask::Mask;
use super::model::Model;
use super::reference::Mismatch;
use super::report::PathTimes;
use super::rig::Rig;
use super::setup::Corrupt;
use crate::cli::DataMismatch;
use crate::gpu::Gpu;
use crate::gpu::clock::{Span, ns_per_cycle};
use crate::gpu::run::run_watched;
use crate::nixl::view::Views;

/// What every step uses: the GPU and its kernels, the CPU model, the
/// configuration, this rank's device memory and the launch grid.
pub struct Stepper<'a> {
    pub gpu: &'a Gpu,
    pub kernels: &'a EpKernels,
    pub model: &'a Model,
    pub cfg: &'a RunConfig,
    pub rig: &'a Rig,
    pub grid: Grid,
    /// How long a wait for another rank may take before the kernels mask
    /// that rank, ns; 0: never mask (every wait fatal after `--timeout`).
    pub fault_timeout_ns: u64,
}

/// What a step's kernels found beyond success.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    /// Ranks this step's kernels masked (their waits passed the fault timeout).
    pub masked: Mask,
    /// GPU time of the first masking wait, ns.
    pub waited_ns: Option<u64>,
    /// The checks failed while the mask changed under the step (a rank
    /// died mid-step): the step is lost, not wrong.
    pub lost: bool,
}

impl Stepper<'_> {
    /// Runs `count` steps from `first` (global numbers) back to back on
    /// `path` over `views`, watched as one piece of work,
    /// and checks their reports: the kernels queued on the stream, or
    /// `graph` replayed (captured by [`Stepper::capture`] for this path and
    /// these views). The kernels take the step number from the device word
    /// ([`Rig::set_step`] at a run of steps' start; each step ends with
    /// `ep_advance`); the check kernels count every wrong value of every
    /// step and keep the first. `corrupt` injects one wrong value into the
    /// first step (stream launches); `probe` says why to stop waiting (a
    /// rank gave up).
    pub fn steps(
        &self,
        views: Views,
        path: Path,
        (first, count): (u32, u32),
        graph: Option<&CudaGraph>,
        corrupt: Option<Corrupt>,
        probe: impl FnMut() -> Option<String>,
    ) -> Result<Outcome> {
        let me = self.model.rank;
        let p = self.params(views, path);
        let deadline = Duration::from_nanos(self.cfg.timeout_ns) * 4 * count;
        let launch = |s: &CudaStream| -> Result<()> {
            // SAFETY: the verify report is this rig's, live until the work ends.
            unsafe {
                sys::cuMemsetD8Async(
                    self.rig.verify.addr(),
                    0,
                    self.rig.verify.len(),
                    s.cu_stream(),
                )
                .result()?
            };
            for k in 0..count {
                match graph {
                    // SAFETY: the graph's nodes use this rig's memory and views
                    // that live until the caller drops the graph.
                    Some(g) => unsafe { result::graph::launch(g.cu_graph_exec(), s.cu_stream())? },
                    None => self.queue(s, &p, corrupt.filter(|_| k == 0))?,
                }
            }
            Ok(())
        };
        let at = match count {
            1 => format!("step {first}"),
            _ => format!("steps {first}..{}", first + count),
        };
        run_watched(self.gpu, &self.rig.report, deadline, None, launch, probe)
            .with_context(|| format!("rank {me}, {} path, {at}", path.name()))?;
        let report = self.check_report(path, &at)?;
        let masked = report.newly_masked();
        let checked = self.check_verify(path, &at);
        let lost = checked.is_err() && masked != Mask::default();
        if !lost {
            checked?;
        }
        Ok(Outcome {
            masked,
            waited_ns: report.first_mask_waited_ns(),
            lost,
        })
    }

    /// A test hook (`--inject die-mid-dispatch`): sets the mask to
    /// `masked` and runs the next step's dispatch alone (its fill and
    /// dispatch kernels; no combine, no checks, the step word not
    /// advanced), waiting for it within the fault timeout's bound.
    pub fn dispatch_only(&self, views: Views, path: Path, masked: Mask) -> Result<()> {
        let s = &self.gpu.stream;
        self.rig.set_mask(s, masked)?;
        let p = self.params(views, path);
        // SAFETY: every address in `p` belongs to this rig, which outlives
        // the launch (synchronised below).
        unsafe {
            self.kernels.launch(s, Step::Fill, self.grid.blocks, &p)?;
            self.kernels
                .launch(s, Step::Dispatch, self.grid.blocks, &p)?;
        }
        s.synchronize()?;
        Ok(())
    }

    fn params(&self, views: Views, path: Path) -> EpParams {
        let mut p = self
            .rig
            .params(self.cfg, self.model, &self.grid, views, path);
        p.fault_timeout_ns = self.fault_timeout_ns;
        p
    }

    /// One step's work on `path` over `views` captured once into a CUDA
    /// graph (on a stream of its own): replayed for every step of a run,
    /// with no re-capture when the mask changes (the kernels read it on the
    /// device) or the step advances (the device word).
    pub fn capture(&self, views: Views, path: Path) -> Result<CudaGraph> {
        let p = self.params(views, path);
        let cap = self.gpu.ctx.new_stream()?;
        cap.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)?;
        let queued = self.queue(&cap, &p, None);
        // The capture ends whatever happened inside it.
        let graph = cap.end_capture(sys::CUgraphInstantiate_flags(0));
        queued.context("capturing a step into a CUDA graph")?;
        let graph = graph
            .context("instantiating the CUDA graph of a step")?
            .context("the CUDA graph of a step is empty")?;
        graph.upload()?;
        Ok(graph)
    }

    /// The GPU times of steps `first..first + count` (their timing slots).
    pub fn times(&self, path: Path, first: u32, count: u32) -> Result<PathTimes> {
        let mut raw = vec![0u8; self.rig.timing.len()];
        self.rig.timing.download(&self.gpu.stream, &mut raw)?;
        let slot = std::mem::size_of::<EpTiming>();
        let (from, to) = (2 * first as usize, 2 * (first + count) as usize);
        let timed: Vec<EpTiming> = raw[from * slot..to * slot]
            .chunks_exact(slot)
            .map(bytemuck::pod_read_unaligned)
            .collect();
        let (ns_per_cycle, dispatch_ns, combine_ns) = calibrate(&timed)?;
        Ok(PathTimes {
            path,
            graph: false,
            wall_ns: Vec::new(),
            dispatch_ns,
            combine_ns,
            ns_per_cycle,
        })
    }

    /// The host's wall time per step of `count` dispatch + combine pairs
    /// (each followed by the step word's advance) back to back, unchecked:
    /// launched on the stream, then replayed from a CUDA graph of one pair;
    /// (stream, graph) ns per step. Steps `first..first + 2·count`: every
    /// rank runs this at the same point, after its last checked step.
    pub fn launch_cost(
        &self,
        views: Views,
        path: Path,
        (first, count): (u32, u32),
        mut probe: impl FnMut() -> Option<String>,
    ) -> Result<(f64, f64)> {
        let p = self.params(views, path);
        let (k, b) = (self.kernels, self.grid.blocks);
        // SAFETY: every address in `p` belongs to this rig and its views,
        // which outlive the work (run_watched waits for it).
        let pair = |s: &CudaStream| -> Result<()> {
            unsafe {
                k.launch(s, Step::Dispatch, b, &p)?;
                k.launch(s, Step::Combine, b, &p)?;
                k.launch(s, Step::Advance, 1, &p)?;
            }
            Ok(())
        };
        let cap = self.gpu.ctx.new_stream()?;
        cap.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)?;
        let queued = pair(&cap);
        let graph = cap.end_capture(sys::CUgraphInstantiate_flags(0));
        queued.context("capturing dispatch + combine into a CUDA graph")?;
        let graph = graph?.context("the CUDA graph of dispatch + combine is empty")?;
        graph.upload()?;
        let deadline = Duration::from_nanos(self.cfg.timeout_ns) * 4 * count;
        let mut time = |first: u32, launch: &dyn Fn(&CudaStream) -> Result<()>| -> Result<f64> {
            self.rig.set_step(&self.gpu.stream, first)?;
            let t0 = std::time::Instant::now();
            let all = |s: &CudaStream| (0..count).try_for_each(|_| launch(s));
            run_watched(self.gpu, &self.rig.report, deadline, None, all, &mut probe)?;
            let ns = t0.elapsed().as_nanos() as f64 / f64::from(count);
            self.check_report(
                path,
                &format!("steps {first}..{} (unchecked)", first + count),
            )?;
            Ok(ns)
        };
        let stream = time(first, &pair)?;
        // SAFETY: as above; the graph's nodes use the same memory.
        let replay = |s: &CudaStream| -> Result<()> {
            unsafe { result::graph::launch(graph.cu_graph_exec(), s.cu_stream())? };
            Ok(())
        };
        let graph_ns = time(first + count, &replay)?;
        Ok((stream, graph_ns))
    }

    /// Queues one iteration's kernels (and an injected fault, if asked).
    fn queue(&self, s: &CudaStream, p: &EpParams, corrupt: Option<Corrupt>) -> Result<()> {
        let k = self.kernels;
        let b = self.grid.blocks;
        let nan_at = |addr: u64| -> Result<()> {
            // SAFETY: a 2-byte store inside a live buffer.
            unsafe { sys::cuMemsetD16Async(addr, 0x7fc0, 1, s.cu_stream()).result()? };
            Ok(())
        };
        // SAFETY: every address in `p` belongs to this session's rig, which
        // outlives the launch (run_watched waits for it).
        unsafe {
            k.launch(s, Step::Fill, b, p)?;
            k.launch(s, Step::Dispatch, b, p)?;
            if corrupt == Some(Corrupt::Dispatch) {
                let src = (0..p.ranks)
                    .find(|&r| self.model.recv.count(r) > 0)
                    .unwrap_or(0);
                nan_at(
                    p.window
                        + p.off_recv_x
                        + u64::from(src) * u64::from(p.tokens) * 2 * u64::from(p.hidden),
                )?;
            }
            k.launch(s, Step::VerifyDispatch, b, p)?;
            k.launch(s, Step::Expert, b, p)?;
            k.launch(s, Step::Combine, b, p)?;
            if corrupt == Some(Corrupt::Combine) {
                nan_at(p.out)?;
            }
            k.launch(s, Step::VerifyCombine, b, p)?;
            k.launch(s, Step::Advance, 1, p)?;
        }
        Ok(())
    }

    /// A wait that gave up, a failed NIXL call or an unmapped peer, named;
    /// else the report (what the kernels masked).
    fn check_report(&self, path: Path, at: &str) -> Result<EpReport> {
        let mut r = EpReport::default();
        (self.rig.report).download(&self.gpu.stream, bytemuck::bytes_of_mut(&mut r))?;
        let me = self.model.rank;
        let at = format!("rank {me}, {} path, {at}", path.name());
        if r.null_ptr_rank != 0 {
            bail!(
                "{at}: nixlGetPtr returned no pointer to rank {}'s window: use --path put",
                r.null_ptr_rank - 1
            );
        }
        if r.base.timed_out != 0 {
            let secs = self.cfg.timeout_ns as f64 / 1e9;
            let w = r.wait_rank;
            let what = match r.wait_kind {
                kernels::WAIT_BARRIER => format!("rank {w} to reach the phase barrier"),
                kernels::WAIT_DISPATCH => format!("rank {w}'s dispatch data"),
                kernels::WAIT_COMBINE => format!("a batch of rank {w}'s combine contributions"),
                kernels::WAIT_GRID | kernels::WAIT_BLOCKS => {
                    bail!(
                        "{at}: this rank's own thread blocks did not all run within {secs} s (grid of {} blocks): \
                         another process holds the GPU's SMs?",
                        self.grid.blocks
                    )
                }
                k => format!("an unknown wait ({k})"),
            };
            bail!(
                "{at}: timed out after {secs} s waiting for {what} (counter {:#x}, expected ≥ {:#x}): rank {w} is dead, \
                 stuck, or far behind",
                r.base.observed,
                r.wait_target
            );
        }
        if r.base.errors != 0 {
            bail!(
                "{at}: {} NIXL device call(s) failed, the first with status {} (−3 = NIXL_ERR_BACKEND; UCX printed why above)",
                r.base.errors,
                r.base.first_status
            );
        }
        Ok(r)
    }

    /// Wrong data: exit 3, naming rank, token and expert.
    fn check_verify(&self, path: Path, at: &str) -> Result<()> {
        let mut v = EpVerify::default();
        (self.rig.verify).download(&self.gpu.stream, bytemuck::bytes_of_mut(&mut v))?;
        if v.mismatches == 0 {
            return Ok(());
        }
        let text = describe(self.model, &v);
        Err(DataMismatch(format!(
            "{text} ({} path, {at}; {} wrong value(s) in it)",
            path.name(),
            v.mismatches
        ))
        .into())
    }
}

/// The first mismatch a check kernel found, in words.
pub fn describe(m: &Model, v: &EpVerify) -> String {
    let me = m.rank;
    let experts_of = |rank: u32, t: u32| m.routing[rank as usize].experts_of(t).to_vec();
    let dispatch = |what: String| Mismatch::Dispatch {
        rank: me,
        src_rank: v.src_rank,
        token: v.token,
        slot: v.slot,
        expert: v.expert,
        what,
    };
    let mismatch = match v.kind {
        kernels::BAD_COUNT => {
            return format!(
                "rank {me} received {} token(s) from rank {}, expected {}",
                v.got_bits, v.src_rank, v.want_bits
            );
        }
        kernels::BAD_META => dispatch(format!(
            "metadata word {} is {:#x}, expected {:#x}",
            v.h, v.got_bits, v.want_bits
        )),
        kernels::BAD_X => dispatch(format!(
            "activation h={} is bf16 {:#06x}, expected {:#06x}",
            v.h, v.got_bits, v.want_bits
        )),
        kernels::BAD_CONTRIBUTION => Mismatch::Contribution {
            rank: me,
            from_rank: v.src_rank,
            token: v.token,
            experts: experts_of(me, v.token)
                .into_iter()
                .filter(|&e| m.shape.rank_of(e) == v.src_rank)
                .collect(),
            h: v.h,
            got: v.got,
            reference: v.reference,
            bound: v.bound,
        },
        _ => Mismatch::Combined {
            rank: me,
            token: v.token,
            experts: experts_of(me, v.token),
            h: v.h,
            got: v.got,
            reference: v.reference,
            bound: v.bound,
        },
    };
    mismatch.to_string()
}

/// Per-iteration times from the phase stamps (dispatch, combine, dispatch,
/// …): cycle counts, calibrated against `%globaltimer` over all of them
/// (cycle resolution, the timer's long-run accuracy). Returns (ns per
/// cycle, dispatch ns, combine ns).
pub fn calibrate(slots: &[EpTiming]) -> Result<(f64, Vec<f64>, Vec<f64>)> {
    if let Some(i) = slots.iter().position(|s| s.clock_end == 0 || s.gt_end == 0) {
        bail!("timing slot {i} was never completed: a phase kernel ended without its stamp");
    }
    let k = ns_per_cycle(slots.iter().map(|s| Span {
        clock_start: s.clock_start,
        clock_end: s.clock_end,
        gt_start: s.gt_start,
        gt_end: s.gt_end,
    }))
    .context("the phase kernels' timing")?;
    let each = |ph: usize| -> Vec<f64> {
        slots
            .iter()
            .skip(ph)
            .step_by(2)
            .map(|s| s.clock_end.wrapping_sub(s.clock_start) as f64 * k)
            .collect()
    };
    Ok((k, each(0), each(1)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cycles_are_calibrated_against_the_timer() {
        let slot = |c0, c1, t0, t1| EpTiming {
            clock_start: c0,
            clock_end: c1,
            gt_start: t0,
            gt_end: t1,
        };
        // 2 cycles per ns; the timer ticks in whole µs.
        let slots = [
            slot(0, 20_000, 0, 10_000),
            slot(0, 40_000, 0, 20_000),
            slot(5, 2_005, 0, 1_000),
            slot(0, 4_000, 0, 2_000),
        ];
        let (k, d, c) = calibrate(&slots).unwrap();
        assert_eq!(k, 0.5);
        assert_eq!(d, vec![10_000.0, 1_000.0]);
        assert_eq!(c, vec![20_000.0, 2_000.0]);
        assert!(calibrate(&[slot(1, 0, 0, 0)]).is_err());
    }
}
