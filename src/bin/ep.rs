//! `ep`: expert-parallel (MoE) dispatch and combine between N ranks, one
//! process each, through NIXL's device API; verified and measured.
//!
//! ```text
//! ep --ranks 2 --mode ht                          # starts 2 ranks on this machine
//! torchrun --no-python --nproc-per-node=2 ep --mode ll
//! ep --ranks 3 --check-connection                 # no GPU: the ranks meet and connect
//! ep --plan tests/fixtures/elastic/expansion_fault_contraction.json --check-connection
//! ```

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Result;
use clap::Parser;
use nixl_examples::cli::{UsageError, check_port_free, parse_timeout};
use nixl_examples::ep::config::{Mode, PATHS, Path, PathChoice, RoutingKind, RunConfig, Shape};
use nixl_examples::ep::{PROGRAM, run};
use nixl_examples::gpu::path::refuse_missing;
use nixl_examples::launch::RoleExit;
use nixl_examples::ranks::args::ElasticArgs;
use nixl_examples::ranks::check::{self, Check, Inject};
use nixl_examples::ranks::env::RankEnv;
use nixl_examples::ranks::launch;
use nixl_examples::ranks::membership::OnDeath;
use nixl_examples::ranks::plan::Plan;
use nixl_examples::results::ResultFiles;

/// Expert-parallel (MoE) dispatch and combine between N ranks over NIXL's
/// device API.
///
/// One MoE step with DeepEP's semantics, on N ranks (one process each, on N
/// GPUs, or fewer GPUs shared round-robin): every rank holds --tokens
/// tokens of --hidden bf16 values, each routed to its --topk of --experts
/// experts (experts/ranks per rank). Dispatch sends each token once to
/// every rank hosting one of its experts, counts signalled after the data;
/// a known transform per expert stands in for the experts; combine sends
/// the outputs back and sums them at the origin. Every dispatched value is
/// checked bit for bit, every combined value within a stated bf16 bound
/// (docs/EP.md). Timing is GPU time per phase, p50/p99 over iterations.
///
/// Without RANK in the environment, `ep` is the launcher: it hosts the
/// store and starts --ranks rank processes, or the ranks of an elastic
/// --plan phase by phase; under torchrun (RANK, WORLD_SIZE, LOCAL_RANK,
/// MASTER_ADDR, MASTER_PORT set) each process is one rank. With
/// TORCHELASTIC_USE_AGENT_STORE=True the ranks join torchrun's store,
/// otherwise rank 0 hosts one.
///
/// Elastic runs (--plan FILE, or --elastic): any rank may die at any
/// moment and the survivors go on. The kernels mask a rank whose data does
/// not come within --fault-timeout, the survivors agree on who is gone
/// after every step, and every finished step is verified against the
/// mask; the report is per phase. A plan is upstream NIXL EP's format, a JSON list of phases, each a
/// list of ranks; -r means the launcher kills rank r at a random moment of
/// that phase (--kill-signal, --kill-seed; the rank is not told); a rank
/// absent from the next phase leaves cleanly; a rank id that comes back is
/// a new process. E.g. `[[0,1],[0,1,2,3],[0,1,-2,3],[0,3]]`: ranks 0 and 1;
/// 2 and 3 join; 2 is killed mid-phase and the survivors agree it is gone;
/// 1 leaves. Any rank may die, rank 0 too, by the plan or not (JSON reads
/// -0 as 0, so a plan cannot kill rank 0; kill it by pid). Buffers and
/// experts are sized once for --capacity ranks. Under torchrun only the
/// plan's first phase runs, and it must be exactly ranks 0..WORLD_SIZE-1.
///
/// Results go to stdout (rank 0), progress to stderr. Exit status: 0
/// success, 1 failure, 2 bad arguments, 3 wrong data.
#[derive(Parser, Debug)]
#[command(
    version,
    after_help = "Examples:\n  \
    ep --ranks 2 --mode ht --json ht.json          # EP2, high-throughput, both data paths\n  \
    ep --ranks 4 --gpus 2 --mode ll --path store     # 4 ranks sharing 2 GPUs (best under MPS)\n  \
    torchrun --no-python --nproc-per-node=2 $(which ep) --mode ll\n  \
    ep --ranks 3 --check-connection                # no GPU needed\n  \
    ep --plan plan.json --check-connection --kill-signal STOP   # elastic, no GPU\n  \
    ep --ranks 4 --elastic --mode ll --iters 20000  # any rank may die (kill one by pid): the others go on\n\n\
    A plan: [[0,1],[0,1,2,3],[0,1,-2,3],[0,3]] (tests/fixtures/elastic/ has upstream's four).\n\
    bench/run_ep.sh runs the usual matrix and writes tables and a plot."
)]
struct Args {
    /// ht: high-throughput (4096 tokens per rank); ll: low-latency (128 tokens).
    #[arg(long, value_enum, default_value_t = Mode::Ht)]
    mode: Mode,

    /// Tokens per rank [default: 4096 in ht, 128 in ll].
    #[arg(long)]
    tokens: Option<u32>,

    /// Hidden size, bf16 values per token; a multiple of 8 [default: 7168].
    #[arg(long)]
    hidden: Option<u32>,

    /// Experts per token [default: 8].
    #[arg(long)]
    topk: Option<u32>,

    /// Experts in all; a multiple of the number of ranks [default: 256].
    #[arg(long)]
    experts: Option<u32>,

    /// How tokens pick experts: uniform, or skewed (Zipf: low expert ids, so
    /// rank 0, get most tokens).
    #[arg(long, value_enum, default_value_t = RoutingKind::Uniform)]
    routing: RoutingKind,

    /// Data path: put (nixlPut + nixlAtomicAdd, any UCX device transport),
    /// store (nixlGetPtr + stores, NVLink), or both in turn.
    #[arg(long, value_enum, default_value_t = PathChoice::Both)]
    path: PathChoice,

    /// Timed iterations per path [default: 50 in ht, 200 in ll]; with
    /// --check-connection, steps of agreement per phase [default: 8 in an
    /// elastic run, else 0].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    iters: Option<u32>,

    /// Untimed warm-up iterations per path [default: 5 in ht, 20 in ll].
    #[arg(long)]
    warmup: Option<u32>,

    /// Seconds any wait may take: ranks joining, store keys, and every GPU
    /// spin-wait (a dead or silent rank is named within it).
    #[arg(short, long, default_value = "30", value_parser = parse_timeout)]
    timeout: Duration,

    /// Seed of the routing and of the data.
    #[arg(long, default_value_t = 1)]
    seed: u64,

    /// Rank processes to start on this machine (ignored under torchrun,
    /// where WORLD_SIZE says) [default: 2]. The same as the plan `[[0..N-1]]`.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=64), conflicts_with = "plan")]
    ranks: Option<u32>,

    /// The most ranks the run will ever have: buffers, views and the expert
    /// layout are sized once for it (1..=64) [default: the plan's largest
    /// rank + 1].
    #[arg(long)]
    capacity: Option<u32>,

    /// GPUs to use; rank r runs on GPU LOCAL_RANK mod gpus [default: all visible].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    gpus: Option<u32>,

    /// Thread blocks of the phase kernels [default: the GPU's SMs divided by
    /// the ranks sharing it].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=65535))]
    blocks: Option<u32>,

    /// High-throughput combine: warps of each 16-warp block that send while
    /// the others reduce from the start (for measuring the split) [default: 4 on
    /// the store path, 8 on the put path, 16 where ranks share a GPU].
    #[arg(long, hide = true, value_parser = clap::value_parser!(u32).range(1..=16))]
    combine_senders: Option<u32>,

    /// Store port when starting the ranks here (0: a free one).
    #[arg(long, default_value_t = 0)]
    port: u16,

    /// Only check that the ranks meet through the store and wire up their
    /// NIXL agents (load each other's metadata, connect); no GPU used. In an
    /// elastic run each phase then runs --iters steps of agreement.
    #[arg(long)]
    check_connection: bool,

    /// Also run every path's steps replayed from a CUDA graph (captured once
    /// per phase and path, no re-capture when the mask changes), beside the
    /// stream launches; the report adds the host's wall time per step of
    /// both.
    #[arg(long)]
    graph: bool,

    /// Skip the same-run NCCL all-to-all baseline.
    #[arg(long, alias = "no-baselines")]
    no_baseline: bool,

    /// simple_write's best put bandwidth at the same message size, GB/s:
    /// every row then shows its wire bandwidth over it (column ×put).
    #[arg(long, value_name = "GB/S")]
    ref_put_gbps: Option<f64>,

    #[command(flatten)]
    files: ResultFiles,

    /// Fault injection for tests: `hang-after-connect=R`, `die-before-connect=R`, `die-mid-dispatch=R`,
    /// `stall-at-step=R@K` (--check-connection: rank R stops at step K, its heartbeat going),
    /// `corrupt=dispatch|combine`.
    #[arg(long, hide = true)]
    inject: Option<String>,

    #[command(flatten)]
    membership: ElasticArgs,

    // Below the flatten, so under its "Elastic runs" heading.
    /// What a rank's death does: survive (the others mask it and go on;
    /// elastic runs), or fail (the run stops, every survivor naming it)
    /// [default: survive with --plan or --elastic, else fail].
    #[arg(long, value_enum, ignore_case = true)]
    on_death: Option<OnDeath>,
}

fn main() -> ExitCode {
    PROGRAM.main(Args::parse(), real_main)
}

fn real_main(args: Args) -> Result<ExitCode> {
    let timeout = args.timeout;
    let env = RankEnv::from_env(PROGRAM)?;
    let (plan, capacity) = plan_and_capacity(&args, env.as_ref())?;
    let fault_timeout = args.membership.fault_timeout()?;
    let on_death = on_death(&args, &plan)?;
    let inject = parse_inject(args.inject.as_deref(), capacity)?;
    // Arguments that cannot work are refused before any network or GPU work.
    let cfg = if args.check_connection {
        None
    } else {
        Some(run_config(&args, capacity, fault_timeout, on_death)?)
    };
    let Some(env) = env else {
        return launch_ranks(&args, &plan, capacity, on_death, cfg.as_ref());
    };
    if let Some(cfg) = cfg {
        let opts = nixl_examples::ep::setup::RunOptions {
            gpus: args.gpus,
            json: args.files.json.clone(),
            csv: args.files.csv.clone(),
            ref_put_gbps: args.ref_put_gbps,
            corrupt: inject.corrupt,
            die_mid_dispatch: inject.die_mid_dispatch,
        };
        run::run(&env, &plan, &cfg, &opts)?;
    } else {
        let check = Check {
            timeout,
            fault_timeout,
            steps: check_steps(&args, on_death),
            step_work: args.membership.step_work(),
            on_death,
            inject: inject.connect,
        };
        check::check_connection(&env, &plan, check)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// `--on-death`, or its default: survive in elastic runs (`--plan`,
/// `--elastic`), else fail. A plan that kills needs survive.
fn on_death(args: &Args, plan: &Plan) -> Result<OnDeath, UsageError> {
    let elastic = args.membership.elastic();
    let chosen = args.on_death.unwrap_or(match elastic {
        true => OnDeath::Survive,
        false => OnDeath::Fail,
    });
    let kills = (0..plan.len()).any(|i| !plan.killed(i).is_empty());
    if chosen == OnDeath::Fail && kills {
        return Err(UsageError(format!(
            "--on-death fail with a plan that kills ({}): its kills would stop the run; drop --on-death fail, or the \
             -r marks",
            plan.to_json()
        )));
    }
    Ok(chosen)
}

/// `--check-connection`'s steps of agreement per phase: `--iters`, or 8
/// in an elastic run, else none.
fn check_steps(args: &Args, on_death: OnDeath) -> u64 {
    let default = match on_death {
        OnDeath::Survive => 8,
        OnDeath::Fail => 0,
    };
    args.iters.map_or(default, u64::from)
}

/// The run's plan (`--plan`, or `--ranks N` as `[[0..N-1]]`) and capacity
/// (`--capacity`, checked against it). Under torchrun (not our launcher)
/// only the plan's first phase runs, and it must be ranks 0..WORLD_SIZE-1.
fn plan_and_capacity(args: &Args, env: Option<&RankEnv>) -> Result<(Plan, u32), UsageError> {
    let Some(file) = &args.membership.plan else {
        let world = RankEnv::world(env, args.ranks)?;
        if let Some(c) = args.capacity.filter(|&c| c != world) {
            return Err(UsageError(format!(
                "--capacity {c} without --plan: the capacity is the rank count ({world})"
            )));
        }
        return Ok((Plan::fixed(world), world));
    };
    let plan = Plan::load(file)?;
    let capacity = plan.capacity(args.capacity)?;
    match env {
        Some(e) if e.launcher_store => match e.world == capacity {
            true => Ok((plan, capacity)),
            false => Err(UsageError(format!(
                "WORLD_SIZE={} but the plan's capacity is {capacity}: start the ranks with `ep --plan`",
                e.world
            ))),
        },
        Some(e) => {
            let first = plan.phase(0);
            let want: Vec<u32> = (0..e.world).collect();
            let mut have = first.members.clone();
            have.sort_unstable();
            if have != want
                || !first.killed.is_empty()
                || args.capacity.is_some_and(|c| c != e.world)
            {
                return Err(UsageError(format!(
                    "under torchrun only the plan's first phase runs, and it must be ranks 0..{} with no kill (and \
                     --capacity, if given, WORLD_SIZE={}); it is {}: run elastic plans with `ep --plan`, which \
                     starts and kills the ranks",
                    e.world - 1,
                    e.world,
                    plan.to_json()
                )));
            }
            Ok((
                Plan::parse(&format!("[{:?}]", first.members)).expect("one valid phase"),
                e.world,
            ))
        }
        None => Ok((plan, capacity)),
    }
}

/// Without RANK: host the store, start the plan's ranks here and wait for
/// them. `cfg`: a GPU run's configuration (its steps per phase time the
/// plan's kills), none for `--check-connection`.
fn launch_ranks(
    args: &Args,
    plan: &Plan,
    capacity: u32,
    on_death: OnDeath,
    cfg: Option<&RunConfig>,
) -> Result<ExitCode> {
    let port = if args.port == 0 {
        launch::free_port()?
    } else {
        check_port_free(args.port)?;
        args.port
    };
    if !args.check_connection {
        // Once here, rather than the same message from every rank.
        nixl_examples::ep::run::check_machine(!args.no_baseline)?;
    }
    let rounds_per_phase = match cfg {
        Some(c) => c.runs().len() as u64 * u64::from(c.warmup + c.iters),
        None => check_steps(args, on_death),
    };
    let kill_seed = args.membership.kill_seed();
    // Survivors notice a failed rank within --timeout (GPU waits) or a few
    // seconds (heartbeats): let them say so before stopping them.
    let opts = launch::LaunchOptions {
        program: PROGRAM,
        capacity,
        port,
        kill_signal: args.membership.kill_signal,
        on_death,
        rounds_per_phase,
        kill_seed,
        grace: args.timeout + Duration::from_secs(10),
        timeout: args.timeout,
    };
    let exits = launch::run_plan(plan, &opts)?;
    let named = |f: fn(&RoleExit) -> bool| -> Vec<String> {
        exits
            .iter()
            .filter(|e| f(e))
            .map(|e| e.name.clone())
            .collect()
    };
    let (planned, survived) = (named(|e| e.planned), named(|e| e.survived));
    let code = nixl_examples::launch::finish("ep", &exits);
    if code == ExitCode::SUCCESS && !(planned.is_empty() && survived.is_empty()) {
        let list = |v: &[String]| match v.is_empty() {
            true => "none".to_string(),
            false => v.join(", "),
        };
        nixl_examples::eline!(
            "[ep] the run went on: {} process(es); killed as planned: {}; died unplanned, the others went on: {}",
            exits.len(),
            list(&planned),
            list(&survived)
        );
    }
    Ok(code)
}

struct Injected {
    connect: Inject,
    corrupt: Option<nixl_examples::ep::setup::Corrupt>,
    die_mid_dispatch: Option<u32>,
}

fn parse_inject(spec: Option<&str>, world: u32) -> Result<Injected, UsageError> {
    let mut out = Injected {
        connect: Inject::default(),
        corrupt: None,
        die_mid_dispatch: None,
    };
    let Some(spec) = spec else { return Ok(out) };
    let bad = || {
        UsageError(format!(
            "--inject {spec}: expected hang-after-connect=R, die-before-connect=R, die-mid-dispatch=R, \
             stall-at-step=R@K or corrupt=dispatch|combine"
        ))
    };
    match spec.split_once('=') {
        Some((what @ ("hang-after-connect" | "die-before-connect" | "die-mid-dispatch"), r)) => {
            let r: u32 = r.parse().map_err(|_| bad())?;
            if r >= world {
                return Err(bad());
            }
            match what {
                "hang-after-connect" => out.connect.hang_rank = Some(r),
                "die-before-connect" => out.connect.die_rank = Some(r),
                _ => out.die_mid_dispatch = Some(r),
            }
        }
        Some(("stall-at-step", at)) => {
            let (r, k) = at.split_once('@').ok_or_else(bad)?;
            let (r, k) = (
                r.parse::<u32>().map_err(|_| bad())?,
                k.parse::<u64>().map_err(|_| bad())?,
            );
            if r >= world {
                return Err(bad());
            }
            out.connect.stall_at = Some((r, k));
        }
        Some(("corrupt", "dispatch")) => {
            out.corrupt = Some(nixl_examples::ep::setup::Corrupt::Dispatch)
        }
        Some(("corrupt", "combine")) => {
            out.corrupt = Some(nixl_examples::ep::setup::Corrupt::Combine)
        }
        _ => return Err(bad()),
    }
    Ok(out)
}

/// The run's configuration from the arguments and the mode's defaults;
/// shapes that cannot work are usage errors.
fn run_config(
    args: &Args,
    ranks: u32,
    fault_timeout: Duration,
    on_death: OnDeath,
) -> Result<RunConfig> {
    let (t, h, k, e) = args.mode.default_shape();
    let (iters, warmup) = args.mode.default_iters();
    let shape = Shape {
        tokens: args.tokens.unwrap_or(t),
        hidden: args.hidden.unwrap_or(h),
        topk: args.topk.unwrap_or(k),
        experts: args.experts.unwrap_or(e),
        ranks,
    };
    let cfg = RunConfig {
        mode: args.mode,
        shape,
        routing: args.routing,
        paths: args.path.paths(Path::Put),
        iters: args.iters.unwrap_or(iters),
        warmup: args.warmup.unwrap_or(warmup),
        seed: args.seed,
        timeout_ns: args.timeout.as_nanos() as u64,
        fault_timeout_ns: fault_timeout.as_nanos() as u64,
        blocks: args.blocks,
        baseline: !args.no_baseline,
        combine_senders: args.combine_senders,
        graph: args.graph,
        on_death,
    };
    refuse_missing(nixl_examples::ep::PROGRAM.name, &PATHS, &cfg.paths)?;
    shape.validate(cfg.total_iterations())?;
    Ok(cfg)
}
