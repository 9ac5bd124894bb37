//! `pipeline`: a chain of N ranks whose kernels stream chunks to the next
//! stage through a ring of slots, with credits back, no CPU in the loop;
//! every byte verified at the end of the chain.
//!
//! ```text
//! pipeline --ranks 3                                  # starts 3 stages on this machine
//! pipeline --ranks 2 --path ll --chunk 8 --slots 1    # one 8-byte chunk at a time
//! pipeline --ranks 3 --check-connection               # no GPU: the stages meet and connect
//! ```

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Result;
use clap::Parser;
use nixl_examples::cli::{UsageError, check_port_free, parse_bytes, parse_timeout};
use nixl_examples::pipeline::PROGRAM;
use nixl_examples::pipeline::config::{Config, MAX_BATCH};
use nixl_examples::pipeline::kernels::{Level, Path};
use nixl_examples::pipeline::run::{self, Outputs};
use nixl_examples::ranks::RankEnv;
use nixl_examples::ranks::check::{Check, Inject};
use nixl_examples::ranks::membership::OnDeath;
use nixl_examples::ranks::plan::Plan;
use nixl_examples::results::ResultFiles;

/// A streaming pipeline the GPUs drive themselves, over NIXL's device API.
///
/// N ranks form a chain 0 -> 1 -> ... -> N-1 (one stage each). Stage 0's
/// kernel produces --chunks chunks; each middle stage's kernel receives a
/// chunk, maps every 32-bit word x to 3x + its stage number and forwards
/// it; the last stage's kernel verifies every word. Per link a ring of
/// --slots slots in the receiver's GPU memory, a ready word per slot that
/// the sender raises after the data (sequence numbers, never cleared), and
/// a credit word in the sender's memory that the receiver raises once it
/// consumed a slot: a slow stage (--slow-stage) holds its producer back,
/// and the report shows the wait and that no slot was overwritten. Paths:
/// put (nixlPut + nixlAtomicAdd, any UCX device transport), store (stores
/// through nixlGetPtr, NVLink or one GPU), ll (16-byte lines that carry
/// their own sequence number, no ready word), ll128 (128-byte lines of 120
/// payload bytes and a flag, eight lanes of a warp to a line: warp and
/// block level). Each chunk is cut into one slice per channel: a thread
/// block, warp or thread (--level).
///
/// Reported per case: the slowest link's and the end-to-end throughput
/// (GB/s = 1e9 B/s, GPU clock, warm-up excluded), one chunk's latency
/// through the chain (p50/p99), each stage's wait for credits, overwritten
/// slots, and two same-run baselines: the copy engine's device-to-device
/// copy of one chunk, and NCCL's ncclSend/ncclRecv through the same chain
/// (each middle stage forwards chunk c-1 while it receives chunk c, in one
/// NCCL group; no transform, no slow stage; the last stage checks the last
/// two chunks). NCCL runs where it loads (NCCL_LIB, or Python's
/// site-packages) and the ranks are on distinct GPUs; otherwise the report
/// says why.
///
/// Without RANK in the environment, `pipeline` starts --ranks processes
/// itself; under torchrun each process is one rank. Results go to stdout
/// (rank 0), progress to stderr. Exit status: 0 success, 1 failure, 2 bad
/// arguments, 3 wrong data.
#[derive(Parser, Debug)]
#[command(
    version,
    after_help = "Examples:\n  \
    pipeline --ranks 2 --chunk 1M --slots 8 --path store,put\n  \
    pipeline --ranks 3 --slow-stage 1 --delay-us 20 --chunks 20000\n  \
    pipeline --ranks 2 --path ll --chunk 8 --slots 1 --level warp\n  \
    pipeline --ranks 2 --path ll128,ll --chunk 64K --slots 4\n  \
    pipeline --ranks 3 --check-connection                   # no GPU needed\n\n\
    bench/run_pipeline.sh runs the usual matrix."
)]
struct Args {
    /// Stages (rank processes) to start on this machine (ignored under torchrun) [default: 2].
    #[arg(long, value_parser = clap::value_parser!(u32).range(2..=16))]
    ranks: Option<u32>,

    /// Payload bytes per chunk, comma-separated for one case each (K, M, G:
    /// powers of 1024); multiples of 16 (LL: 8).
    #[arg(long, value_delimiter = ',', default_value = "1M", value_parser = parse_bytes)]
    chunk: Vec<u64>,

    /// Slots per ring, comma-separated for one case each.
    #[arg(long, value_delimiter = ',', default_value = "8", value_parser = clap::value_parser!(u32).range(1..=4096))]
    slots: Vec<u32>,

    /// The most chunks one handshake covers (one barrier, one fence, one
    /// credit for all), comma-separated for one case each, 1 to 16, at
    /// most the slots [default: half the slots, at most 16; the LL and
    /// LL128 paths always 1].
    #[arg(long, value_delimiter = ',', value_parser = clap::value_parser!(u32).range(1..=MAX_BATCH as i64))]
    batch: Vec<u32>,

    /// Bytes of one slot [default: what one chunk needs; LL: 16 per 8 payload bytes, LL128: 128 per 120].
    #[arg(long, value_parser = parse_bytes)]
    slot_bytes: Option<u64>,

    /// Data paths, comma-separated.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = vec![Path::Store, Path::Put])]
    path: Vec<Path>,

    /// Levels: what one channel is (a thread, a warp, a block), comma-separated.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = vec![Level::Block])]
    level: Vec<Level>,

    /// Chunks per case, the warm-up included.
    #[arg(short = 'n', long, default_value_t = 2000, value_parser = clap::value_parser!(u64).range(2..))]
    chunks: u64,

    /// Untimed chunks at the start of each case.
    #[arg(short = 'w', long, default_value_t = 100)]
    warmup: u64,

    /// Blocks per stage [default: one per 16 KiB of chunk at block level,
    /// per 16 KiB × warps at warp level, 1 at thread level; at most the
    /// rank's share of the GPU's SMs]. A stage's blocks wait on its
    /// neighbours' blocks, so every rank's blocks must be resident on the
    /// GPU at once: a grid that cannot be exits 2 with the most that fit.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1024))]
    blocks: Option<u32>,

    /// Threads per block [default: 512 (store, ll, ll128) or 256 (put) at block level, 256 otherwise];
    /// ll128: a multiple of 32.
    #[arg(long, value_parser = clap::value_parser!(u32).range(32..=1024))]
    threads: Option<u32>,

    /// This stage sleeps --delay-us per chunk on the GPU.
    #[arg(long)]
    slow_stage: Option<u32>,

    /// The slow stage's delay per chunk, µs.
    #[arg(long, default_value_t = 0)]
    delay_us: u64,

    /// Seconds every GPU wait may take (a dead or frozen neighbour is named within it).
    #[arg(long, default_value = "10", value_parser = parse_timeout)]
    fault_timeout: Duration,

    /// Seconds any store wait may take, and each case on the host.
    #[arg(short, long, default_value = "120", value_parser = parse_timeout)]
    timeout: Duration,

    /// GPUs to use; rank r runs on GPU LOCAL_RANK mod gpus [default: all visible].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    gpus: Option<u32>,

    /// Store port when starting the ranks here (0: a free one).
    #[arg(long, default_value_t = 0)]
    port: u16,

    /// Only check that the stages meet through the store and wire up their
    /// NIXL agents; no GPU used.
    #[arg(long)]
    check_connection: bool,

    /// Skip the same-run baselines: the copy engine's copies and NCCL's send/recv chain.
    #[arg(long, alias = "no-baselines")]
    no_baseline: bool,

    #[command(flatten)]
    files: ResultFiles,

    /// Fault injection for tests: `corrupt=K` (stage K garbles a word of the first timed chunk).
    #[arg(long, hide = true)]
    inject: Option<String>,
}

fn main() -> ExitCode {
    PROGRAM.main(Args::parse(), real_main)
}

fn real_main(args: Args) -> Result<ExitCode> {
    let env = RankEnv::from_env(PROGRAM)?;
    let world = RankEnv::world(env.as_ref(), args.ranks)?;
    if world < 2 {
        return Err(UsageError(format!(
            "WORLD_SIZE={world}: a pipeline needs 2 stages at least"
        ))
        .into());
    }
    // Arguments that cannot work are refused before any network or GPU work.
    let cfg = match args.check_connection {
        true => None,
        false => Some(config(&args, world)?),
    };
    let Some(env) = env else {
        return launch(&args, world);
    };
    match cfg {
        Some(cfg) => {
            let out = Outputs {
                gpus: args.gpus,
                json: args.files.json.clone(),
                csv: args.files.csv.clone(),
                timeout: args.timeout,
            };
            run::run(&env, &cfg, &out)?
        }
        None => {
            let check = Check {
                timeout: args.timeout,
                fault_timeout: args.fault_timeout,
                steps: 0,
                step_work: Duration::from_millis(2),
                on_death: OnDeath::Fail,
                inject: Inject::default(),
            };
            nixl_examples::ranks::check::check_connection(&env, &Plan::fixed(env.world), check)?
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Without RANK: start the stages here and wait for them.
fn launch(args: &Args, world: u32) -> Result<ExitCode> {
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
    let grace = args.timeout.min(args.fault_timeout) + Duration::from_secs(10);
    let program = nixl_examples::pipeline::PROGRAM;
    let exits = nixl_examples::ranks::launch::run_fixed(program, world, port, args.timeout, grace)?;
    Ok(nixl_examples::launch::finish("pipeline", &exits))
}

/// `v` without repeats next to each other.
fn dedup<T: PartialEq + Clone>(v: &[T]) -> Vec<T> {
    let mut v = v.to_vec();
    v.dedup();
    v
}

/// The run's configuration; what cannot work is a usage error.
fn config(args: &Args, stages: u32) -> Result<Config, UsageError> {
    let corrupt_stage = match args.inject.as_deref() {
        None => None,
        Some(spec) => match spec.split_once('=').map(|(k, v)| (k, v.parse::<u32>())) {
            Some(("corrupt", Ok(k))) => Some(k),
            _ => return Err(UsageError(format!("--inject {spec}: expected corrupt=K"))),
        },
    };
    let cfg = Config {
        stages,
        chunk_sizes: dedup(&args.chunk),
        slots: dedup(&args.slots),
        batches: dedup(&args.batch),
        paths: dedup(&args.path),
        levels: dedup(&args.level),
        chunks: args.chunks,
        warmup: args.warmup,
        slot_bytes: args.slot_bytes,
        blocks: args.blocks,
        threads: args.threads,
        slow_stage: args.slow_stage,
        delay_us: args.delay_us,
        fault_timeout_ns: args.fault_timeout.as_nanos() as u64,
        corrupt_stage,
        baseline: !args.no_baseline,
    };
    cfg.validate()?;
    Ok(cfg)
}
