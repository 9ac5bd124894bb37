//! `simple_write`: a GPU kernel writes into another process's GPU memory
//! and raises a signal there, through NIXL's device API; no CPU in the data
//! path.
//!
//! Start the initiator first (it hosts the store), then the target:
//!
//! ```text
//! simple_write --mode initiator &
//! simple_write --mode target
//! ```

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Parser, ValueEnum};
use nixl_examples::cli::{fmt_bytes, parse_bytes};
use nixl_examples::gpu::context::device_count;
use nixl_examples::gpu::kernels::{self, Level};
use nixl_examples::nixl::runtime;
use nixl_examples::report::{DataMismatch, EXIT_MISMATCH, RoundResult};
use nixl_examples::roles::plan::{Round, RunPlan, auto_iters};
use nixl_examples::roles::{initiator, target};
use nixl_examples::say;
use nixl_examples::store::{self, StoreBackend, StoreOptions};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Mode {
    /// Hosts the store, owns the source data, launches the write + signal kernels.
    Initiator,
    /// Exposes a data buffer and a signal, waits for them on the GPU, verifies.
    Target,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum StoreKind {
    /// The Rust TCPStore (torch's c10d wire protocol).
    Native,
    /// torch's own c10d::TCPStore (binary built with --features libtorch).
    Libtorch,
}

/// GPU-initiated write + signal between two processes through NIXL's device API.
///
/// The initiator's kernel puts a buffer into the target's GPU memory with
/// `nixlPut` and bumps an 8-byte signal there with `nixlAtomicAdd`, at
/// thread, warp or block level. The target's kernel waits for the signal,
/// acknowledges it back, and every byte is verified. Agent metadata and
/// descriptors travel through a PyTorch-compatible TCPStore that the
/// initiator hosts.
///
/// Results go to stdout; progress and diagnostics to stderr. Exit status:
/// 0 success, 1 failure, 2 bad arguments, 3 data mismatch.
#[derive(Parser, Debug)]
#[command(version, after_help = "Examples:\n  \
    simple_write --mode initiator & simple_write --mode target\n  \
    simple_write -m initiator --size 64M --level block --blocks 132 & simple_write -m target\n\n\
    In containers set UCX_POSIX_USE_PROC_LINK=n, and give both processes a shared PID and IPC namespace \
    (CUDA IPC); scripts/run_simple_write.sh does the first for you.")]
struct Args {
    /// Which side this process plays. Start the initiator first.
    #[arg(short, long, value_enum, default_value_t = Mode::Initiator)]
    mode: Mode,

    /// Bytes per iteration (K, M, G suffixes are powers of 1024). Set it on the
    /// initiator; the target takes the initiator's and refuses a different one.
    #[arg(short, long, value_parser = parse_bytes)]
    size: Option<u64>,

    /// Level(s) of the collective put + signal, comma-separated; one round each.
    #[arg(short, long, value_enum, value_delimiter = ',', default_values_t = [Level::Thread, Level::Warp, Level::Block])]
    level: Vec<Level>,

    /// Timed iterations per round [default: as many as fit about a second at
    /// each level's typical speed, at most 100].
    #[arg(long)]
    iters: Option<u32>,

    /// Untimed warm-up iterations per round [default: iters/10, at least 1].
    #[arg(long)]
    warmup: Option<u32>,

    /// Thread blocks; each group of threads puts its own slice on its own channel.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=65535))]
    blocks: u32,

    /// Threads per block [default: 1 for thread, 32 for warp, 1024 for block level].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1024))]
    threads: Option<u32>,

    /// GPU index [default: 0 for the initiator; 1 for the target when there are
    /// two or more GPUs, else 0].
    #[arg(short, long)]
    gpu: Option<usize>,

    /// Store host (the target connects to it; the initiator listens on all interfaces).
    #[arg(long, default_value = "127.0.0.1")]
    host: String,

    /// Store port.
    #[arg(short, long, default_value_t = 9998, value_parser = clap::value_parser!(u16).range(1..))]
    port: u16,

    /// Seconds any wait may take: the peer joining, keys, GPU spin-waits.
    #[arg(short, long, default_value_t = 30.0, value_parser = parse_timeout)]
    timeout: f64,

    /// Store implementation.
    #[arg(long, value_enum, default_value_t = StoreKind::Native)]
    store: StoreKind,

    /// Also write one JSON object per round to this file (initiator).
    #[arg(long, value_name = "FILE")]
    json: Option<std::path::PathBuf>,
}

fn parse_timeout(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|_| format!("'{s}' is not a number of seconds"))?;
    if !(v > 0.0 && v <= 86_400.0) {
        return Err("timeout must be between 0 and 86400 seconds".into());
    }
    Ok(v)
}

fn main() -> ExitCode {
    let args = Args::parse();
    let tag = match args.mode {
        Mode::Initiator => "initiator",
        Mode::Target => "target",
    };
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            if let Some(m) = e.downcast_ref::<DataMismatch>() {
                eprintln!("[{tag}] error: {m}");
                return ExitCode::from(EXIT_MISMATCH as u8);
            }
            eprintln!("[{tag}] error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: Args) -> Result<()> {
    let timeout = Duration::from_secs_f64(args.timeout);
    // Check everything local before touching the network, and report every
    // problem at once, so a machine that cannot run this says so at once.
    let mut problems = Vec::new();
    if let Err(why) = kernels::availability() {
        problems.push(kernels::KernelsError::NotBuilt(why).to_string());
    }
    let gpus = match device_count() {
        Ok(n) => n,
        Err(e) => {
            problems.push(e.to_string());
            0
        }
    };
    if let Err(e) = runtime::load() {
        problems.push(e.to_string());
    }
    if !problems.is_empty() {
        anyhow::bail!("this machine cannot run simple_write:\n  - {}", problems.join("\n  - "));
    }
    let gpu = match (args.mode, args.gpu) {
        (_, Some(g)) => g,
        (Mode::Initiator, None) => 0,
        (Mode::Target, None) if gpus >= 2 => 1,
        (Mode::Target, None) => {
            eprintln!("[target] note: one GPU visible, so both processes use GPU 0 (writes stay on one device)");
            0
        }
    };
    if gpu >= gpus {
        anyhow::bail!("--gpu {gpu} does not exist: this machine has {gpus} GPU(s), numbered 0..{gpus}");
    }
    let rt = runtime::load()?;
    eprintln!("[{}] NIXL from {} ({})", if args.mode == Mode::Initiator { "initiator" } else { "target" }, rt.lib_dir.display(), rt.found_by);

    let backend = match args.store {
        StoreKind::Native => StoreBackend::Native,
        StoreKind::Libtorch => StoreBackend::Libtorch,
    };
    let mut opts = StoreOptions::two_process(args.mode == Mode::Initiator);
    opts.host = args.host.clone();
    opts.port = args.port;
    opts.timeout = timeout;

    match args.mode {
        Mode::Initiator => {
            let plan = plan(&args, timeout);
            say!("[initiator] Starting...");
            eprintln!("[initiator] hosting the store on port {}; waiting up to {timeout:?} for the target to join", args.port);
            let store = store::open(backend, &opts).context("opening the store (as its host)")?;
            let results = initiator::run(&initiator::InitiatorConfig { gpu, plan }, store.as_ref())?;
            for r in &results {
                say!("[initiator] Round {}: {}", r.round, r.line());
            }
            if let Some(path) = &args.json {
                write_json(path, &results)?;
            }
        }
        Mode::Target => {
            say!("[target] Starting...");
            let store = store::open(backend, &opts)
                .with_context(|| format!("joining the initiator's store at {}:{}", args.host, args.port))?;
            target::run(&target::TargetConfig { gpu, expected_size: args.size, timeout }, store.as_ref())?;
        }
    }
    Ok(())
}

fn plan(args: &Args, timeout: Duration) -> RunPlan {
    let size = args.size.unwrap_or(1 << 20);
    let rounds = args
        .level
        .iter()
        .map(|&level| {
            let iters = args.iters.unwrap_or_else(|| auto_iters(size, level, args.blocks));
            Round {
                size,
                level,
                blocks: args.blocks,
                threads: args.threads.unwrap_or(level.default_threads()),
                warmup: args.warmup.unwrap_or((iters / 10).max(1)),
                iters,
            }
        })
        .collect();
    eprintln!("[initiator] plan: {} per iteration, levels {:?}", fmt_bytes(size), args.level.iter().map(|l| l.name()).collect::<Vec<_>>());
    RunPlan { seed: seed(), timeout, rounds }
}

/// A fresh seed per run: time and pid, mixed by the pattern's hash.
fn seed() -> u64 {
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0);
    t ^ ((std::process::id() as u64) << 32)
}

fn write_json(path: &std::path::Path, results: &[RoundResult]) -> Result<()> {
    let body: String = results.iter().map(|r| r.json() + "\n").collect();
    std::fs::write(path, body).with_context(|| format!("writing {}", path.display()))
}
