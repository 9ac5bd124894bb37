//! The EP kernels' mask on one GPU, in one process, without NIXL: rank 2 of
//! a run sized for 4 ranks runs its steps alone, the host having masked
//! ranks 0, 1 and 3 — so no kernel may send to them, wait for them, or
//! count their contributions — and rank 0 of a one-rank run, unmasked, as
//! the baseline. Both modes' shapes (one combine batch, and many), both
//! data paths, several steps driven by the device's step word
//! (`ep_advance`), every value verified against the mask. Then: without
//! the mask the same output fails its check (the check does use it), and
//! `Rig::reset_source` writes the baseline words a new process needs.
//!
//! A test without cargo's harness (Cargo.toml), so that it is a plain
//! program: `scripts/gpu-bundle.sh` ships it as `bin/ep_mask_check` to GPU
//! machines without cargo. Without a GPU driver or the EP kernels it says
//! SKIP and passes.
//!
//! ```text
//! cargo test --release --test ep_mask_check   # needs a GPU and the EP kernels
//! ```
//! Exit status: 0 success (or skipped), 1 failure (a wait gave up, a step
//! word or mask not as set), 3 wrong data.

use std::process::ExitCode;

use anyhow::{Result, bail, ensure};
use nixl_examples::cli::DataMismatch;
use nixl_examples::ep::config::{self, Grid, Mode, Path, RoutingKind, RunConfig, Shape};
use nixl_examples::ep::kernels::{
    BAD_COMBINED, BAD_CONTRIBUTION, EpKernels, EpParams, EpReport, EpTiming, EpVerify, Step,
};
use nixl_examples::ep::mask::Mask;
use nixl_examples::ep::model::Model;
use nixl_examples::ep::rig::{Rig, SourceBaseline};
use nixl_examples::ep::steps::describe;
use nixl_examples::gpu::Gpu;
use nixl_examples::nixl::view::Views;

const STEPS: u32 = 4;

fn run_config(tokens: u32, ranks: u32) -> RunConfig {
    RunConfig {
        mode: Mode::Ll,
        shape: Shape {
            tokens,
            hidden: 1024,
            topk: 8,
            experts: 32,
            ranks,
        },
        routing: RoutingKind::Uniform,
        paths: vec![Path::Put, Path::Store],
        iters: STEPS,
        warmup: 0,
        seed: 11,
        timeout_ns: 10_000_000_000,
        fault_timeout_ns: config::DEFAULT_FAULT_TIMEOUT_NS,
        blocks: None,
        baseline: false,
        combine_senders: None,
        graph: false,
        on_death: nixl_examples::ranks::membership::OnDeath::Survive,
    }
}

/// One step's kernels, then the report and the checks.
fn step(gpu: &Gpu, k: &EpKernels, rig: &Rig, grid: &Grid, p: &EpParams, m: &Model) -> Result<()> {
    rig.report.zero(&gpu.stream)?;
    rig.verify.zero(&gpu.stream)?;
    let s = &gpu.stream;
    // SAFETY: every address in `p` belongs to `rig`, alive until the sync.
    unsafe {
        for st in [
            Step::Fill,
            Step::Dispatch,
            Step::VerifyDispatch,
            Step::Expert,
            Step::Combine,
            Step::VerifyCombine,
        ] {
            k.launch(s, st, grid.blocks, p)?;
        }
        k.launch(s, Step::Advance, 1, p)?;
    }
    gpu.sync()?;
    let r: EpReport = rig.read_report(s)?;
    ensure!(
        r.base.timed_out == 0 && r.base.errors == 0,
        "a wait gave up or a NIXL call failed: {r:?}"
    );
    ensure!(
        r.masked_bits == 0,
        "the kernels masked {} though no unmasked rank was silent",
        r.newly_masked()
    );
    let mut v = EpVerify::default();
    rig.verify.download(s, bytemuck::bytes_of_mut(&mut v))?;
    if v.mismatches != 0 {
        return Err(DataMismatch(describe(m, &v)).into());
    }
    Ok(())
}

/// `STEPS` steps of rank `rank` of `ranks` with `mask`, on `path`.
fn run(
    gpu: &Gpu,
    k: &EpKernels,
    tokens: u32,
    ranks: u32,
    rank: u32,
    mask: Mask,
    path: Path,
) -> Result<()> {
    let cfg = run_config(tokens, ranks);
    let m = Model::new(&cfg, rank);
    let rig = Rig::new(gpu, &m, u64::from(STEPS))?;
    let grid = Grid::new(
        &m.shape,
        gpu.sm_count,
        ranks,
        None,
        m.send.entries.len() as u64,
    );
    let mut p = rig.params(&cfg, &m, &grid, Views::default(), path);
    p.fault_timeout_ns = cfg.fault_timeout_ns;
    rig.set_mask(&gpu.stream, mask)?;
    rig.set_step(&gpu.stream, 0)?;
    for _ in 0..STEPS {
        step(gpu, k, &rig, &grid, &p, &m)?;
    }
    ensure!(
        rig.step(&gpu.stream)? == STEPS,
        "the step word did not advance once per step"
    );
    ensure!(rig.mask(&gpu.stream)? == mask, "the mask changed");
    let mut raw = vec![0u8; rig.timing.len()];
    rig.timing.download(&gpu.stream, &mut raw)?;
    let t: &EpTiming = bytemuck::from_bytes(&raw[(2 * STEPS as usize - 2) * 32..][..32]);
    ensure!(
        t.gt_end > t.gt_start,
        "the last step's dispatch was not stamped in its slot"
    );
    println!(
        "tokens {tokens:>4}, rank {rank} of {ranks}, masked {mask}, {} path: {STEPS} steps verified \
         (last dispatch {:.1} µs)",
        path.name(),
        (t.gt_end - t.gt_start) as f64 / 1e3
    );
    if !mask.is_empty() {
        check_without_mask(gpu, k, &rig, &grid, &p)?;
        check_reset(gpu, &rig, &m.shape, grid.blocks)?;
    }
    Ok(())
}

/// The last step's output checked as if nobody were masked must fail: the
/// masked ranks' contributions are missing.
fn check_without_mask(
    gpu: &Gpu,
    k: &EpKernels,
    rig: &Rig,
    grid: &Grid,
    p: &EpParams,
) -> Result<()> {
    rig.set_mask(&gpu.stream, Mask::NONE)?;
    rig.set_step(&gpu.stream, STEPS - 1)?;
    rig.verify.zero(&gpu.stream)?;
    // SAFETY: as in `step`.
    unsafe { k.launch(&gpu.stream, Step::VerifyCombine, grid.blocks, p)? };
    gpu.sync()?;
    let mut v = EpVerify::default();
    rig.verify
        .download(&gpu.stream, bytemuck::bytes_of_mut(&mut v))?;
    if v.mismatches == 0 || ![BAD_CONTRIBUTION, BAD_COMBINED].contains(&v.kind) {
        bail!("the combine check passed without the mask ({v:?}): it does not use it");
    }
    Ok(())
}

/// `reset_source` writes the baseline of a step into rank 1's words.
fn check_reset(gpu: &Gpu, rig: &Rig, shape: &Shape, blocks: u32) -> Result<()> {
    rig.reset_source(&gpu.stream, shape, blocks, 1, 9)?;
    let l = rig.layout;
    let mut raw = vec![0u8; l.recv_x as usize];
    rig.window.download(&gpu.stream, &mut raw)?;
    let word = |at: u64| u64::from_le_bytes(raw[at as usize..][..8].try_into().unwrap());
    let want = SourceBaseline::at(shape, blocks, 9);
    let batches = u64::from(shape.combine_batches());
    ensure!(word(l.barrier + 8) == want.barrier, "barrier[1] not reset");
    ensure!(
        word(l.dispatch_count + 8) == want.dispatch_count,
        "dispatch_count[1] not reset"
    );
    for b in 0..batches {
        ensure!(
            word(l.combine_flags + 8 * (batches + b)) == want.combine_flag,
            "combine_flags[1][{b}] not reset"
        );
    }
    Ok(())
}

fn main() -> ExitCode {
    if !nixl_examples::gpu::context::driver_present()
        || nixl_examples::ep::kernels::availability().is_err()
    {
        println!("SKIP ep_mask_check: no GPU driver or no EP kernels here");
        return ExitCode::SUCCESS;
    }
    let all = || -> Result<()> {
        let gpu = Gpu::open(0)?;
        let k = EpKernels::load(&gpu.ctx)?;
        // 128 tokens: one combine batch (low latency); 2048: many.
        for tokens in [128, 2048] {
            for path in [Path::Put, Path::Store] {
                run(&gpu, &k, tokens, 1, 0, Mask::NONE, path)?;
                run(&gpu, &k, tokens, 4, 2, Mask::of([0, 1, 3]), path)?;
            }
        }
        println!("ep_mask_check: every step verified under its mask");
        Ok(())
    };
    match all() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => nixl_examples::cli::exit_status("ep_mask_check", &e),
    }
}
