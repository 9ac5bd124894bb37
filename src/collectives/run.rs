//! One rank's GPU run, from its arguments to its exit: local checks first
//! (every problem at once), the GPU and whether its memory suffices (usage
//! errors, exit 2), then the group: agreement on the configuration, rank
//! 0's plan, the session, and on rank 0 the report.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;

use crate::ranks::plan::Plan as RanksPlan;
use crate::ranks::rank::OnDeath;
use crate::ranks::rank::{Rank, RankOptions, run_rank};

use super::elastic::{self, ElasticTimes};
use super::kernels::CollKernels;
use super::layout::{Path, WindowLayout};
use super::member::{Group, RankEnv};
use super::plan::Launch;
use super::plan::{Plan, RunConfig};
use super::report::{self, RankTimes, Row};
use super::session::{Context, Session, block_plan, connect_nccl};
use super::tune::TuneTable;
use crate::cli::{UsageError, fmt_bytes};
use crate::gpu::Gpu;
use crate::gpu::context::device_count;
use crate::ranks::info::RankInfo;
use crate::ranks::nccl::{self as loader, NcclStatus};
use crate::say;

/// Where results go besides stdout, and the GPUs to use.
#[derive(Clone, Debug, Default)]
pub struct Outputs {
    /// An elastic run's plan (one phase; `--elastic`: every rank).
    pub plan: Option<crate::ranks::plan::Plan>,
    pub gpus: Option<u32>,
    pub json: Option<PathBuf>,
    pub csv: Option<PathBuf>,
    /// `--tune FILE`: where rank 0 writes the tuned table.
    pub tune: Option<PathBuf>,
}

/// Runs this rank. Errors: usage errors (exit 2), data mismatches (exit 3),
/// anything else (exit 1), each naming the cause.
pub fn run(env: &RankEnv, cfg: &RunConfig, out: &Outputs) -> Result<()> {
    // May re-execute this process to load NCCL: before anything else.
    let nccl = loader::start(cfg.baseline, cfg.launch == Launch::Graph);
    check_machine()?;
    let visible = device_count()? as u32;
    let gpus = out.gpus.unwrap_or(visible);
    if gpus > visible {
        return Err(UsageError(format!("--gpus {gpus}: this machine has {visible} GPU(s)")).into());
    }
    let ordinal = env.local_rank % gpus;
    let sharing = (0..env.local_world)
        .filter(|l| l % gpus == ordinal)
        .count()
        .max(1) as u32;
    let gpu = Gpu::open(ordinal as usize)?;
    check_memory(&gpu, cfg, sharing)?;
    let kernels = CollKernels::load(&gpu.ctx)?;
    let info = RankInfo::describe(env.rank, &gpu, nccl)?;
    tracing::info!(
        "GPU {ordinal} ({}), {sharing} rank(s) on it, MPS {}; {}",
        info.gpu_name,
        info.mps,
        info.nccl
    );
    let timeout = Duration::from_nanos(cfg.timeout_ns);
    let local = Local {
        gpu: &gpu,
        kernels: &kernels,
        info: &info,
    };
    let fault_timeout = Duration::from_nanos(cfg.fault_timeout_ns());
    match &out.plan {
        Some(plan) => {
            let opts = RankOptions {
                timeout,
                fault_timeout,
                on_death: OnDeath::Survive,
            };
            run_rank(env, plan, opts, |rank| {
                elastic_session(rank, env, cfg, out, &local)
            })
        }
        None => {
            let opts = RankOptions {
                timeout,
                fault_timeout,
                on_death: OnDeath::Fail,
            };
            run_rank(env, &RanksPlan::fixed(env.world), opts, |rank| {
                session(rank.group, cfg, out, &gpu, &kernels, &info)?;
                rank.group.leave()
            })
        }
    }
}

/// Everything local that must hold ([`crate::machine::check`]); the
/// launcher runs it once before starting the ranks, each rank again.
pub fn check_machine() -> Result<()> {
    crate::machine::check("collectives", String::new).map(|_| ())
}

/// Usage error when this rank's buffers cannot fit, named with the numbers.
fn check_memory(gpu: &Gpu, cfg: &RunConfig, sharing: u32) -> Result<()> {
    let max = cfg.max_bytes();
    let mut need = WindowLayout::new(max, cfg.ll128_bytes(), cfg.ranks).bytes + (1 << 20);
    if cfg.baseline {
        need += 2 * max;
    }
    let (free, total) = gpu.ctx.mem_get_info()?;
    let (free, total) = (free as u64, total as u64);
    if need > free || need * u64::from(sharing) > total {
        return Err(UsageError(format!(
            "-e {} on {} ranks needs about {} MiB per rank on GPU {} ({sharing} rank(s) share it), which has {} MiB free \
             of {} MiB: lower -e, use more GPUs or --no-baseline",
            fmt_bytes(max),
            cfg.ranks,
            need >> 20,
            gpu.ordinal,
            free >> 20,
            total >> 20
        ))
        .into());
    }
    Ok(())
}

/// The rank's part of the run, inside the group.
fn session(
    g: &Group,
    cfg: &RunConfig,
    out: &Outputs,
    gpu: &Gpu,
    k: &CollKernels,
    info: &RankInfo,
) -> Result<()> {
    let (infos, plan) = meet(g, cfg, info)?;
    let ctx = Context {
        group: g,
        cfg,
        plan: &plan,
        infos: &infos,
        gpu,
        kernels: k,
    };
    let comm = connect_nccl(&ctx, &infos)?;
    let nccl_note = match &comm {
        Ok(_) => match &info.nccl {
            NcclStatus::Ready(v) => format!("NCCL {v}"),
            NcclStatus::Unavailable(w) => w.clone(),
        },
        Err(why) => format!("NCCL baseline skipped: {why}"),
    };
    let mut s = Session::open(&ctx)?;
    if cfg.paths.contains(&Path::Store) {
        s.check_pointers(&ctx)?;
    }
    g.barrier("ready")?;
    let measured = s.measure(&ctx, comm.as_ref().ok());
    if let Err(e) = &measured {
        // Before our memory goes: the others stop writing into it first.
        g.abort(&format!("{e:#}"));
        std::thread::sleep(Duration::from_millis(300));
    }
    let times = measured?;
    let comm_ran = comm.is_ok();
    drop(comm);
    g.put(&g.rank_entry(g.rank, "result"), &times)?;
    let window = s.layout.bytes;
    s.close(&ctx)?;
    if g.rank == 0 {
        publish(&ctx, &infos, window, (&nccl_note, comm_ran), out)?;
    }
    Ok(())
}

/// What this rank brings: its GPU, the kernels loaded there, its
/// introduction.
struct Local<'a> {
    gpu: &'a Gpu,
    kernels: &'a CollKernels,
    info: &'a RankInfo,
}

/// An elastic run ([`super::elastic`]): one configuration, this rank's
/// session, every phase it lives (connect, steps with agreement and
/// shrink, end), and the lowest survivor's report.
fn elastic_session(
    rank: &Rank,
    env: &RankEnv,
    cfg: &RunConfig,
    out: &Outputs,
    local: &Local,
) -> Result<()> {
    let g = rank.group;
    // Shared and first-come: rank 0 may die, and joiners read it later.
    g.same_config(&g.entry("config"), cfg)?;
    let own = std::slice::from_ref(local.info);
    let ctx = Context {
        group: g,
        cfg,
        plan: &block_plan(cfg, own),
        infos: own,
        gpu: local.gpu,
        kernels: local.kernels,
    };
    let (mut s, card) = Session::create(&ctx, env.incarnation)?;
    crate::stall::progressed();
    let me = elastic::Introduction {
        info: local.info.clone(),
        card,
    };
    let rounds = cfg.elastic.map_or(1, |e| e.rounds);
    let measured = elastic::run(&ctx, &mut s, rank, &me, rounds);
    if let Err(e) = &measured {
        g.abort(&format!("{e:#}"));
        std::thread::sleep(Duration::from_millis(300));
    }
    let (_, infos) = measured?;
    s.close_survived()?;
    if !rank.reports() {
        return Ok(());
    }
    let survivors = rank.survivors(rank.plan().len() - 1);
    let all: Vec<ElasticTimes> = (survivors.iter())
        .map(|&r| g.get(&g.rank_entry(r, "elastic"), r, "elastic results"))
        .collect::<Result<_>>()?;
    g.delete(
        survivors
            .iter()
            .map(|&r| g.rank_entry::<ElasticTimes>(r, "elastic").key().to_string()),
    );
    let ctx = Context {
        infos: &infos,
        ..ctx
    };
    elastic::publish(&ctx, &infos, &all, out.json.as_deref(), out.csv.as_deref())
}

/// Meet: every rank runs rank 0's configuration and introduces itself;
/// returns the introductions, in rank order, and the block limit they give.
fn meet(g: &Group, cfg: &RunConfig, info: &RankInfo) -> Result<(Vec<RankInfo>, Plan)> {
    agree_config(g, cfg)?;
    g.put(&g.rank_entry(g.rank, "info"), info)?;
    let infos: Vec<RankInfo> = g.gather_ranks("info", "GPU info")?;
    let plan = block_plan(cfg, &infos);
    Ok((infos, plan))
}

/// Every rank must run rank 0's configuration.
fn agree_config(g: &Group, cfg: &RunConfig) -> Result<()> {
    if g.rank == 0 {
        return g.put(&g.entry("config"), cfg);
    }
    let theirs: RunConfig = g.get(&g.entry("config"), 0, "run configuration")?;
    if &theirs != cfg {
        return Err(UsageError(format!(
            "rank {} was started with other arguments than rank 0: give every rank the same arguments",
            g.rank
        ))
        .into());
    }
    Ok(())
}

/// Rank 0: gathers every rank's times, prints the table, writes JSON/CSV.
fn publish(
    ctx: &Context,
    infos: &[RankInfo],
    window: u64,
    (nccl, nccl_ran): (&str, bool),
    out: &Outputs,
) -> Result<()> {
    let g = ctx.group;
    let all: Vec<RankTimes> = g.gather_ranks("result", "results")?;
    let rows = rows(ctx, &all);
    let gpus: std::collections::BTreeSet<(&str, &str)> = infos
        .iter()
        .map(|i| (i.host.as_str(), i.gpu_uuid.as_str()))
        .collect();
    say!(
        "[collectives] {} ranks on {} GPU(s) ({}, MPS {}), {} timed calls back to back per case (launched: {}) after \
         {} checked warm-up calls (every output element compared); {nccl}",
        g.world,
        gpus.len(),
        infos[0].gpu_name,
        if infos[0].mps { "on" } else { "off" },
        ctx.cfg.iters,
        ctx.launch_words(),
        ctx.cfg.warmup
    );
    let seats: Vec<_> = infos.iter().map(RankInfo::seat).collect();
    say!("# {}", crate::ranks::info::placement(&seats, nccl_ran));
    if let Some(t) = &ctx.cfg.tuned {
        say!(
            "# the algorithm and path of each size come from a tuned table measured on {} ({} ranks, {} launches)",
            t.gpu,
            t.ranks,
            t.launch
        );
    }
    say!("\n{}", report::table(&rows));
    say!(
        "# time: GPU time per call, an event before and after each call, p50 (p99) of the slowest rank; kern: inside the \
         kernel (block 0's clock); batch: nccl-tests' time, {} more calls back to back between two events, over the \
         calls; nccl, n.batch: NCCL's same call timed the same two ways; ours/n, b.o/n: ours over NCCL's (below 1: \
         ours faster)",
        ctx.cfg.iters
    );
    let floor = report::floor(&all);
    if let Some(f) = &floor {
        say!("{}", report::floor_line(f, &ctx.launch_words()));
    }
    let info = report::RunInfo {
        config: ctx.cfg,
        gpus: infos
            .iter()
            .map(|i| format!("{} {} {}", i.host, i.gpu_name, i.gpu_uuid))
            .collect(),
        mps: infos[0].mps,
        max_blocks: ctx.plan.max_blocks,
        pdl: ctx.pdl(),
        window_bytes: window,
        floor,
        nccl: nccl.into(),
        run_env: crate::results::RunEnv::capture("collectives"),
    };
    if let Some(p) = &out.json {
        report::write_json(p, &info, &rows)?;
    }
    if let Some(p) = &out.csv {
        report::write_csv(p, &info, &rows)?;
    }
    if let Some(p) = &out.tune {
        write_tuned(ctx, &infos[0].gpu_name, &rows, p)?;
    }
    Ok(())
}

/// `--tune FILE`: the fastest case of every operation, type and size, from
/// the rows (in the groups' order, as [`rows`] made them).
fn write_tuned(ctx: &Context, gpu: &str, rows: &[Row], path: &std::path::Path) -> Result<()> {
    let cases = ctx.cfg.groups().into_iter().flat_map(|g| g.cases);
    let timed: Vec<_> = cases.zip(rows.iter().map(|r| r.time_p50_us)).collect();
    let table = TuneTable::fastest(gpu, ctx.group.world, ctx.cfg.launch.name(), &timed);
    table.write(path)?;
    say!(
        "[collectives] wrote the tuned table {} ({} sizes): run with --tuned {}",
        path.display(),
        table.entries.len(),
        path.display()
    );
    Ok(())
}

fn rows(ctx: &Context, all: &[RankTimes]) -> Vec<Row> {
    let n = ctx.group.world;
    let mut rows = Vec::new();
    let mut i = 0;
    for (gi, grp) in ctx.cfg.groups().iter().enumerate() {
        let nccl: Option<Vec<&Vec<f64>>> = all
            .iter()
            .map(|t| t.nccl.get(gi).and_then(|o| o.as_ref()))
            .collect();
        let nccl = nccl.map(|v| report::slowest(&v));
        let nccl_batch: Vec<Option<f64>> = all
            .iter()
            .map(|t| t.nccl_batch.get(gi).copied().flatten())
            .collect();
        let nccl_batch = report::slowest_batch(&nccl_batch);
        for case in &grp.cases {
            let ours = report::slowest(&all.iter().map(|t| &t.cases[i]).collect::<Vec<_>>());
            let kernel = report::slowest(&all.iter().map(|t| &t.kernel[i]).collect::<Vec<_>>());
            let last: Vec<&Vec<f64>> = all.iter().filter_map(|t| t.kernel_last.get(i)).collect();
            let mut row = report::row(
                case,
                n,
                case.blocks(n, ctx.plan.max_blocks, ctx.cfg.block_bytes),
                &ours,
                &kernel,
                all[0].phases.get(i).map_or(&[][..], |p| p.as_slice()),
                nccl.as_ref(),
            );
            let batch: Vec<Option<f64>> = all.iter().map(|t| t.batch.get(i).copied()).collect();
            row.set_batch(report::slowest_batch(&batch).unwrap_or(0.0), nccl_batch);
            row.kernel_last_p50_us = report::slowest(&last).p50_ns / 1e3;
            rows.push(row);
            i += 1;
        }
    }
    rows
}
