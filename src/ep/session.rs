//! One rank's session with its peers, written as its phases:
//!
//! 1. **meet** — every rank runs one configuration (the first to get there
//!    stores it, the others must match it), introduces itself, and follows
//!    one setup, which every member of the first phase makes alike from
//!    the introductions (the first to get there stores it): no rank is
//!    special, so any may die;
//! 2. **open** — this rank's device memory ([`Rig`]), its NIXL agent, the
//!    registered window and the local memory view ([`Net`], the NIXL side);
//! 3. **phases** — every phase of the plan this process lives, run by the
//!    phase driver ([`crate::ranks::driver`]) over EP's work in a phase
//!    ([`super::phases`]: connect, enter, steps, end); a single-phase run
//!    measures the NCCL baseline at the phase's end;
//! 4. **leave** — drop the views and the window: after the last phase's
//!    end no rank writes into it any more;
//! 5. **report** — the lowest survivor of the last phase gathers every
//!    rank's results and prints them (per phase in an elastic run).
//!
//! A run without `--plan` or `--elastic` is the plan of one phase of every
//! rank, with masking off ([`crate::ranks::rank::OnDeath::Fail`]): a rank that
//! stops is named by the waits, as always.

use std::collections::BTreeSet;

use anyhow::Result;

use super::config::{Grid, Path, RunConfig};
use super::kernels::EpKernels;
use super::keys::EpKeys;
use super::model::Model;
use super::nccl::{self, NcclStatus};
use super::phase_report::{self, PhaseMembers};
use super::phases::{Phases, PublishTimes, first_step};
use super::report::{self, PathTimes, RankInfo, RankResult};
use super::rig::Rig;
use super::setup::{RunOptions, Setup, make_setup};
use super::steps::Stepper;
use crate::gpu::Gpu;
use crate::nixl::net::Net;
use crate::ranks::driver::lowest;
use crate::ranks::group::Group;
use crate::ranks::rank::Rank;
use crate::say;

/// What this rank brings: its GPU, the kernels loaded there, the CPU model
/// of the run, and its introduction.
pub struct Local<'a> {
    pub gpu: &'a Gpu,
    pub kernels: &'a EpKernels,
    pub model: &'a Model,
    pub info: &'a RankInfo,
}

/// Runs the session over the plan `rank` follows. In an elastic run
/// ([`Rank::survives`]) the kernels mask ranks whose waits pass the fault
/// timeout and the survivors agree on who is gone after every step;
/// otherwise every wait is fatal. The lowest survivor prints the report.
pub fn run(rank: &Rank, cfg: &RunConfig, opts: &RunOptions, local: &Local) -> Result<()> {
    let g = rank.group;
    let setup = meet(rank, cfg, local.info)?;
    let steps_per_phase = cfg.total_iterations() as u32;
    let phases = rank.plan().len();
    let rig = Rig::new(
        local.gpu,
        local.model,
        u64::from(steps_per_phase) * phases as u64,
    )?;
    let agent = g.agent_name(g.rank, rank.incarnation());
    let (mut net, card) = Net::open(&agent, &rig.window, rig.window_desc(), g.world)?;
    crate::stall::progressed();
    let elastic = rank.survives();
    let st = Stepper {
        gpu: local.gpu,
        kernels: local.kernels,
        model: local.model,
        cfg,
        rig: &rig,
        grid: grid(
            cfg,
            local,
            &setup,
            g.rank == lowest(&rank.plan().members(0)),
        ),
        fault_timeout_ns: if elastic { cfg.fault_timeout_ns } else { 0 },
    };
    let single = Single {
        local,
        setup: &setup,
        phases,
    };
    let end = |net: &Net, times| single.publish(g, &st, net, times);
    let single: Option<Box<PublishTimes>> = (!elastic).then(|| Box::new(end) as Box<PublishTimes>);
    let mut work = Phases::new(g, &st, &mut net, opts, single);
    rank.drive(&mut work, &card)?;
    drop(work);
    // Every survivor passed the last phase's end: nobody writes into our window.
    net.close(|| Ok(()))?;
    if !rank.reports() {
        return Ok(());
    }
    let window = rig.window.len() as u64;
    match elastic {
        true => report_phases(rank, cfg, opts, setup.infos.clone(), window),
        false => {
            let ranks = rank.survivors(0);
            let results: Vec<RankResult> = (ranks.iter())
                .map(|&r| g.get(&g.keys.result(r), r, "results"))
                .collect::<Result<_>>()?;
            // Their last messages: the reader deletes them.
            g.delete(ranks.iter().map(|&r| g.keys.result(r).key().to_string()));
            publish(cfg, opts, &setup, setup.infos.clone(), &results, window)
        }
    }
}

/// A single-phase run's end: what the NCCL baseline and the launch costs
/// need.
struct Single<'a> {
    local: &'a Local<'a>,
    setup: &'a Setup,
    /// The plan's phases (the launch-cost steps are numbered after them).
    phases: usize,
}

impl Single<'_> {
    /// After the phase's steps: the NCCL baseline and, with `--graph`, the
    /// launch costs; this rank's whole result, published.
    fn publish(&self, g: &Group, st: &Stepper, net: &Net, times: Vec<PathTimes>) -> Result<()> {
        let mut w = baseline(g, self.local, self.setup, st.cfg, st.grid, times)?;
        if st.cfg.graph {
            w.launch_cost = launch_costs(g, st, net, self.phases)?;
        }
        g.put_final(&g.keys.result(g.rank), &w)
    }
}

/// Meet: one configuration for all (the first rank to get there stores
/// it; every other must match it), every rank's introduction, and one
/// setup, which every member of the first phase makes alike from the
/// first phase's introductions (one is stored; joiners read it). Both
/// keys are shared: they outlive any one rank.
fn meet(rank: &Rank, cfg: &RunConfig, info: &RankInfo) -> Result<Setup> {
    let g = rank.group;
    g.same_config(&g.keys.config(), cfg)?;
    g.put(&g.keys.info(g.rank), info)?;
    let entry = g.keys.setup();
    let setup = match rank.incarnation() {
        0 => {
            let infos = gather_infos(rank)?;
            let mine = make_setup(cfg, &infos)?;
            g.claim(&entry, &mine)?.unwrap_or(mine)
        }
        _ => g.get(&entry, lowest(&rank.plan().members(0)), "run setup")?,
    };
    g.share(entry.key());
    Ok(setup)
}

/// The introductions of the first phase's ranks, in rank order, without
/// those proven dead before they introduced themselves.
fn gather_infos(rank: &Rank) -> Result<Vec<RankInfo>> {
    let g = rank.group;
    let mut infos = Vec::new();
    for r in rank.plan().members(0) {
        if let Some(i) = rank.await_from(&g.keys.info(r), r, 0, "GPU and NCCL info")? {
            infos.push(i);
        }
    }
    Ok(infos)
}

/// The launch grid of every phase kernel, from the setup.
fn grid(cfg: &RunConfig, local: &Local, setup: &Setup, log: bool) -> Grid {
    let grid = Grid::new(
        &cfg.shape,
        local.gpu.sm_count,
        local.info.ranks_on_gpu,
        Some(setup.blocks),
        local.model.send.entries.len() as u64,
    );
    if log {
        tracing::info!(
            "grid {}×{} per phase kernel, tokens copied in {} chunk(s) of {} B",
            grid.blocks,
            grid.threads,
            grid.chunks,
            grid.chunk_bytes
        );
    }
    grid
}

/// Steps of dispatch + combine per launch-cost measurement (`--graph`).
const LAUNCH_COST_STEPS: u32 = 200;

/// `--graph`, single-phase runs: per path, the host's wall time per step of
/// dispatch + combine back to back, launched and replayed (steps numbered
/// after every phase's).
fn launch_costs(
    g: &Group,
    st: &Stepper,
    net: &Net,
    phases: usize,
) -> Result<Vec<(Path, f64, f64)>> {
    let mut first = first_step(st.cfg, phases, 0);
    let mut out = Vec::new();
    for &path in &st.cfg.paths {
        let (stream, graph) =
            st.launch_cost(net.views(), path, (first, LAUNCH_COST_STEPS), || g.probe())?;
        out.push((path, stream, graph));
        first += 2 * LAUNCH_COST_STEPS;
    }
    Ok(out)
}

/// The same-run NCCL all-to-all baseline, when the setup allows it; this
/// rank's whole result (single-phase runs).
fn baseline(
    g: &Group,
    local: &Local,
    setup: &Setup,
    cfg: &RunConfig,
    grid: Grid,
    paths: Vec<PathTimes>,
) -> Result<RankResult> {
    let nccl = match (&setup.baseline_skip, &local.info.nccl) {
        (None, NcclStatus::Ready(v)) => {
            tracing::info!("NCCL all-to-all baseline (NCCL {v})");
            let pairs = &local.model.pairs;
            Some(nccl::baseline(
                g,
                local.gpu,
                v.clone(),
                pairs,
                cfg.warmup,
                cfg.iters,
            )?)
        }
        _ => None,
    };
    Ok(RankResult {
        rank: g.rank,
        grid,
        dispatch_bytes: local.model.dispatch_bytes,
        combine_bytes: local.model.combine_bytes,
        paths,
        nccl,
        launch_cost: Vec::new(),
    })
}

/// The first rank, elastic runs: every process's per-phase results, the
/// table, JSON and CSV.
fn report_phases(
    rank: &Rank,
    cfg: &RunConfig,
    opts: &RunOptions,
    infos: Vec<RankInfo>,
    window_bytes: u64,
) -> Result<()> {
    let (g, plan) = (rank.group, rank.plan());
    let mut results = Vec::new();
    let mut members = Vec::new();
    let mut dead_before = BTreeSet::new();
    for i in 0..plan.len() {
        // Who finished phase i: the decision that ended it says.
        let ended = rank.phase_end(i)?;
        let alive = |r: &u32, dead: &BTreeSet<(u32, usize)>| {
            plan.incarnation(*r, i)
                .is_some_and(|inc| !dead.contains(&(*r, inc)))
        };
        let ranks: Vec<u32> = plan
            .members(i)
            .into_iter()
            .filter(|r| alive(r, &dead_before))
            .collect();
        for r in ranks.iter().filter(|r| alive(r, &ended.dead)) {
            let entry = g.keys.phase_result(i, *r);
            results.push(g.get(&entry, *r, "phase results")?);
            g.delete([entry.key()]);
        }
        members.push(PhaseMembers {
            joined: match i {
                0 => Vec::new(),
                _ => (plan.joiners(i).into_iter())
                    .filter(|r| ranks.contains(r))
                    .collect(),
            },
            ranks,
            killed: ended.gone.iter().copied().collect(),
        });
        dead_before = ended.dead;
    }
    let rows = phase_report::rows(&members, &cfg.paths, &results);
    say!(
        "[ep] {} mode, elastic plan {} (capacity {}), {} tokens × hidden {} per rank, top-{} of {} experts, fault timeout \
         {} ms, {} timed steps per path and phase; every step verified against the mask",
        cfg.mode.name(),
        plan.to_json(),
        cfg.shape.ranks,
        cfg.shape.tokens,
        cfg.shape.hidden,
        cfg.shape.topk,
        cfg.shape.experts,
        cfg.fault_timeout_ns / 1_000_000,
        cfg.iters
    );
    say!("\n{}", phase_report::table(&rows));
    let info = report::RunInfo::collect(cfg, infos, window_bytes);
    if let Some(p) = &opts.json {
        let doc = serde_json::json!({ "run": info, "plan": plan.to_json(), "phases": rows, "ranks": results });
        std::fs::write(p, serde_json::to_string_pretty(&doc)? + "\n")?;
    }
    if let Some(p) = &opts.csv {
        crate::results::write_csv(p, &info, &rows)?;
    }
    Ok(())
}

/// Single-phase runs, the first rank: prints the run (one line on its shape, a line per row, the table) and
/// writes the JSON and CSV asked for, from every rank's `results`.
fn publish(
    cfg: &RunConfig,
    opts: &RunOptions,
    setup: &Setup,
    infos: Vec<RankInfo>,
    results: &[RankResult],
    window_bytes: u64,
) -> Result<()> {
    let mut rows = report::rows(cfg, results);
    report::set_vs_put(&mut rows, opts.ref_put_gbps);
    let s = &cfg.shape;
    let gpus: std::collections::BTreeSet<(&str, &str)> = infos
        .iter()
        .map(|i| (i.host.as_str(), i.gpu_uuid.as_str()))
        .collect();
    say!(
        "[ep] {} mode: {} ranks on {} GPU(s) ({}, MPS {}), {} tokens × hidden {} per rank, top-{} of {} experts, {} \
         routing, grid {}×{}, {} timed iterations per path",
        cfg.mode.name(),
        s.ranks,
        gpus.len(),
        infos[0].gpu_name,
        if infos[0].mps { "on" } else { "off" },
        s.tokens,
        s.hidden,
        s.topk,
        s.experts,
        cfg.routing.name(),
        results[0].grid.blocks,
        results[0].grid.threads,
        cfg.iters
    );
    let seats: Vec<_> = infos.iter().map(RankInfo::seat).collect();
    let baseline_ran = cfg.baseline && setup.baseline_skip.is_none();
    say!("# {}", crate::ranks::info::placement(&seats, baseline_ran));
    for r in &rows {
        say!("{}", report::line(r, results.len()));
    }
    if let Some(why) = &setup.baseline_skip {
        say!("[ep] NCCL baseline skipped: {why}");
    }
    say!("\n{}", report::table(&rows));
    for line in report::wall_lines(results) {
        say!("{line}");
    }
    let info = report::RunInfo::collect(cfg, infos, window_bytes);
    if let Some(p) = &opts.json {
        report::write_json(p, &info, &rows, results)?;
    }
    if let Some(p) = &opts.csv {
        report::write_csv(p, &info, &rows)?;
    }
    Ok(())
}
