//! `simple_write` in one process: the target and the initiator run as two
//! threads that exchange metadata through an in-memory store, and the
//! initiator's kernel writes into the target's buffer through the device API.
//!
//! The Rust port of upstream's `simple_write_unified.cu` (NIXL PR #1259):
//! target on GPU 0 and initiator on GPU 1 when there are two GPUs, else both
//! on GPU 0. Same roles, same verification and timing as the two-process
//! `simple_write`; only the exchange differs.
//!
//! ```text
//! cargo run --release --example simple_write_unified -- --size 64M --level block
//! ```
//!
//! With NIXL 1.5.1's UCX (1.23) this cannot prepare its memory views: the
//! cuda_ipc transport, the only one with device-API support on a machine
//! without GPUDirect-capable NICs, refuses a peer in its own process, and the
//! error says so. The two-process `simple_write` is the working form.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Parser;
use nixl_examples::cli::{exit_status, parse_bytes, parse_timeout};
use nixl_examples::gpu::context::device_count;
use nixl_examples::gpu::kernels::{self, Level, WaitMode};
use nixl_examples::group::{Host, Member};
use nixl_examples::nixl::runtime;
use nixl_examples::simple_write::plan::RoundSpec;
use nixl_examples::simple_write::protocol::{INITIATOR, TARGET, roster};
use nixl_examples::simple_write::report::{self, Row};
use nixl_examples::simple_write::{initiator, target};
use nixl_examples::store::memory::MemoryStore;
use nixl_examples::{logging, say};

/// simple_write with both roles as threads of one process (in-memory store).
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// Bytes per iteration (K, M, G suffixes are powers of 1024).
    #[arg(short, long, default_value = "1M", value_parser = parse_bytes)]
    size: u64,
    /// Level(s), comma-separated; one round each.
    #[arg(short, long, value_enum, value_delimiter = ',', default_values_t = [Level::Thread, Level::Warp, Level::Block])]
    level: Vec<Level>,
    /// Timed iterations per round [default: as simple_write].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    iters: Option<u32>,
    /// Thread blocks [default: as simple_write].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=65535))]
    blocks: Option<u32>,
    /// The target's GPU [default: 0].
    #[arg(long, default_value_t = 0)]
    target_gpu: usize,
    /// The initiator's GPU [default: 1 when there are two GPUs, else 0].
    #[arg(long)]
    initiator_gpu: Option<usize>,
    /// How each side waits for the other (see simple_write --help).
    #[arg(long, value_enum, default_value_t = WaitMode::Auto)]
    wait: WaitMode,
    /// Seconds any wait may take.
    #[arg(short, long, default_value = "30", value_parser = parse_timeout)]
    timeout: Duration,
}

fn main() -> ExitCode {
    let args = Args::parse();
    logging::init("main");
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => exit_status("main", &e),
    }
}

fn run(args: &Args) -> Result<()> {
    kernels::availability().map_err(kernels::KernelsError::NotBuilt)?;
    let gpus = device_count()?;
    // Before the threads start: loading NIXL sets NIXL_PLUGIN_DIR.
    runtime::load()?;
    let initiator_gpu = args.initiator_gpu.unwrap_or(if gpus >= 2 { 1 } else { 0 });
    for g in [args.target_gpu, initiator_gpu] {
        if g >= gpus {
            bail!("GPU {g} does not exist: this machine has {gpus} GPU(s)");
        }
    }
    let timeout = args.timeout;
    say!(
        "[main] target on GPU {}, initiator on GPU {initiator_gpu}, one process",
        args.target_gpu
    );
    let store = Arc::new(MemoryStore::new(timeout));

    let target = {
        let store = store.clone();
        let cfg = target::TargetConfig {
            gpu: args.target_gpu,
            expected_size: None,
            timeout,
            wait: args.wait,
        };
        std::thread::Builder::new()
            .name("target".into())
            .spawn(move || target::run(&cfg, &member(store.as_ref(), TARGET, timeout)))?
    };
    let rounds = args
        .level
        .iter()
        .map(|&level| RoundSpec {
            path: nixl_examples::gpu::kernels::Path::Put,
            chunk: None,
            size: args.size,
            level,
            blocks: args.blocks,
            threads: None,
            warmup: None,
            iters: args.iters,
            pingpong: false,
        })
        .collect();
    let cfg = initiator::InitiatorConfig {
        gpu: initiator_gpu,
        rounds,
        seed: 0x5eed,
        timeout,
        baselines: false,
        wait: args.wait,
        corrupt: false,
        fence: nixl_examples::gpu::kernels::FenceScope::Auto,
    };
    let out = initiator::run(
        &cfg,
        &member(store.as_ref(), INITIATOR, timeout),
        &mut |_| {},
    );
    let target_result = target
        .join()
        .map_err(|_| anyhow::anyhow!("the target thread panicked"))?;
    let out = out.context("initiator")?;
    target_result.context("target")?;
    let rows: Vec<Row> = out.rounds.iter().map(Row::of).collect();
    say!("\n{}", report::table(&rows));
    say!("[main] ✓ both roles succeeded");
    Ok(())
}

/// A role as a member of the pair; this process hosts the store.
fn member(store: &dyn nixl_examples::store::Store, role: usize, timeout: Duration) -> Member<'_> {
    Member::new(
        store,
        roster(Host::Elsewhere("this process".into())),
        role,
        timeout,
    )
}
