//! One rank's session with its peers: the NIXL agent and its window, the
//! memory views, the iterations and their checks, the baseline, and a
//! teardown in which nobody frees memory a peer still maps.
//!
//! Per iteration, queued on the rank's stream and watched by
//! [`crate::gpu::run::run_watched`] (the host polls, asks the store whether
//! a rank gave up, and cancels the kernels if one did): fill this
//! iteration's activations, dispatch (timed), check every received value,
//! the stand-in experts, combine (timed), check every combined value.

use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use cudarc::driver::{CudaStream, sys};
use nixl_sys::{MemView, RegistrationHandle};

use super::config::{Grid, Path, RunConfig};
use super::connect::agent_name;
use super::group::Group;
use super::kernels::{self, EpKernels, EpParams, EpReport, EpTiming, EpVerify, Step};
use super::model::Model;
use super::nccl::{self, NcclStatus};
use super::setup::{Corrupt, Setup, RunOptions, make_setup};
use super::reference::Mismatch;
use super::report::{self, PathTimes, RankInfo, RankResult};
use super::rig::Rig;
use crate::cli::DataMismatch;
use crate::cli::UsageError;
use crate::gpu::Gpu;
use crate::gpu::run::run_watched;
use crate::group::AgentMetadata;
use crate::nixl::agent::{UcxAgent, create_ucx_agent};
use crate::nixl::serdes::{DescList, MemType};
use crate::nixl::view::{load_peer, prep_local, prep_remote_ranks};
use crate::say;

/// What a session works with.
pub struct Context<'a> {
    pub group: &'a Group<'a>,
    pub cfg: &'a RunConfig,
    pub opts: &'a RunOptions,
    pub gpu: &'a Gpu,
    pub kernels: &'a EpKernels,
    pub model: &'a Model,
}

/// The session's resources. Fields drop in declaration order: views, then
/// the registration, then the memory, then the agent.
struct Session {
    remote: Option<MemView>,
    local: Option<MemView>,
    reg: Option<RegistrationHandle>,
    rig: Rig,
    nixl: UcxAgent,
    grid: Grid,
}

/// Runs the session: agreement, setup, measurement, teardown, and on rank 0
/// the report.
pub fn run(ctx: &Context, info: &RankInfo) -> Result<()> {
    let g = ctx.group;
    agree_config(ctx)?;
    g.put(&g.keys.info(g.rank), info)?;
    let infos = g.gather(|r| g.keys.info(r), "GPU and NIXL info")?;
    let setup = if g.rank == 0 {
        let p = make_setup(ctx.cfg, &infos)?;
        g.put(&g.keys.setup(), &p)?;
        p
    } else {
        g.get(&g.keys.setup(), 0, "run setup")?
    };
    let mut s = Session::open(ctx, &setup, info.ranks_on_gpu)?;
    let measured = s.measure(ctx, &setup, info);
    if let Err(e) = &measured {
        // Before our memory goes: the others stop writing into it first.
        g.abort(&format!("{e:#}"));
        std::thread::sleep(Duration::from_millis(300));
    }
    let result = measured?;
    g.put(&g.keys.result(g.rank), &result)?;
    let window_bytes = s.rig.window.len() as u64;
    s.close(ctx)?;
    if g.rank == 0 {
        publish(ctx, &setup, infos, window_bytes)?;
    }
    Ok(())
}

/// Every rank must run rank 0's configuration.
fn agree_config(ctx: &Context) -> Result<()> {
    let g = ctx.group;
    if g.rank == 0 {
        return g.put(&g.keys.config(), ctx.cfg);
    }
    let theirs = g.get(&g.keys.config(), 0, "run configuration")?;
    if &theirs != ctx.cfg {
        return Err(UsageError(format!(
            "rank {} was started with other arguments than rank 0 (ours: {:?}; rank 0's: {theirs:?}): give every rank the \
             same arguments",
            g.rank, ctx.cfg
        ))
        .into());
    }
    Ok(())
}

impl Session {
    /// Agent, window, registration, metadata and window of every peer, views.
    fn open(ctx: &Context, setup: &Setup, ranks_on_gpu: u32) -> Result<Self> {
        let (g, m) = (ctx.group, ctx.model);
        let nixl = create_ucx_agent(&agent_name(g.rank))?;
        let rig = Rig::new(ctx.gpu, m, ctx.cfg.total_iterations())?;
        let reg = nixl
            .agent
            .register_memory(&rig.window, None)
            .context("registering the window (VRAM)")?;
        g.put(
            &g.keys.metadata(g.rank),
            &AgentMetadata(nixl.agent.get_local_md()?),
        )?;
        let own = DescList::new(MemType::Vram, vec![rig.window_desc()]);
        g.put(&g.keys.window(g.rank), &own)?;
        let mut peers = vec![None; g.world as usize];
        for r in (0..g.world).filter(|&r| r != g.rank) {
            let md = g.get(&g.keys.metadata(r), r, "agent metadata")?;
            load_peer(&nixl.agent, &md.0, &agent_name(r), g.timeout())?;
            let list = g.get(&g.keys.window(r), r, "window descriptor")?;
            match list.descs.as_slice() {
                [d] if d.len == rig.window.len() as u64 => {
                    peers[r as usize] = Some((*d, agent_name(r)))
                }
                other => bail!(
                    "rank {r} published a window of {other:?}, expected one buffer of {} bytes",
                    rig.window.len()
                ),
            }
        }
        // SAFETY: our window stays registered until these views drop (close).
        let local = unsafe { prep_local(&nixl.agent, &nixl.backend, &own)? };
        // SAFETY: peers keep their windows until every rank passed "released".
        let remote = match g.world {
            1 => None,
            _ => Some(unsafe { prep_remote_ranks(&nixl.agent, &nixl.backend, &peers)? }),
        };
        let shape = &m.shape;
        let grid = Grid::new(
            shape,
            ctx.gpu.sm_count,
            ranks_on_gpu,
            Some(setup.blocks),
            m.send.entries.len() as u64,
        );
        if g.rank == 0 {
            tracing::info!(
                "grid {}×{} per phase kernel, tokens in {} piece(s) of {} B; window {} MiB per rank",
                grid.blocks,
                grid.threads,
                grid.chunks,
                grid.chunk_bytes,
                rig.window.len() >> 20
            );
        }
        Ok(Self {
            remote,
            local: Some(local),
            reg: Some(reg),
            rig,
            nixl,
            grid,
        })
    }

    fn views(&self) -> (u64, u64) {
        let local = self.local.as_ref().map_or(0, |v| v.as_ptr() as u64);
        (local, self.remote.as_ref().map_or(0, |v| v.as_ptr() as u64))
    }

    /// Pointer check, the start barrier, every path, the NCCL baseline.
    fn measure(&mut self, ctx: &Context, setup: &Setup, info: &RankInfo) -> Result<RankResult> {
        if ctx.cfg.paths.contains(&Path::Store) {
            self.check_pointers(ctx)?;
        }
        ctx.group.barrier("ready")?;
        let mut paths = Vec::new();
        let mut first = 0u32;
        for &path in &ctx.cfg.paths {
            paths.push(self.run_path(ctx, path, first)?);
            first += ctx.cfg.warmup + ctx.cfg.iters;
        }
        let nccl = match (&setup.baseline_skip, &info.nccl) {
            (None, NcclStatus::Ready(v)) => {
                tracing::info!("NCCL all-to-all baseline (NCCL {v})");
                Some(nccl::baseline(
                    ctx.group,
                    ctx.gpu,
                    v.clone(),
                    &ctx.model.pairs,
                    ctx.cfg.warmup,
                    ctx.cfg.iters,
                )?)
            }
            _ => None,
        };
        Ok(RankResult {
            rank: ctx.group.rank,
            grid: self.grid,
            dispatch_bytes: ctx.model.dispatch_bytes,
            combine_bytes: ctx.model.combine_bytes,
            paths,
            nccl,
        })
    }

    /// The store path needs every peer's window mapped into ours; every rank
    /// learns whether all can, so all stop together with the same message.
    fn check_pointers(&self, ctx: &Context) -> Result<()> {
        let g = ctx.group;
        let mut unreachable = Vec::new();
        if let Some(remote) = &self.remote {
            // SAFETY: the view is live; the probe buffer holds `world` u64.
            unsafe {
                ctx.kernels.launch_probe(
                    &ctx.gpu.stream,
                    remote.as_ptr() as u64,
                    g.world,
                    g.rank,
                    self.rig.probe.addr(),
                )?
            };
            let mut raw = vec![0u8; 8 * g.world as usize];
            self.rig.probe.download(&ctx.gpu.stream, &mut raw)?;
            unreachable = raw
                .chunks(8)
                .enumerate()
                .filter(|(_, c)| c.iter().all(|&b| b == 0))
                .map(|(r, _)| r)
                .collect();
        }
        g.put(&g.keys.unmapped(g.rank), &unreachable)?;
        for r in 0..g.world {
            let theirs = g.get(&g.keys.unmapped(r), r, "pointer check")?;
            if let Some(p) = theirs.first() {
                bail!(
                    "the store path needs peer memory mapped into each rank (NVLink through cuda_ipc), but rank {r} got no \
                     pointer to rank {p}'s window from nixlGetPtr (an RDMA-only transport?): use --path put"
                );
            }
        }
        Ok(())
    }

    /// Drops the views, waits until every rank has, then deregisters.
    fn close(mut self, ctx: &Context) -> Result<()> {
        self.remote = None;
        self.local = None;
        ctx.group.barrier("released")?;
        self.reg = None;
        for r in (0..ctx.group.world).filter(|&r| r != ctx.group.rank) {
            let _ = self.nixl.agent.invalidate_remote_md(&agent_name(r));
        }
        Ok(())
    }
}

impl Session {
    /// Warm-up and timed iterations of one path; returns the timed ones.
    fn run_path(&self, ctx: &Context, path: Path, first: u32) -> Result<PathTimes> {
        let (cfg, g) = (ctx.cfg, ctx.group);
        let total = cfg.warmup + cfg.iters;
        let every = (total / 5).max(1);
        for i in 0..total {
            let p = self
                .rig
                .params(cfg, ctx.model, &self.grid, self.views(), path, first + i);
            let corrupt = ctx
                .opts
                .corrupt
                .filter(|_| i == cfg.warmup && g.rank + 1 == g.world);
            let deadline = Duration::from_nanos(cfg.timeout_ns) * 4;
            run_watched(
                ctx.gpu,
                &self.rig.report,
                deadline,
                None,
                |s| self.queue(ctx, s, &p, corrupt),
                || g.probe(),
            )
            .with_context(|| format!("rank {}, {} path, iteration {i}", g.rank, path.name()))?;
            self.check_report(ctx, path, i)?;
            self.check_verify(ctx, path, i)?;
            if g.rank == 0 && (i + 1) % every == 0 {
                tracing::info!(
                    "{} path: {}/{total} iterations verified",
                    path.name(),
                    i + 1
                );
            }
        }
        let mut raw = vec![0u8; self.rig.timing.len()];
        self.rig.timing.download(&ctx.gpu.stream, &mut raw)?;
        let slot = std::mem::size_of::<EpTiming>();
        let (from, to) = (
            2 * (first + cfg.warmup) as usize,
            2 * (first + total) as usize,
        );
        let timed: Vec<EpTiming> = raw[from * slot..to * slot]
            .chunks_exact(slot)
            .map(bytemuck::pod_read_unaligned)
            .collect();
        let (ns_per_cycle, dispatch_ns, combine_ns) = calibrate(&timed)?;
        Ok(PathTimes {
            path,
            dispatch_ns,
            combine_ns,
            ns_per_cycle,
        })
    }

    /// Queues one iteration's kernels (and an injected fault, if asked).
    fn queue(
        &self,
        ctx: &Context,
        s: &CudaStream,
        p: &EpParams,
        corrupt: Option<Corrupt>,
    ) -> Result<()> {
        let k = ctx.kernels;
        let b = self.grid.blocks;
        let nan_at = |addr: u64| -> Result<()> {
            // SAFETY: a 2-byte store inside a live buffer.
            unsafe { sys::cuMemsetD16Async(addr, 0x7fc0, 1, s.cu_stream()).result()? };
            Ok(())
        };
        // SAFETY: every address in `p` belongs to this session's rig, which
        // outlives the launch (run_watched waits for it).
        unsafe {
            sys::cuMemsetD8Async(
                self.rig.verify.addr(),
                0,
                self.rig.verify.len(),
                s.cu_stream(),
            )
            .result()?;
            k.launch(s, Step::Fill, b, p)?;
            k.launch(s, Step::Dispatch, b, p)?;
            if corrupt == Some(Corrupt::Dispatch) {
                let src = (0..p.ranks)
                    .find(|&r| ctx.model.recv.count(r) > 0)
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
        }
        Ok(())
    }
}

impl Session {
    /// A wait that gave up, a failed NIXL call or an unmapped peer, named.
    fn check_report(&self, ctx: &Context, path: Path, i: u32) -> Result<()> {
        let mut r = EpReport::default();
        (self.rig.report).download(&ctx.gpu.stream, bytemuck::bytes_of_mut(&mut r))?;
        let me = ctx.group.rank;
        let at = format!("rank {me}, {} path, iteration {i}", path.name());
        if r.null_ptr_rank != 0 {
            bail!(
                "{at}: nixlGetPtr returned no pointer to rank {}'s window: use --path put",
                r.null_ptr_rank - 1
            );
        }
        if r.base.timed_out != 0 {
            let secs = ctx.cfg.timeout_ns as f64 / 1e9;
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
        Ok(())
    }

    /// Wrong data: exit 3, naming rank, token and expert.
    fn check_verify(&self, ctx: &Context, path: Path, i: u32) -> Result<()> {
        let mut v = EpVerify::default();
        (self.rig.verify).download(&ctx.gpu.stream, bytemuck::bytes_of_mut(&mut v))?;
        if v.mismatches == 0 {
            return Ok(());
        }
        let text = describe(ctx.model, &v);
        Err(DataMismatch(format!(
            "{text} ({} path, iteration {i}; {} wrong value(s) in it)",
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
    let cycles: u64 = slots
        .iter()
        .map(|s| s.clock_end.wrapping_sub(s.clock_start))
        .sum();
    let ns: u64 = slots
        .iter()
        .map(|s| s.gt_end.saturating_sub(s.gt_start))
        .sum();
    if cycles == 0 {
        bail!("the phase kernels' cycle counters did not move");
    }
    let k = ns as f64 / cycles as f64;
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

/// Rank 0: gathers every rank's results, prints lines and the table,
/// writes JSON/CSV.
fn publish(ctx: &Context, setup: &Setup, infos: Vec<RankInfo>, window_bytes: u64) -> Result<()> {
    let g = ctx.group;
    let results = g.gather(|r| g.keys.result(r), "results")?;
    let mut rows = report::rows(ctx.cfg, &results);
    report::set_vs_put(&mut rows, ctx.opts.ref_put_gbps);
    let (c, s) = (ctx.cfg, &ctx.cfg.shape);
    let gpus: std::collections::BTreeSet<(&str, &str)> = infos
        .iter()
        .map(|i| (i.host.as_str(), i.gpu_uuid.as_str()))
        .collect();
    say!(
        "[ep] {} mode: {} ranks on {} GPU(s) ({}, MPS {}), {} tokens × hidden {} per rank, top-{} of {} experts, {} \
         routing, grid {}×{}, {} timed iterations per path",
        c.mode.name(),
        s.ranks,
        gpus.len(),
        infos[0].gpu_name,
        if infos[0].mps { "on" } else { "off" },
        s.tokens,
        s.hidden,
        s.topk,
        s.experts,
        c.routing.name(),
        results[0].grid.blocks,
        results[0].grid.threads,
        c.iters
    );
    for r in &rows {
        say!("{}", report::line(r, results.len()));
    }
    if let Some(why) = &setup.baseline_skip {
        say!("[ep] NCCL baseline skipped: {why}");
    }
    say!("\n{}", report::table(&rows));
    let info = report::RunInfo::collect(ctx.cfg, infos, window_bytes);
    if let Some(p) = &ctx.opts.json {
        report::write_json(p, &info, &rows, &results)?;
    }
    if let Some(p) = &ctx.opts.csv {
        report::write_csv(p, &info, &rows)?;
    }
    Ok(())
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
