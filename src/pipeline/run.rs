//! One rank's GPU run, from its configuration to its exit: the GPU and its
//! kernels, then the group: the configuration agreed, every rank's GPU
//! known, the window registered and the neighbours connected (stage r
//! connects to r − 1 and r + 1 only: a chain), every case run and checked,
//! then NCCL's send/recv through the same chain where NCCL runs
//! ([`super::nccl`]), and on rank 0 the report.
//!
//! A case: every rank zeroes its window (ready and credit words start at 0,
//! old LL lines are gone), all meet at a barrier, each launches its stage's
//! kernel once for all the case's chunks (the last stage first:
//! `launches_first`), the host watches it
//! ([`crate::gpu::run::run_watched`]: the store is asked whether a rank
//! gave up), and all meet again before anyone touches the window (a late
//! credit must not land in the next case's).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};

use super::config::{Case, Config};
use super::kernels::{PipeKernels, PipeParams, PipeReport};
use super::nccl::{self, NcclTimes};
use super::report::{self, StageResult};
use super::ring::{self, Window};
use crate::cli::{DataMismatch, UsageError};
use crate::gpu::run::run_watched;
use crate::gpu::{DeviceBuffer, Gpu};
use crate::nixl::net::Net;
use crate::nixl::serdes::Desc;
use crate::ranks::RankEnv;
use crate::ranks::group::Group;
use crate::ranks::info::RankInfo;
use crate::ranks::nccl::{self as loader, NcclStatus};
use crate::ranks::plan::Plan;
use crate::ranks::rank::OnDeath;
use crate::ranks::rank::{RankOptions, run_rank};
use crate::ranks::sm_share::{ranks_sharing, sm_share};

/// Timed chunks whose latency is stamped, at most.
pub const MAX_STAMPS: u64 = 2048;

/// Where results go besides stdout, the GPUs to use, the host's limits.
#[derive(Clone, Debug, Default)]
pub struct Outputs {
    pub gpus: Option<u32>,
    pub json: Option<PathBuf>,
    pub csv: Option<PathBuf>,
    /// Every store wait's limit, and each case's on the host.
    pub timeout: Duration,
}

/// What a rank's cases run with.
struct Ctx<'a> {
    g: &'a Group<'a>,
    cfg: &'a Config,
    gpu: &'a Gpu,
    k: &'a PipeKernels,
    out: &'a Outputs,
    /// This rank's share of its GPU's SMs; all ranks on one GPU; the most
    /// ranks on one GPU.
    share: u32,
    same_gpu: bool,
    ranks_on_gpu: u32,
}

/// Runs this rank. Errors: usage errors (exit 2), a wrong word (exit 3),
/// anything else (exit 1), each naming the cause.
pub fn run(env: &RankEnv, cfg: &Config, out: &Outputs) -> Result<()> {
    // May re-execute this process to load NCCL: before anything else.
    let nccl = loader::start(cfg.baseline, false);
    check_machine()?;
    let visible = crate::gpu::context::device_count()? as u32;
    let gpus = out.gpus.unwrap_or(visible);
    if gpus > visible {
        return Err(UsageError(format!("--gpus {gpus}: this machine has {visible} GPU(s)")).into());
    }
    let gpu = Gpu::open((env.local_rank % gpus) as usize)?;
    let k = PipeKernels::load(&gpu.ctx)?;
    let info = RankInfo::describe(env.rank, &gpu, nccl)?;
    tracing::info!(
        "GPU {} ({}), MPS {}; {}",
        gpu.ordinal,
        info.gpu_name,
        info.mps,
        info.nccl
    );
    let opts = RankOptions {
        timeout: out.timeout,
        fault_timeout: out.timeout,
        on_death: OnDeath::Fail,
    };
    run_rank(env, &Plan::fixed(env.world), opts, |rank| {
        session(rank.group, cfg, out, &gpu, &k, &info)?;
        rank.group.leave()
    })
}

/// Everything local that must hold ([`crate::machine::check`]).
pub fn check_machine() -> Result<()> {
    crate::machine::check("pipeline", String::new).map(|_| ())
}

/// The rank's part of the run, inside the group.
fn session(
    g: &Group,
    cfg: &Config,
    out: &Outputs,
    gpu: &Gpu,
    k: &PipeKernels,
    info: &RankInfo,
) -> Result<()> {
    g.same_config(&g.entry("config"), cfg)?;
    g.put(&g.rank_entry(g.rank, "info"), info)?;
    let infos: Vec<RankInfo> = g.gather_ranks("info", "rank description")?;
    let gpus: Vec<_> = (infos.iter())
        .map(|i| (i.host.as_str(), i.gpu_uuid.as_str(), i.sm_count))
        .collect();
    let (on_one, share) = sm_share(&gpus);
    let sharing = ranks_sharing(&gpus, (&info.host, &info.gpu_uuid));
    check_resident(cfg, k, share, (info.sm_count, sharing))?;
    let ctx = Ctx {
        g,
        cfg,
        gpu,
        k,
        out,
        share,
        same_gpu: on_one == g.world,
        ranks_on_gpu: on_one,
    };
    let bytes = cfg.window_bytes(share);
    let window = DeviceBuffer::zeroed(&gpu.ctx, bytes as usize).with_context(|| {
        format!(
            "allocating the window ({bytes} bytes) on GPU {}",
            gpu.ordinal
        )
    })?;
    let net = connect(g, &window, bytes)?;
    g.barrier("ready")?;
    let results =
        run_cases(&ctx, &net, &window).and_then(|r| nccl_baseline(&ctx, &infos).map(|n| (r, n)));
    if let Err(e) = &results {
        // Before our memory goes: the others stop writing into it first.
        g.abort(&format!("{e:#}"));
        std::thread::sleep(Duration::from_millis(300));
    }
    let (results, (nccl_note, nccl_ran)) = results?;
    g.put(&g.rank_entry(g.rank, "result"), &results)?;
    net.close(|| g.barrier("released"))?;
    if g.rank == 0 {
        let all: Vec<Vec<StageResult>> = g.gather_ranks("result", "stage results")?;
        let nccl = match nccl_ran {
            true => Some(g.gather_ranks::<Vec<NcclTimes>>("nccl_result", "NCCL chain results")?),
            false => None,
        };
        let rctx = report::Context {
            nccl_note,
            nccl,
            ..ctx_report(&ctx, &infos)
        };
        report::publish(&rctx, &all)?;
    }
    Ok(())
}

/// Every case's grid must be resident at once, with the grids of the other
/// ranks on this GPU (`gpu`: its SMs, the ranks sharing it): a stage's
/// channels spin on its neighbours' channels, so a block that waits for an
/// SM while its partner spins for it never comes, and the run would end
/// in a timeout that blames a neighbour. Errors: a usage error (exit 2)
/// naming the case and the most blocks that fit.
fn check_resident(
    cfg: &Config,
    k: &PipeKernels,
    share: u32,
    (sms, sharing): (u32, u32),
) -> Result<()> {
    for case in cfg.cases() {
        let (blocks, threads) = (case.blocks(cfg, share), case.threads(cfg));
        let per_sm = k.blocks_per_sm(case.level, case.path, threads)?;
        let room = per_sm * sms / sharing.max(1);
        if blocks > room {
            return Err(UsageError(format!(
                "--blocks {blocks} of {threads} threads ({}): this GPU keeps only {room} such blocks a rank resident at once \
                 ({sms} SMs × {per_sm} blocks, shared by {sharing} rank(s)); each stage's blocks wait on its neighbours' blocks, \
                 so every block must be resident together: use at most {room} blocks (or fewer threads)",
                case.describe()
            ))
            .into());
        }
    }
    Ok(())
}

/// NCCL's chain beside the pipeline ([`super::nccl`]), after its cases so
/// that NCCL's setup touches none of them: connected where every rank has
/// NCCL and NCCL accepts the ranks (all agree), run, and this rank's times
/// put under `rank/<r>/nccl_result`. Returns the report's note (NCCL's
/// version, or why the baseline did not run) and whether it ran.
fn nccl_baseline(ctx: &Ctx, infos: &[RankInfo]) -> Result<(String, bool)> {
    let g = ctx.g;
    if !ctx.cfg.baseline {
        return Ok(("NCCL baseline skipped: --no-baseline".into(), false));
    }
    let statuses: Vec<&NcclStatus> = infos.iter().map(|i| &i.nccl).collect();
    let comm = match loader::connect_all(g, ctx.gpu, &statuses, ctx.ranks_on_gpu)? {
        Ok(comm) => comm,
        Err(why) => return Ok((format!("NCCL baseline skipped: {why}"), false)),
    };
    match nccl::measure(g, ctx.gpu, &comm, ctx.cfg, ctx.out.timeout) {
        Ok(times) => {
            drop(comm);
            g.put(&g.rank_entry(g.rank, "nccl_result"), &times)?;
        }
        Err(e) => {
            // NCCL may still run (a thread stuck in it): no destroy, no abort.
            std::mem::forget(comm);
            return Err(e);
        }
    }
    let version = match &infos[0].nccl {
        NcclStatus::Ready(v) => v.as_str(),
        NcclStatus::Unavailable(_) => "?",
    };
    Ok((
        format!("NCCL {version}: ncclSend/ncclRecv through the same chain"),
        true,
    ))
}

/// Agent, registration, card; then the neighbours' cards and the remote
/// view over them (the other elements stay empty).
fn connect(g: &Group, window: &DeviceBuffer, bytes: u64) -> Result<Net> {
    let desc = Desc {
        addr: window.addr(),
        len: bytes,
        dev_id: window.ordinal() as u64,
    };
    let (mut net, card) = Net::open(&g.agent_name(g.rank, 0), window, desc, g.world)?;
    g.put(&g.rank_entry(g.rank, "card"), &card)?;
    let neighbours = [
        g.rank.checked_sub(1),
        Some(g.rank + 1).filter(|&r| r < g.world),
    ];
    for r in neighbours.into_iter().flatten() {
        let card = g.peer_card(r)?;
        net.connect(r, &card, g.timeout())
            .map_err(|e| g.blame_member(r as usize, e))?;
    }
    // SAFETY: no kernel runs yet; the neighbours keep their windows until
    // every rank passed "released".
    unsafe { net.rebuild(&[])? };
    Ok(net)
}

/// The report's context: the configuration, the ranks, the copy engine.
fn ctx_report<'a>(ctx: &'a Ctx, infos: &'a [RankInfo]) -> report::Context<'a> {
    report::Context {
        cfg: ctx.cfg,
        infos,
        gpu: ctx.gpu,
        ce_dst: stage_one_gpu(infos),
        json: ctx.out.json.as_deref(),
        csv: ctx.out.csv.as_deref(),
        channels: Box::new(|c: &Case| busy(ctx, c)),
        nccl_note: String::new(),
        nccl: None,
    }
}

/// Stage 1's GPU as this process numbers it, when it is on this host: the
/// copy-engine baseline copies from stage 0's GPU to it, as the first link
/// does (a copy within one GPU would time its HBM, or its L2, not a link).
fn stage_one_gpu(infos: &[RankInfo]) -> Option<usize> {
    let (first, second) = (infos.first()?, infos.get(1)?);
    (first.host == second.host)
        .then(|| crate::gpu::context::find_gpu(&second.gpu_uuid))
        .flatten()
}

/// The channels of `c` that carry data.
fn busy(ctx: &Ctx, c: &Case) -> u32 {
    let all = c
        .level
        .channels(c.blocks(ctx.cfg, ctx.share), c.threads(ctx.cfg));
    ring::busy_channels(c.chunk, all)
}

/// Every case in turn; this rank's results.
fn run_cases(ctx: &Ctx, net: &Net, window: &DeviceBuffer) -> Result<Vec<StageResult>> {
    let stamps = (ctx.cfg.chunks - ctx.cfg.warmup).min(MAX_STAMPS);
    let report = DeviceBuffer::zeroed(&ctx.gpu.ctx, size_of::<PipeReport>())?;
    let t_start = DeviceBuffer::zeroed(&ctx.gpu.ctx, 8 * stamps as usize)?;
    let t_end = DeviceBuffer::zeroed(&ctx.gpu.ctx, 8 * stamps as usize)?;
    let bufs = Bufs {
        window,
        report: &report,
        t_start: &t_start,
        t_end: &t_end,
        stamps,
    };
    let cases = ctx.cfg.cases();
    let mut out = Vec::with_capacity(cases.len());
    for (n, case) in cases.iter().enumerate() {
        let r = run_case(ctx, net, &bufs, case, n)
            .with_context(|| format!("stage {}: {}", ctx.g.rank, case.describe()))?;
        if ctx.g.rank == 0 {
            tracing::info!("case {}/{} done: {}", n + 1, cases.len(), case.describe());
        }
        out.push(r);
    }
    Ok(out)
}

/// The buffers a case works on.
struct Bufs<'a> {
    window: &'a DeviceBuffer,
    report: &'a DeviceBuffer,
    t_start: &'a DeviceBuffer,
    t_end: &'a DeviceBuffer,
    stamps: u64,
}

/// One case on this rank: zero, meet, run the stage's kernel watched, meet
/// again, check what it reports.
fn run_case(ctx: &Ctx, net: &Net, b: &Bufs, case: &Case, n: usize) -> Result<StageResult> {
    let (g, cfg, gpu) = (ctx.g, ctx.cfg, ctx.gpu);
    let blocks = case.blocks(cfg, ctx.share);
    let threads = case.threads(cfg);
    let channels = case.level.channels(blocks, threads);
    let stride = ring::slice_stride(
        cfg.slot_bytes.unwrap_or(0),
        case.chunk,
        channels,
        case.path.lines(),
    );
    let w = Window::new(case.slots, stride, channels);
    b.window.zero(&gpu.stream)?;
    gpu.stream.synchronize()?;
    g.barrier(&format!("case{n}/go"))?;
    let p = params(ctx, net, b, case, &w, stride);
    let launch = |s: &cudarc::driver::CudaStream| -> Result<()> {
        // SAFETY: every address in `p` lives until run_watched returned.
        let go = || unsafe { ctx.k.launch(s, case.level, (blocks, threads), &p) };
        let first = launches_first(g.rank, g.world);
        if first {
            go()?;
        }
        g.barrier(&format!("case{n}/launched"))?;
        if !first {
            go()?;
        }
        Ok(())
    };
    run_watched(gpu, b.report, ctx.out.timeout, None, launch, || g.probe())?;
    g.barrier(&format!("case{n}/done"))?;
    let mut r = PipeReport::default();
    b.report
        .download(&gpu.stream, bytemuck::bytes_of_mut(&mut r))?;
    check_report(ctx, case, &r)?;
    let stamps = |buf: &DeviceBuffer| buf.read_u64s(&gpu.stream);
    Ok(StageResult {
        rank: g.rank,
        stall_ns: r.stall_ns,
        overwrites: r.overwrites,
        arrive_first: r.arrive_first,
        arrive_last: r.arrive_last,
        done_ns: r.done_ns,
        checked: r.checked,
        handshakes: u64::from(r.handshakes),
        t_start: if g.rank == 0 {
            stamps(b.t_start)?
        } else {
            Vec::new()
        },
        t_end: if g.rank + 1 == g.world {
            stamps(b.t_end)?
        } else {
            Vec::new()
        },
    })
}

/// Whether stage `rank` of `world` launches its kernel before the others
/// (which wait at a barrier it reaches with its kernel launched): the last
/// stage does. Why: where stages share a GPU's SMs (MPS), the kernel
/// launched first got ahead of the one launched after it in every run we
/// measured (its warps, the older on each SM, seem to win the schedulers'
/// issue slots), and on the store path the reader, which loads and checks
/// every byte, falls behind when it is the younger. On one H200 under MPS, 2
/// stages, 1 MiB chunks over 32 slots: 1,456-1,470 GB/s per link with the
/// reader launched 3 ms first, 1,302-1,319 with the writer first (4 runs
/// each, one call); launched at once, either of the two, by chance. With 3
/// and 4 stages no launch order moved the slowest link beyond the noise.
/// Stages on distinct GPUs gain nothing and lose a barrier's time.
fn launches_first(rank: u32, world: u32) -> bool {
    rank + 1 == world
}

/// The stage kernel's parameters for `case`.
fn params(ctx: &Ctx, net: &Net, b: &Bufs, case: &Case, w: &Window, stride: u64) -> PipeParams {
    let (g, cfg) = (ctx.g, ctx.cfg);
    let views = net.views();
    let channels = case
        .level
        .channels(case.blocks(cfg, ctx.share), case.threads(cfg));
    let slow = cfg.slow_stage == Some(g.rank);
    PipeParams {
        local_mvh: views.local,
        remote_mvh: views.remote,
        window: b.window.addr(),
        report: b.report.addr(),
        t_start: b.t_start.addr(),
        t_end: b.t_end.addr(),
        off_ring: w.off_ring,
        off_stage: w.off_stage,
        off_ready: w.off_ready,
        off_credit: w.off_credit,
        chunk_bytes: case.chunk,
        slice_stride: stride,
        slice_bytes: ring::slice_bytes(case.chunk, channels),
        chunks: cfg.chunks,
        warmup: cfg.warmup,
        stamps: b.stamps,
        timeout_ns: cfg.fault_timeout_ns,
        delay_ns: if slow { cfg.delay_us * 1000 } else { 0 },
        stage: g.rank,
        stages: g.world,
        slots: case.slots,
        path: case.path.code(),
        same_gpu: u32::from(ctx.same_gpu),
        corrupt_chunk: match cfg.corrupt_stage == Some(g.rank) {
            true => cfg.warmup as i32,
            false => -1,
        },
        batch: case.batch,
        reserved: 0,
    }
}

/// A wait that gave up (naming the neighbour), a failed NIXL call, an
/// unmapped neighbour, a wrong word (exit 3).
fn check_report(ctx: &Ctx, case: &Case, r: &PipeReport) -> Result<()> {
    let me = ctx.g.rank;
    if r.null_ptr != 0 {
        bail!(
            "nixlGetPtr gave no pointer to a neighbour's window: the {} path needs it mapped (NVLink or one GPU); use --path put",
            case.path.name()
        );
    }
    if r.base.timed_out != 0 {
        let (peer, what) = match r.wait_on {
            1 => (
                me.wrapping_sub(1),
                "chunk's data (its ready word or LL lines)",
            ),
            _ => (me + 1, "credit (a free slot)"),
        };
        let how = match r.base.timed_out {
            2 => "the host cancelled the wait".to_string(),
            _ => format!(
                "no progress within --fault-timeout {} s",
                ctx.cfg.fault_timeout_ns as f64 / 1e9
            ),
        };
        bail!(
            "stage {me} waited for stage {peer}'s {what} for chunk {} ({how}; the word read {}): stage {peer} died, is \
             frozen, or runs other arguments",
            r.wait_chunk,
            r.base.observed
        );
    }
    if r.base.errors != 0 {
        bail!(
            "{} NIXL device call(s) failed, the first with status {}",
            r.base.errors,
            r.base.first_status
        );
    }
    if r.mismatches != 0 {
        return Err(DataMismatch(format!(
            "stage {me} (the last) found chunk {} wrong at byte offset {}: word {:#010x}, expected {:#010x} ({} wrong \
             word(s) in this case)",
            r.bad_chunk, r.bad_offset, r.bad_got, r.bad_want, r.mismatches
        ))
        .into());
    }
    let want = case.chunk * ctx.cfg.chunks;
    if me + 1 == ctx.g.world && r.checked != want {
        bail!(
            "the last stage verified {} bytes, expected {want}",
            r.checked
        );
    }
    Ok(())
}
