//! One rank's session with its peers, written as its phases:
//!
//! 1. **meet** — every rank runs rank 0's configuration, introduces itself,
//!    and follows the setup rank 0 makes from every introduction;
//! 2. **open** — this rank's device memory ([`Rig`]), its NIXL agent, the
//!    registered window and the local memory view ([`Net`]);
//! 3. **connect** — publish this rank's card, load every peer's, prepare the
//!    remote view (one element per rank), check that the store path can map
//!    every peer;
//! 4. **steps** — every data path's warm-up and timed steps
//!    ([`super::steps`]), then the NCCL baseline;
//! 5. **leave** — publish the results, drop the views, and release the
//!    window only once no rank maps it any more;
//! 6. **report** — rank 0 gathers every rank's results and prints them.

use std::time::Duration;

use anyhow::{Result, bail};

use super::config::{Grid, Path, RunConfig};
use super::connect::agent_name;
use super::group::Group;
use super::kernels::EpKernels;
use super::model::Model;
use super::nccl::{self, NcclStatus};
use super::net::{Net, PeerCard};
use super::report::{self, PathTimes, RankInfo, RankResult};
use super::rig::Rig;
use super::setup::{Corrupt, RunOptions, Setup, make_setup};
use super::steps::Stepper;
use crate::cli::UsageError;
use crate::gpu::Gpu;

/// What this rank brings: its GPU, the kernels loaded there, the CPU model
/// of the run, and its introduction.
pub struct Local<'a> {
    pub gpu: &'a Gpu,
    pub kernels: &'a EpKernels,
    pub model: &'a Model,
    pub info: &'a RankInfo,
}

/// Runs the session; on rank 0 prints the report.
pub fn run(g: &Group, cfg: &RunConfig, opts: &RunOptions, local: &Local) -> Result<()> {
    let (setup, infos) = meet(g, cfg, local.info)?;
    let rig = Rig::new(local.gpu, local.model, cfg.total_iterations())?;
    let (mut net, card) = Net::open(&agent_name(g.rank), &rig, g.rank, g.world)?;
    connect(g, &mut net, &card)?;
    let stepper = Stepper {
        gpu: local.gpu,
        kernels: local.kernels,
        model: local.model,
        cfg,
        rig: &rig,
        grid: grid(cfg, local, &setup, g.rank),
    };
    if cfg.paths.contains(&Path::Store) {
        check_pointers(g, &stepper, &net)?;
    }
    let measured = steps(g, &stepper, &net, opts.corrupt)
        .and_then(|paths| baseline(g, local, &setup, cfg, stepper.grid, paths));
    if let Err(e) = &measured {
        // Before our memory goes: the others stop writing into it first.
        g.abort(&format!("{e:#}"));
        std::thread::sleep(Duration::from_millis(300));
    }
    g.put(&g.keys.result(g.rank), &measured?)?;
    net.close(|| g.barrier("released"))?;
    if g.rank == 0 {
        let results = g.gather(|r| g.keys.result(r), "results")?;
        report::publish(cfg, opts, &setup, infos, &results, rig.window.len() as u64)?;
    }
    Ok(())
}

/// Meet: rank 0's configuration for all, every rank's introduction, and
/// rank 0's setup from them.
fn meet(g: &Group, cfg: &RunConfig, info: &RankInfo) -> Result<(Setup, Vec<RankInfo>)> {
    if g.rank == 0 {
        g.put(&g.keys.config(), cfg)?;
    } else {
        let theirs = g.get(&g.keys.config(), 0, "run configuration")?;
        if &theirs != cfg {
            return Err(UsageError(format!(
                "rank {} was started with other arguments than rank 0 (ours: {cfg:?}; rank 0's: {theirs:?}): give every \
                 rank the same arguments",
                g.rank
            ))
            .into());
        }
    }
    g.put(&g.keys.info(g.rank), info)?;
    let infos = g.gather(|r| g.keys.info(r), "GPU and NIXL info")?;
    let setup = if g.rank == 0 {
        let s = make_setup(cfg, &infos)?;
        g.put(&g.keys.setup(), &s)?;
        s
    } else {
        g.get(&g.keys.setup(), 0, "run setup")?
    };
    Ok((setup, infos))
}

/// Connect: publish our card, connect to every peer's, prepare the views.
fn connect(g: &Group, net: &mut Net, card: &PeerCard) -> Result<()> {
    g.put(&g.keys.card(g.rank), card)?;
    for r in (0..g.world).filter(|&r| r != g.rank) {
        let theirs = g.get(&g.keys.card(r), r, "agent metadata and window")?;
        net.connect(r, &theirs, g.timeout())?;
    }
    // SAFETY: no kernel runs yet; peers keep their windows registered until
    // every rank passed "released".
    unsafe { net.rebuild(&[]) }
}

/// The launch grid of every phase kernel, from the setup.
fn grid(cfg: &RunConfig, local: &Local, setup: &Setup, rank: u32) -> Grid {
    let grid = Grid::new(
        &cfg.shape,
        local.gpu.sm_count,
        local.info.ranks_on_gpu,
        Some(setup.blocks),
        local.model.send.entries.len() as u64,
    );
    if rank == 0 {
        tracing::info!(
            "grid {}×{} per phase kernel, tokens in {} piece(s) of {} B",
            grid.blocks,
            grid.threads,
            grid.chunks,
            grid.chunk_bytes
        );
    }
    grid
}

/// The store path needs every peer's window mapped into ours; every rank
/// learns whether all can, so all stop together with the same message.
fn check_pointers(g: &Group, st: &Stepper, net: &Net) -> Result<()> {
    let unreachable = match net.views().1 {
        0 => Vec::new(),
        remote => st
            .rig
            .unmapped_peers(st.gpu, st.kernels, remote, g.world, g.rank)?,
    };
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

/// Steps: after the start barrier, every path's warm-up and timed steps;
/// returns the timed ones' GPU times per path.
fn steps(g: &Group, st: &Stepper, net: &Net, corrupt: Option<Corrupt>) -> Result<Vec<PathTimes>> {
    g.barrier("ready")?;
    let cfg = st.cfg;
    let total = cfg.warmup + cfg.iters;
    let every = (total / 5).max(1);
    let mut paths = Vec::new();
    for (n, &path) in cfg.paths.iter().enumerate() {
        let first = n as u32 * total;
        for i in 0..total {
            // The injected fault: the last rank, first timed step.
            let corrupt = corrupt.filter(|_| i == cfg.warmup && g.rank + 1 == g.world);
            st.step(net.views(), path, first + i, corrupt, || g.probe())?;
            if g.rank == 0 && (i + 1) % every == 0 {
                tracing::info!("{} path: {}/{total} steps verified", path.name(), i + 1);
            }
        }
        paths.push(st.times(path, first + cfg.warmup, cfg.iters)?);
    }
    Ok(paths)
}

/// The same-run NCCL all-to-all baseline, when the setup allows it; this
/// rank's whole result.
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
    })
}
