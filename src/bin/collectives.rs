//! `collectives`: allreduce, allgather and reduce-scatter between N ranks,
//! one process each, driven by the GPU through NIXL's device API; every
//! output element verified, timed the way nccl-tests does, beside NCCL.
//!
//! ```text
//! collectives --ranks 2                               # starts 2 ranks on this machine
//! torchrun --no-python --nproc-per-node=2 collectives -b 8 -e 64M
//! collectives --ranks 3 --check-connection            # no GPU: the ranks meet and connect
//! ```

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Result;
use clap::Parser;
use nixl_examples::cli::{UsageError, check_port_free, parse_bytes, parse_timeout};
use nixl_examples::collectives::layout::{AlgoChoice, Dtype, MAX_BLOCKS, Path, PathChoice, sizes};
use nixl_examples::collectives::member::{self, RankEnv};
use nixl_examples::collectives::ops::Op;
use nixl_examples::collectives::plan::{DataMode, Elastic, Launch, Place, RunConfig, SyncDomain};
use nixl_examples::collectives::run::{self, Outputs};
use nixl_examples::collectives::tune::TuneTable;
use nixl_examples::ranks::args::ElasticArgs;
use nixl_examples::ranks::check::{Check, Inject};
use nixl_examples::ranks::launch;
use nixl_examples::ranks::membership::OnDeath;
use nixl_examples::ranks::plan::Plan;
use nixl_examples::results::ResultFiles;

/// Collectives the GPU drives itself, over NIXL's device API.
///
/// Allreduce (sum; one-shot: every rank pushes its input to every peer and
/// sums all; two-shot: reduce-scatter then allgather; ll: one-shot in
/// 16-byte lines that carry the call's number beside 8 data bytes, store
/// path, up to 64 KiB), allgather and
/// reduce-scatter, in f32 and bf16, over nixlGetPtr stores (--path store,
/// NVLink) or nixlPut + nixlAtomicAdd signals (--path put, any UCX device
/// transport). Sizes sweep like nccl-tests (-b, -e, -f; the size is the
/// whole buffer, rounded down to whole elements per rank), warm-up
/// excluded, GPU time per call (CUDA events; p50 and p99 over the calls of
/// the slowest rank), algbw and busbw with nccl-tests' factors, and NCCL's
/// same call in the same run. Inputs are small integers, so every sum is
/// exact (or, with --data random, random values checked within a stated
/// bound): every output element is checked, of every warm-up call (each
/// with fresh inputs) and, out of place, of the last two timed calls (the
/// timed calls run back to back, as nccl-tests runs them, or replayed from
/// one CUDA graph per case with --launch graph). The kern column is block
/// 0's time inside the kernel, last from its start to the end of the call's
/// last block (%globaltimer; above kern: blocks ended unevenly);
/// setup/push/sig/wait splits block 0's first phase:
/// peer pointers, pushing the data, fence and signals, waiting for every
/// peer (for ll: the polls and the sum). Below the table, the launch floor:
/// an empty kernel (one block, a call's parameters) launched and timed the
/// same two ways as the calls, what no call of ours can go below.
///
/// Without RANK in the environment, `collectives` starts --ranks rank
/// processes itself; under torchrun each process is one rank.
///
/// Elastic runs (--elastic, or --plan FILE in ep's format): a wait on a
/// rank that passes --fault-timeout masks it and abandons the step on
/// every member (its calls counted lost); the survivors agree on who is
/// gone, shrink (chunks, slices and output slots recomputed over fewer
/// members; nothing re-registered) and go on, every later call checked
/// against the survivors' sum. Any rank may die (kill one by pid). A later
/// phase of the plan may bring new ranks (new ids: `[[0,1,-2],[0,1,3]]`),
/// which join between two calls, as ncclCommGrow adds ranks; a rank leaves
/// only by dying. Each phase runs --rounds rounds. The report is per case
/// and member count. No NCCL baseline.
///
/// Results go to stdout (rank 0), progress to stderr. Exit status: 0
/// success, 1 failure, 2 bad arguments, 3 wrong data.
#[derive(Parser, Debug)]
#[command(
    version,
    after_help = "Examples:\n  \
    collectives --ranks 2 -b 8 -e 64M --json ar.json --op allreduce\n  \
    collectives --ranks 3 --gpus 1 --path store --dtype bf16   # 3 ranks on one GPU (under MPS)\n  \
    torchrun --no-python --nproc-per-node=2 $(which collectives)\n  \
    collectives --ranks 3 --check-connection                   # no GPU needed\n\n\
    bench/run_collectives.sh runs the usual matrix."
)]
struct Args {
    /// Smallest buffer, bytes (K, M, G suffixes: powers of 1024).
    #[arg(short = 'b', long, default_value = "8", value_parser = parse_bytes)]
    minbytes: u64,

    /// Largest buffer, bytes.
    #[arg(short = 'e', long, default_value = "64M", value_parser = parse_bytes)]
    maxbytes: u64,

    /// Size factor between steps.
    #[arg(short = 'f', long, default_value_t = 2)]
    stepfactor: u64,

    /// Operations to run (comma-separated).
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = Op::all().to_vec())]
    op: Vec<Op>,

    /// Algorithm: one-shot, two-shot (allreduce), ll, ll128, two-shot-ll128
    /// (allreduce), ring (reduce-scatter), auto (by size), or all (the line
    /// algorithms and the ring only where they run: store path, up to 64 KiB
    /// for ll, 4 MiB for ll128, above 64 KiB up to 4 MiB for
    /// two-shot-ll128, above 64 KiB for the ring). Allgather and
    /// reduce-scatter have one-shot, ll and ll128, reduce-scatter the ring
    /// too; two-shot and auto run their one-shot, two-shot-ll128 their
    /// ll128, ring the one-shot of allreduce and allgather.
    #[arg(long, value_enum, default_value_t = AlgoChoice::All)]
    algo: AlgoChoice,

    /// Data path: store (nixlGetPtr + stores), put (nixlPut + signals), or both.
    #[arg(long, value_enum, default_value_t = PathChoice::Both)]
    path: PathChoice,

    /// Element types (comma-separated).
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = vec![Dtype::F32, Dtype::Bf16])]
    dtype: Vec<Dtype>,

    /// Out of place, in place, or both.
    #[arg(long, value_enum, default_value_t = Place::Out)]
    place: Place,

    /// Timed calls per case (at most 200: they are all queued before the
    /// GPU starts them); in an elastic run, calls per step, each checked;
    /// with --check-connection and --elastic, steps of agreement (any number).
    #[arg(short = 'n', long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..))]
    iters: u32,

    /// Untimed warm-up calls per case, each checked element by element.
    #[arg(short = 'w', long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..))]
    warmup: u32,

    /// Seconds any wait may take: ranks joining, store keys, and every GPU
    /// spin-wait (a dead or silent rank is named within it).
    #[arg(short, long, default_value = "30", value_parser = parse_timeout)]
    timeout: Duration,

    /// Rank processes to start on this machine (ignored under torchrun) [default: 2].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=16), conflicts_with = "plan")]
    ranks: Option<u32>,

    /// GPUs to use; rank r runs on GPU LOCAL_RANK mod gpus [default: all visible].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    gpus: Option<u32>,

    /// Blocks per call at most [default: the GPU's SMs divided by the ranks sharing it].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_BLOCKS)))]
    blocks: Option<u32>,

    /// Bytes of a call's elements per thread block: a call takes one block per
    /// this many bytes, up to --blocks [default: 4K for ll, ll128 and
    /// two-shot-ll128, 8K for one-shot and two-shot].
    #[arg(long, value_parser = parse_bytes)]
    block_bytes: Option<u64>,

    /// One-shot and two-shot: bytes per piece at most. A block's share is cut
    /// into pieces dealt round the blocks, so every block works through the
    /// buffer beside the others (one slice per block ended unevenly from
    /// about 1 MiB a block).
    #[arg(long, default_value = "256K", value_parser = parse_bytes)]
    piece_bytes: u64,

    /// Write the tuned table: for every operation, type and size, the
    /// algorithm and path that ran fastest here (JSON; rank 0 writes it).
    #[arg(long, value_name = "FILE", conflicts_with = "tuned")]
    tune: Option<PathBuf>,

    /// Run each size with the algorithm and path a tuned table names (the
    /// entry of the nearest size of the same operation and type), instead of
    /// --algo and --path; a size it cannot serve runs --algo auto.
    #[arg(long, value_name = "FILE")]
    tuned: Option<PathBuf>,

    /// Store port when starting the ranks here (0: a free one).
    #[arg(long, default_value_t = 0)]
    port: u16,

    /// Only check that the ranks meet through the store and wire up their
    /// NIXL agents; no GPU used. In an elastic run each phase then runs
    /// --iters steps of the membership's agreement (8 by default).
    #[arg(long)]
    check_connection: bool,

    /// How the timed calls (ours and NCCL's) are launched: stream (one
    /// launch each, back to back) or graph (captured once into a CUDA graph
    /// per case, the graph launched; nccl-tests' -G). Run both to see what
    /// launches cost.
    #[arg(long, value_enum, default_value_t = Launch::Stream)]
    launch: Launch,

    /// Queue our calls by programmatic dependent launch (Hopper), where
    /// every rank has its own GPU: a call launches while the kernel before
    /// it ends, looks the peer windows up, then waits for it before it
    /// loads or stores, so back-to-back calls (the batch column) overlap a
    /// launch with a kernel's end. Without it each call launches once the
    /// kernel before it has ended. NCCL's calls are launched as NCCL
    /// launches them.
    #[arg(long)]
    pdl: bool,

    /// The memory-synchronization domain our calls (and the launch floor)
    /// are launched in (Hopper): CUDA's default, or the remote domain NCCL
    /// launches its kernels in on sm90, where a fence orders only that
    /// domain's traffic. Every call is launched in it (they signal and wait
    /// on each other); the fill and check kernels stay in the default one,
    /// ordered with the calls by the stream.
    #[arg(long, value_enum, default_value_t = SyncDomain::Default)]
    sync_domain: SyncDomain,

    /// Inputs: exact (small integers: every sum exact in bf16 and f32, every
    /// element must equal the reference) or random (uniform in [-1, 1),
    /// rounded to the type; a sum passes within 2·N·u·Σ|x| of the f32 sum in
    /// rank order, u = 2^-24 for f32 and 2^-8 for bf16, which any order of
    /// additions in the type meets, NCCL's included).
    #[arg(long, value_enum, default_value_t = DataMode::Exact)]
    data: DataMode,

    /// Skip NCCL's same-run calls.
    #[arg(long, alias = "no-baselines")]
    no_baseline: bool,

    #[command(flatten)]
    files: ResultFiles,

    /// Fault injection for tests: `corrupt=R` (rank R garbles one output element).
    #[arg(long, hide = true)]
    inject: Option<String>,

    #[command(flatten)]
    membership: ElasticArgs,

    // Below the flatten, so under its "Elastic runs" heading.
    /// Rounds of the sweep per phase, one step (--iters calls) per case
    /// each; a phase's first round is its warm-up (checked, not timed).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    rounds: u32,
}

fn main() -> ExitCode {
    nixl_examples::collectives::PROGRAM.main(Args::parse(), real_main)
}

fn real_main(args: Args) -> Result<ExitCode> {
    let timeout = args.timeout;
    let env = RankEnv::from_env(nixl_examples::collectives::PROGRAM)?;
    let plan = elastic_plan(&args, env.as_ref())?;
    let world = match &plan {
        Some(p) if env.is_none() => p.capacity(None)?,
        _ => RankEnv::world(env.as_ref(), args.ranks)?,
    };
    // Arguments that cannot work are refused before any network or GPU work.
    let cfg = match args.check_connection {
        true => None,
        false => Some(run_config(&args, world)?),
    };
    let Some(env) = env else {
        return launch_ranks(&args, world, plan.as_ref(), cfg.as_ref());
    };
    match cfg {
        Some(cfg) => {
            let out = Outputs {
                plan,
                gpus: args.gpus,
                json: args.files.json.clone(),
                csv: args.files.csv.clone(),
                tune: args.tune.clone(),
            };
            run::run(&env, &cfg, &out)?
        }
        None => member::check_connection(&env, plan.as_ref(), check(&args, timeout, &plan)?)?,
    }
    Ok(ExitCode::SUCCESS)
}

/// `--plan FILE` or `--elastic` (every rank, one phase): the elastic run's
/// plan; none in a fixed run. Errors: a plan collectives cannot run
/// ([`check_plan`](nixl_examples::collectives::elastic::check_plan)), or
/// one with joiners under torchrun.
fn elastic_plan(args: &Args, env: Option<&RankEnv>) -> Result<Option<Plan>, UsageError> {
    let plan = match (&args.membership.plan, args.membership.elastic) {
        (Some(f), _) => Plan::load(f)?,
        (None, true) => Plan::fixed(RankEnv::world(env, args.ranks)?),
        (None, false) => return Ok(None),
    };
    nixl_examples::collectives::elastic::check_plan(&plan)?;
    let torchrun = env.filter(|e| !e.launcher_store);
    if let Some(e) = torchrun.filter(|e| plan.len() != 1 || plan.members(0).len() as u32 != e.world)
    {
        return Err(UsageError(format!(
            "--plan {} under torchrun: torchrun starts every rank at once, so the plan is one phase of ranks 0..{} \
             (ranks that join later need collectives' own launcher: run without torchrun)",
            plan.to_json(),
            e.world - 1
        )));
    }
    Ok(Some(plan))
}

/// `--check-connection`'s membership: survive deaths in an elastic run,
/// with `--iters` steps of agreement, else fail on one (no steps).
fn check(args: &Args, timeout: Duration, plan: &Option<Plan>) -> Result<Check, UsageError> {
    let fault_timeout = args.membership.fault_timeout()?;
    let (on_death, steps) = match plan {
        Some(_) => (OnDeath::Survive, u64::from(args.iters)),
        None => (OnDeath::Fail, 0),
    };
    Ok(Check {
        timeout,
        fault_timeout,
        steps,
        step_work: args.membership.step_work(),
        on_death,
        inject: Inject::default(),
    })
}

/// Without RANK: start the ranks here (the plan's, in an elastic run) and
/// wait for them.
fn launch_ranks(
    args: &Args,
    world: u32,
    plan: Option<&Plan>,
    cfg: Option<&RunConfig>,
) -> Result<ExitCode> {
    let timeout = args.timeout;
    let port = if args.port == 0 {
        nixl_examples::ranks::launch::free_port()?
    } else {
        check_port_free(args.port)?;
        args.port
    };
    if !args.check_connection {
        // Once here, rather than the same message from every rank.
        run::check_machine()?;
    }
    let grace = timeout + Duration::from_secs(10);
    let Some(plan) = plan else {
        let program = nixl_examples::collectives::PROGRAM;
        let exits = launch::run_fixed(program, world, port, timeout, grace)?;
        return Ok(nixl_examples::launch::finish("collectives", &exits));
    };
    let kill_seed = args.membership.kill_seed();
    let opts = launch::LaunchOptions {
        program: nixl_examples::collectives::PROGRAM,
        capacity: world,
        port,
        kill_signal: args.membership.kill_signal,
        on_death: OnDeath::Survive,
        // --check-connection: its --iters steps of agreement.
        rounds_per_phase: cfg.map_or(u64::from(args.iters), |c| c.elastic_steps()),
        kill_seed,
        grace,
        timeout,
    };
    let exits = launch::run_plan(plan, &opts)?;
    let code = nixl_examples::launch::finish("collectives", &exits);
    let gone: Vec<String> = (exits.iter())
        .filter(|e| e.planned || e.survived)
        .map(|e| e.name.clone())
        .collect();
    if code == ExitCode::SUCCESS && !gone.is_empty() {
        nixl_examples::eline!(
            "[collectives] the run went on: {} process(es); gone, the others went on: {}",
            exits.len(),
            gone.join(", ")
        );
    }
    Ok(code)
}

/// The most calls per case a GPU run queues (`--iters`).
const MAX_CALLS: u32 = 200;

/// The run's configuration; what cannot work is a usage error.
fn run_config(args: &Args, ranks: u32) -> Result<RunConfig> {
    let corrupt_rank = match args.inject.as_deref() {
        None => None,
        Some(spec) => match spec.split_once('=') {
            Some(("corrupt", r)) => Some(r.parse::<u32>().ok().filter(|&r| r < ranks).ok_or_else(
                || {
                    UsageError(format!(
                        "--inject {spec}: expected corrupt=R with R below {ranks}"
                    ))
                },
            )?),
            _ => return Err(UsageError(format!("--inject {spec}: expected corrupt=R")).into()),
        },
    };
    if args.iters > MAX_CALLS {
        return Err(UsageError(format!(
            "--iters {}: at most {MAX_CALLS} calls per case (they are all queued before the GPU starts them)",
            args.iters
        ))
        .into());
    }
    let mut ops = args.op.clone();
    ops.dedup();
    let cfg = RunConfig {
        ranks,
        ops,
        algo: args.algo,
        paths: args.path.paths(Path::Store),
        dtypes: args.dtype.clone(),
        place: args.place,
        sizes: sizes(args.minbytes, args.maxbytes, args.stepfactor)?,
        iters: args.iters,
        warmup: args.warmup,
        timeout_ns: args.timeout.as_nanos() as u64,
        blocks: args.blocks,
        block_bytes: args.block_bytes,
        piece_bytes: args.piece_bytes,
        tuned: match &args.tuned {
            Some(f) => Some(TuneTable::read(f, ranks)?),
            None => None,
        },
        launch: args.launch,
        pdl: args.pdl,
        sync_domain: args.sync_domain,
        data: args.data,
        corrupt_rank,
        elastic: args.membership.elastic().then_some(Elastic {
            fault_timeout_ns: args.membership.fault_timeout()?.as_nanos() as u64,
            rounds: args.rounds,
        }),
        baseline: !args.no_baseline && !args.membership.elastic(),
    };
    cfg.validate()?;
    Ok(cfg)
}
