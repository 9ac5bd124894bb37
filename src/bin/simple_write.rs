//! `simple_write`: a GPU kernel writes into another process's GPU memory
//! and raises a signal there, through NIXL's device API; no CPU in the data
//! path.
//!
//! Start the initiator first (it hosts the store), then the target, or let
//! one process run both:
//!
//! ```text
//! simple_write --mode initiator &
//! simple_write --mode target
//! simple_write --mode pair            # both roles as child processes
//! ```

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Result;
use clap::{Parser, ValueEnum};
use nixl_examples::cli::{self, StoreBackend};
use nixl_examples::cli::{
    UsageError, check_port_free, exit_status, fmt_bytes, parse_bytes, parse_timeout,
};
use nixl_examples::gpu::Gpu;
use nixl_examples::group::{Host, Member, Roster, join_store};
use nixl_examples::launch::{self, RoleSpec};
use nixl_examples::nixl::runtime;
use nixl_examples::simple_write::initiator_role::{self, InitiatorConfig};
use nixl_examples::simple_write::kernels::{FenceScope, Level, Path, WaitMode, WritePath};
use nixl_examples::simple_write::plan::{RoundSpec, odd_slots, size_sweep, slots_for};
use nixl_examples::simple_write::protocol::{self, Role};
use nixl_examples::simple_write::report::{self, Row, RunInfo};
use nixl_examples::simple_write::{connection, target_role};
use nixl_examples::store::{self, StoreError, StoreOptions};
use nixl_examples::{interrupt, logging, say};
use tracing::{info, warn};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Mode {
    /// Hosts the store, owns the source data, launches the write + signal kernels.
    Initiator,
    /// Exposes a data buffer and a signal, waits for them on the GPU, verifies.
    Target,
    /// Both roles as child processes of this one (it hosts the store on a
    /// free port): one command instead of two.
    Pair,
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
/// Results go to stdout; progress and diagnostics to stderr (RUST_LOG
/// filters them). Exit status: 0 success, 1 failure, 2 bad arguments,
/// 3 data mismatch.
#[derive(Parser, Debug)]
#[command(
    version,
    args_override_self = true,
    after_help = "Examples:\n  \
    simple_write --mode initiator & simple_write --mode target\n  \
    simple_write --mode pair --size 64M --level block --target-gpu 1\n  \
    simple_write -m pair -b 8 -e 256M --levels block --json out.json   # a bandwidth sweep\n  \
    simple_write -m pair --pingpong -b 8 -e 1M -f 8                  # latency\n\n\
    In containers set UCX_POSIX_USE_PROC_LINK=n, and give both processes a shared PID and IPC namespace \
    (CUDA IPC); scripts/run_simple_write.sh does the first for you."
)]
struct Args {
    /// Which side this process plays. Start the initiator first.
    #[arg(short, long, value_enum, default_value_t = Mode::Initiator)]
    mode: Mode,

    /// Bytes per iteration (K, M, G suffixes are powers of 1024). Set it on the
    /// initiator; the target takes the initiator's and refuses a different one.
    /// [default: 1M, or the sweep given by --min-size/--max-size]
    #[arg(short, long, value_parser = parse_bytes, conflicts_with_all = ["min_size", "max_size"])]
    size: Option<u64>,

    /// Sweep: smallest size (nccl-tests' -b) [default: 8].
    #[arg(short = 'b', long, value_parser = parse_bytes)]
    min_size: Option<u64>,

    /// Sweep: largest size (nccl-tests' -e) [default: 64M].
    #[arg(short = 'e', long, value_parser = parse_bytes)]
    max_size: Option<u64>,

    /// Sweep: each size is this many times the last (nccl-tests' -f).
    #[arg(short = 'f', long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(2..))]
    step_factor: u64,

    /// Level(s) of the collective put + signal, comma-separated; one round
    /// per size and level.
    #[arg(short, long, visible_alias = "levels", value_enum, value_delimiter = ',', default_values_t = Level::ALL)]
    level: Vec<Level>,

    /// How the kernel moves the data, comma-separated for one round each:
    /// nixlPut (any UCX device transport; the default and the teaching path),
    /// stores through the peer pointer from nixlGetPtr (NVLink/PCIe), or LL
    /// or LL128 lines that carry their own flag (NVLink or one GPU only;
    /// LL128 at warp and block level, where a warp stores a line at once:
    /// thread-level rounds are left out for it).
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [Path::Put])]
    path: Vec<Path>,

    /// Bytes per chunk when chunks are dealt round-robin to the groups, so
    /// that the groups work on neighbouring memory; 0 = one contiguous slice
    /// per group [default: 0]. On the LL128 path a chunk counts wire bytes:
    /// chunk/128 lines of 120 payload bytes each.
    #[arg(long, value_parser = parse_chunk)]
    chunk: Option<u64>,

    /// Latency instead of bandwidth: one group puts and signals, the target
    /// acknowledges each iteration before the next; reports round trips and
    /// half round trips (p50/p99/min/avg).
    #[arg(long)]
    pingpong: bool,

    /// Also measure the floor: a bare-flag ping-pong (no data) between the
    /// same two processes, printed as its own row; every ping-pong row then
    /// shows its ratio to it [default: on with --pingpong].
    #[arg(long, overrides_with = "no_floor")]
    floor: bool,

    /// No floor row (see --floor).
    #[arg(long, overrides_with = "floor")]
    no_floor: bool,

    /// Rotate through buffers of at least twice the L2 cache: iteration i
    /// reads and writes slot i mod N of the two sources and the destination,
    /// so rows that would fit in L2 measure HBM (the table's `from` column).
    /// Put and store paths; no baselines (their copies would come from L2).
    #[arg(long)]
    hbm: bool,

    /// Rotate through N slots of the size, as --hbm does but with the
    /// count given: the footprint of a ring of N slots (the pipeline
    /// program's --slots), to compare a ring's throughput at the same
    /// footprint. Made odd (N + 1 when N is even), so a stale slot cannot
    /// pass verification. Put and store paths; no baselines.
    #[arg(long, conflicts_with = "hbm", value_parser = clap::value_parser!(u32).range(1..=4096))]
    slots: Option<u32>,

    /// With --pingpong: also show where each round trip's time goes on the
    /// initiator (its SM clock, p50 ns): the message's data issued, the
    /// fence, the signal (nixlAtomicAdd on the put path), then the wait for
    /// the acknowledgement. Costs a few clock reads per round trip.
    #[arg(long)]
    breakdown: bool,

    /// Timed iterations per round [default: about a quarter second of data at
    /// each level's typical rate, 1..1000; 1000 round trips in --pingpong].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    iters: Option<u32>,

    /// Untimed warm-up iterations per round [default: iters/10, at least 1].
    #[arg(long)]
    warmup: Option<u32>,

    /// Thread blocks, each group putting its own slice on its own channel
    /// [default: block level: one per 16 KiB, at least 32, up to what fits
    /// the GPU at once (1 in --pingpong); thread and warp level: 1].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=65535))]
    blocks: Option<u32>,

    /// Threads per block [default: 1 thread, 32 warp level; block level: 256
    /// on the put path, 512 on the store path, 256 in --pingpong].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1024))]
    threads: Option<u32>,

    /// Skip the same-run baselines (copy engine, NIXL host-API WRITE).
    /// `--no-baselines` is accepted too.
    #[arg(long, alias = "no-baselines")]
    no_baseline: bool,

    /// GPU index [default: 0 for the initiator; 1 for the target when there are
    /// two or more GPUs, else 0].
    #[arg(short, long)]
    gpu: Option<usize>,

    /// --mode pair: the target's GPU [default: as --gpu's default for the target].
    #[arg(long)]
    target_gpu: Option<usize>,

    /// Store host (the target connects to it; the initiator listens on all interfaces).
    #[arg(long, default_value = "127.0.0.1")]
    host: String,

    /// Store port [default: 9998; --mode pair: a free port the OS picks].
    #[arg(short, long, value_parser = clap::value_parser!(u16).range(1..))]
    port: Option<u16>,

    /// Seconds any wait may take: the peer joining, keys, GPU spin-waits.
    #[arg(short, long, default_value = "30", value_parser = parse_timeout)]
    timeout: Duration,

    /// Store implementation.
    #[arg(long, value_enum, default_value_t = StoreBackend::Native)]
    store: StoreBackend,

    /// How this side waits for the other's signal: a spinning kernel, or a
    /// stream wait (cuStreamWaitValue64) that leaves the GPU free; auto picks
    /// stream when both processes share a GPU (they cannot run kernels at the
    /// same time, so a spinning kernel would hold it for whole time slices).
    #[arg(long, value_enum, default_value_t = WaitMode::Auto)]
    wait: WaitMode,

    /// Only check that the two processes reach each other: they meet through
    /// the store and wire up their NIXL agents (real keys, names and
    /// handshake), without any GPU. Give it to both sides.
    #[arg(long)]
    check_connection: bool,

    /// Scope of the release between data and signal on the put and store
    /// paths (initiator): auto = gpu when both processes use one GPU, else
    /// system; system everywhere, to measure what the narrower scope saves.
    #[arg(long, hide = true, default_value = "auto", value_parser = parse_fence)]
    fence_scope: FenceScope,

    /// Fault injection for testing: `corrupt-data` (initiator) flips one
    /// source byte so the target must report a mismatch (exit 3);
    /// `hang-after-connect` (--check-connection) stops the role once
    /// connected, heartbeat going, until it is stopped or killed (under
    /// --mode pair, both roles).
    #[arg(long, hide = true, value_parser = ["corrupt-data", "hang-after-connect"])]
    inject: Option<String>,

    /// Connect to a store hosted elsewhere instead of hosting it (--mode
    /// pair starts its roles this way: the pair's process hosts it).
    #[arg(long, hide = true)]
    store_client: bool,

    /// Also write every figure and the run's configuration as JSON (initiator).
    #[arg(long, value_name = "FILE")]
    json: Option<std::path::PathBuf>,

    /// Also write every figure as CSV, the configuration as `#` lines (initiator).
    #[arg(long, value_name = "FILE")]
    csv: Option<std::path::PathBuf>,
}

fn parse_chunk(s: &str) -> Result<u64, String> {
    if s == "0" {
        return Ok(0);
    }
    let v = parse_bytes(s)?;
    (v % 16 == 0).then_some(v).ok_or_else(|| {
        format!("--chunk {v} is not a multiple of 16 (chunks start 16-byte aligned)")
    })
}

fn parse_fence(s: &str) -> Result<FenceScope, String> {
    s.parse()
}

fn main() -> ExitCode {
    let args = Args::parse();
    let tag = match args.mode {
        Mode::Initiator => "initiator",
        Mode::Target => "target",
        Mode::Pair => "main",
    };
    logging::init(tag);
    match run(args) {
        Ok(code) => code,
        Err(e) => exit_status(tag, &e),
    }
}

fn run(args: Args) -> Result<ExitCode> {
    let timeout = args.timeout;
    // Arguments that cannot work, whatever the machine (exit 2).
    let rounds = match args.mode {
        Mode::Target => Vec::new(),
        _ => rounds(&args)?,
    };
    if args.mode == Mode::Pair {
        return run_pair(&args, timeout);
    }
    if args.mode == Mode::Initiator && !args.store_client {
        check_port_free(port(&args))?;
    }
    if args.check_connection {
        check_connection(&args, timeout)?;
        return Ok(ExitCode::SUCCESS);
    }
    let (gpu, _) = check_machine(&args)?;
    if args.mode == Mode::Initiator {
        check_fits(gpu, &rounds, baselines(&args))?;
    }
    let rt = runtime::load()?;
    info!("NIXL from {} ({})", rt.lib_dir.display(), rt.found_by);
    match args.mode {
        Mode::Initiator => run_initiator(&args, gpu, rounds, timeout)?,
        _ => run_target(&args, gpu, timeout)?,
    }
    Ok(ExitCode::SUCCESS)
}

fn port(args: &Args) -> u16 {
    args.port.unwrap_or(9998)
}

/// Checks everything local before touching the network, and reports every
/// problem at once, so a machine that cannot run this says so at once.
/// Returns the GPU this role uses (`--mode pair`: the initiator's) and how
/// many the machine has.
fn check_machine(args: &Args) -> Result<(usize, usize)> {
    let gpus = nixl_examples::machine::check("simple_write", String::new)?;
    let gpu = match (args.mode, args.gpu) {
        (_, Some(g)) => g,
        (Mode::Target, None) => default_target_gpu(gpus),
        _ => 0,
    };
    if gpu >= gpus {
        // The library's message, as a usage error (exit 2): opening the GPU
        // would say the same only after the role had started.
        let missing = nixl_examples::gpu::GpuError::BadIndex {
            index: gpu,
            count: gpus,
        };
        return Err(UsageError(missing.to_string()).into());
    }
    Ok((gpu, gpus))
}

fn default_target_gpu(gpus: usize) -> usize {
    if gpus >= 2 {
        return 1;
    }
    info!("note: one GPU visible, so both processes use GPU 0 (writes stay on one device)");
    0
}

fn run_initiator(args: &Args, gpu: usize, rounds: Vec<RoundSpec>, timeout: Duration) -> Result<()> {
    say!("[initiator] Starting...");
    if !args.store_client {
        info!(
            "hosting the store on port {}; waiting up to {timeout:?} for the target to join",
            port(args)
        );
    }
    let store = open_store(args, timeout)?;
    interrupt::install()?;
    let cfg = InitiatorConfig {
        gpu,
        rounds,
        seed: seed(),
        timeout,
        baselines: baselines(args),
        wait: args.wait,
        corrupt: args.inject.as_deref() == Some("corrupt-data"),
        fence: args.fence_scope,
        breakdown: args.breakdown,
    };
    // The floor round runs first, so each later line can show its ratio.
    let mut floor_ns = None;
    let mut print_round = |r: &_| {
        let mut row = Row::of(r);
        floor_ns = floor_ns.or(row.floor_ns());
        row.set_floor(floor_ns);
        say!("[initiator] Round {}: {}", row.round, row.line());
    };
    let member = member(args, store.as_ref(), Role::Initiator, timeout);
    let out = initiator_role::run(&cfg, &member, &mut print_round)?;
    let mut rows: Vec<Row> = out.rounds.iter().map(Row::of).collect();
    report::apply_floor(&mut rows);
    report::mark_cache(&mut rows, out.initiator_gpu.l2_bytes, out.same_gpu);
    say!("\n{}", report::table(&rows));
    if rows.iter().any(|r| r.baselines.copy_engine_gbps.is_some()) {
        say!("{}", report::baselines_note(&out));
    }
    if args.breakdown && out.wait == WaitMode::Stream {
        warn!(
            "--breakdown: nothing to split, the initiator waited with --wait stream (auto chose it); pass --wait kernel"
        );
    }
    let info = RunInfo::of(&out);
    if let Some(path) = &args.json {
        report::write_json(path, &info, &rows)?;
    }
    if let Some(path) = &args.csv {
        report::write_csv(path, &info, &rows)?;
    }
    Ok(())
}

fn run_target(args: &Args, gpu: usize, timeout: Duration) -> Result<()> {
    say!("[target] Starting...");
    let store = open_store(args, timeout)?;
    interrupt::install()?;
    let cfg = target_role::TargetConfig {
        gpu,
        expected_size: args.size,
        timeout,
        wait: args.wait,
    };
    target_role::run(&cfg, &member(args, store.as_ref(), Role::Target, timeout))
}

/// This role as a member of the pair's group.
fn member<'a>(
    args: &Args,
    store: &'a dyn store::Store,
    role: Role,
    timeout: Duration,
) -> Member<'a> {
    Member::new(store, roster(args), role.index(), timeout)
}

/// The pair: the initiator hosts the store, or under `--mode pair` the parent does.
fn roster(args: &Args) -> Roster {
    protocol::roster(match args.store_client {
        true => Host::Elsewhere("the `simple_write --mode pair` process".into()),
        false => Host::Member(protocol::INITIATOR),
    })
}

/// `--mode pair`: hosts the store on a free port, runs the initiator and
/// the target as child processes (this program again, with its own
/// arguments and then the role's, which override them), and exits as the
/// worse of the two.
fn run_pair(args: &Args, timeout: Duration) -> Result<ExitCode> {
    let gpus = match args.check_connection {
        true => None,
        // Once here, rather than the same message from both children.
        false => Some(check_machine(args)?.1),
    };
    let host_opts = StoreOptions {
        host: args.host.clone(),
        port: args.port.unwrap_or(0),
        is_server: true,
        num_workers: None,
        wait_workers: false,
        timeout,
    };
    let store = store::native::TcpStore::open(&host_opts).map_err(cli::store_error)?;
    info!(
        "hosting the store on port {}; starting initiator and target",
        store.port()
    );
    let roles = pair_roles(args, &store.port().to_string(), gpus).map(|(name, extra)| {
        RoleSpec::again(name, &extra.iter().map(String::as_str).collect::<Vec<_>>())
    });
    // A backstop only: every wait inside the roles is bounded by --timeout.
    let exits = launch::run_roles(Vec::from(roles), timeout * 4 + Duration::from_secs(60))?;
    drop(store);
    Ok(launch::finish("main", &exits))
}

/// What `--mode pair` appends to its own arguments for each child, which
/// then overrides them: the role, a client of the store at `port`, and the
/// target's GPU ([`pair_target_gpu`]; `gpus`: how many the machine has).
fn pair_roles(args: &Args, port: &str, gpus: Option<usize>) -> [(&'static str, Vec<String>); 2] {
    let role = |mode: &str| ["--mode", mode, "--store-client", "--port", port].map(String::from);
    let mut target = role("target").to_vec();
    if let Some(g) = pair_target_gpu(args, gpus) {
        target.extend(["--gpu".into(), g.to_string()]);
    }
    [
        ("initiator", role("initiator").to_vec()),
        ("target", target),
    ]
}

/// The `--gpu` that `--mode pair` gives its target, if any: `--target-gpu`;
/// else, when the pair's `--gpu` (the initiator's) would reach the target
/// too, the target's default on this machine of `gpus` GPUs (unknown, and
/// not needed, under `--check-connection`).
fn pair_target_gpu(args: &Args, gpus: Option<usize>) -> Option<usize> {
    match (args.target_gpu, args.gpu) {
        (Some(g), _) => Some(g),
        (None, Some(_)) => gpus.map(default_target_gpu),
        (None, None) => None,
    }
}

/// The store options both roles use: upstream's (numWorkers=2,
/// waitWorkers) with our --host/--port/--timeout. Under `--mode pair` the
/// parent hosts the store and both roles are plain clients.
fn store_options(args: &Args, timeout: Duration) -> StoreOptions {
    let hosts = args.mode == Mode::Initiator && !args.store_client;
    let mut opts = StoreOptions::two_process(hosts);
    if args.store_client {
        opts.wait_workers = false;
    }
    opts.host = args.host.clone();
    opts.port = port(args);
    opts.timeout = timeout;
    opts
}

/// `--check-connection`: the store and NIXL's agents, no GPU.
fn check_connection(args: &Args, timeout: Duration) -> Result<()> {
    runtime::load()?;
    let store = open_store(args, timeout)?;
    interrupt::install()?;
    let hang = args.inject.as_deref() == Some("hang-after-connect");
    match args.mode {
        Mode::Initiator => connection::initiator(
            &member(args, store.as_ref(), Role::Initiator, timeout),
            hang,
        ),
        _ => connection::target(&member(args, store.as_ref(), Role::Target, timeout), hang),
    }
}

/// Opens (initiator: hosts) the store, turning its errors into the
/// messages a user of this tool needs. A role that joins gets the group's
/// reply deadline for each answer, so an initiator that listens but is
/// frozen is named within seconds, not after --timeout.
fn open_store(args: &Args, timeout: Duration) -> Result<Box<dyn store::Store>> {
    let backend = args.store;
    let (host, port) = (&args.host, port(args));
    let opts = store_options(args, timeout);
    let roster = roster(args);
    let opened = match opts.is_server {
        true => backend.open(&opts),
        false => join_store(backend, &opts, roster.reply_deadline(timeout)),
    };
    opened.map_err(|e| match (args.mode, e) {
        (Mode::Initiator, e @ StoreError::Bind { .. }) => cli::store_error(e),
        (Mode::Initiator, StoreError::WorkersTimeout { .. }) => anyhow::anyhow!(
            "the target did not join the store on port {port} within {timeout:?}: start `simple_write --mode \
             target` (same --host/--port), or raise --timeout"
        ),
        (_, StoreError::Unreachable { .. }) if args.store_client => anyhow::anyhow!(
            "nothing listens at {host}:{port} after {timeout:?}: the `--mode pair` process that hosts the store exited"
        ),
        (Mode::Target, StoreError::Unreachable { .. }) => anyhow::anyhow!(
            "no initiator at {host}:{port} after {timeout:?}: nothing listens there. Start `simple_write --mode \
             initiator` first (it hosts the store), check --host/--port, or, if one is running, it was stopped \
             (SIGSTOP, a debugger) before it could listen"
        ),
        (_, StoreError::Unreachable { .. }) => anyhow::Error::new(UsageError(format!(
            "the initiator hosts the store, but cannot reach it at {host}:{port}: --host must be an address of \
             this machine (e.g. 127.0.0.1 or 0.0.0.0)"
        ))),
        (_, e @ StoreError::NoReply { .. }) => anyhow::anyhow!("{}", roster.host_silent(&e)),
        (_, e) => cli::store_error(e).context(format!("opening the store at {host}:{port}")),
    })
}

/// [`initiator_role::check_fits`] for the largest round, as a usage error:
/// before any network wait, so a size the GPU cannot hold fails at once.
fn check_fits(gpu: usize, rounds: &[RoundSpec], baselines: bool) -> Result<()> {
    let gpu = Gpu::open(gpu)?;
    let l2 = gpu.info()?.l2_bytes;
    // What each source spans (Round::span): the size, or with --hbm its slots.
    let stride = |r: &RoundSpec| r.size.max(1).next_multiple_of(256);
    let span = |r: &RoundSpec| match (r.slots, r.hbm) {
        (Some(n), _) => odd_slots(n) as u64 * stride(r),
        (None, true) => slots_for(r.size, l2) as u64 * stride(r),
        (None, false) => r.size,
    };
    let max = rounds.iter().map(span).max().unwrap_or(0);
    initiator_role::check_fits(&gpu, max, baselines).map_err(|e| UsageError(e.to_string()).into())
}

/// Whether rounds measure the copy engine and NIXL's WRITE beside them:
/// not with --no-baseline, nor with --hbm or --slots (their copies would
/// not rotate).
fn baselines(args: &Args) -> bool {
    !args.no_baseline && !args.hbm && args.slots.is_none()
}

/// The rounds asked for: every size of the sweep (or the one --size) at
/// every level, smallest size first. Combinations that cannot work are
/// usage errors.
fn rounds(args: &Args) -> Result<Vec<RoundSpec>> {
    check_grid_args(args)?;
    let sizes = sizes(args)?;
    check_thread_level_fits(args, &sizes)?;
    if args.mode == Mode::Initiator {
        let names = |v: Vec<String>| v.join(" ");
        info!(
            "plan: sizes {}, levels {}, paths {}{}",
            names(sizes.iter().map(|&s| fmt_bytes(s)).collect()),
            names(args.level.iter().map(|l| l.name().to_string()).collect()),
            names(args.path.iter().map(|p| p.name().to_string()).collect()),
            if args.pingpong { ", ping-pong" } else { "" }
        );
    }
    let mut specs = Vec::new();
    if wants_floor(args) {
        // A bare flag each way, one thread: what the hardware needs for a
        // message of nothing, between the same two processes and GPUs.
        specs.push(RoundSpec {
            size: 0,
            level: Level::Thread,
            path: WritePath::Flag,
            chunk: None,
            blocks: None,
            threads: None,
            warmup: args.warmup,
            iters: args.iters,
            pingpong: true,
            hbm: false,
            slots: None,
        });
    }
    for &size in &sizes {
        for &level in &args.level {
            for &path in &args.path {
                if !level_writes(level, path) {
                    continue;
                }
                specs.push(RoundSpec {
                    size,
                    level,
                    path: path.into(),
                    chunk: args.chunk,
                    blocks: args.blocks,
                    threads: args.threads,
                    warmup: args.warmup,
                    iters: args.iters,
                    pingpong: args.pingpong,
                    hbm: args.hbm,
                    slots: args.slots,
                });
            }
        }
    }
    Ok(specs)
}

/// Whether any round runs at thread level (LL128's never do).
fn runs_at_thread_level(args: &Args) -> bool {
    args.level.contains(&Level::Thread) && args.path.iter().any(|&p| level_writes(Level::Thread, p))
}

/// Whether `path` runs at `level`: LL128's lines are written by eight
/// lanes of one warp store, which one thread alone cannot do.
fn level_writes(level: Level, path: Path) -> bool {
    !(level == Level::Thread && path == Path::Ll128)
}

/// `--floor`, on by default with `--pingpong`, off with `--no-floor`.
fn wants_floor(args: &Args) -> bool {
    !args.no_floor && (args.floor || args.pingpong)
}

fn check_grid_args(args: &Args) -> Result<()> {
    let usage = |msg: String| -> anyhow::Error { UsageError(msg).into() };
    if let Some(t) = args.threads {
        if let Some(l) = args
            .level
            .iter()
            .find(|l| **l != Level::Thread && t % 32 != 0)
        {
            return Err(usage(format!(
                "--threads {t} with {l} level: warp and block level calls are made by whole warps, so --threads \
                 must be a multiple of 32"
            )));
        }
    }
    if args.breakdown && (!args.pingpong || args.wait == WaitMode::Stream) {
        return Err(usage(
            "--breakdown splits a ping-pong kernel's round trips: it needs --pingpong, and --wait kernel (the \
             default; with --wait stream the host times each launch)"
                .into(),
        ));
    }
    if args.pingpong && args.blocks.is_some_and(|b| b > 1) {
        return Err(usage(
            "--pingpong times one group's round trips: it runs one block, so drop --blocks".into(),
        ));
    }
    let rotates = args.hbm || args.slots.is_some();
    let polled = args
        .path
        .iter()
        .find(|p| matches!(p, Path::Ll | Path::Ll128));
    if let Some(p) = polled.filter(|_| rotates) {
        return Err(usage(format!(
            "--hbm and --slots rotate the put and store paths only: an {p} target finds the data by polling it, and \
             would have to poll every slot; drop {p} from --path"
        )));
    }
    if args.path.contains(&Path::Ll128) && args.level.iter().all(|&l| !level_writes(l, Path::Ll128))
    {
        return Err(usage(
            "--path ll128 at thread level: an LL128 line is written by eight lanes of one warp store, which one \
             thread cannot do; use --level warp or block"
                .into(),
        ));
    }
    Ok(())
}

fn sizes(args: &Args) -> Result<Vec<u64>> {
    Ok(match (args.size, args.min_size, args.max_size) {
        (Some(s), _, _) => vec![s],
        (None, None, None) => vec![1 << 20],
        (None, b, e) => {
            let (b, e) = (b.unwrap_or(8), e.unwrap_or(64 << 20));
            if b > e {
                return Err(
                    UsageError(format!("--min-size {b} is larger than --max-size {e}")).into(),
                );
            }
            size_sweep(b, e, args.step_factor)
        }
    })
}

/// One thread copies about 25 MB/s (measured across NVLink and on one
/// GPU): past a quarter of the timeout per iteration it is no longer a
/// measurement.
fn check_thread_level_fits(args: &Args, sizes: &[u64]) -> Result<()> {
    let thread_max = (args.timeout.as_secs_f64() / 4.0 * 25e6) as u64;
    match sizes.iter().find(|&&s| s > thread_max) {
        Some(&too_big) if runs_at_thread_level(args) => Err(UsageError(format!(
            "size {} at thread level: one thread copies about 25 MB/s, so one iteration would take ~{:.0} s of a \
             {:.0} s timeout; use --level warp,block for this size, or raise --timeout",
            fmt_bytes(too_big),
            too_big as f64 / 25e6,
            args.timeout.as_secs_f64()
        ))
        .into()),
        _ => Ok(()),
    }
}

/// A fresh seed per run: time and pid.
fn seed() -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    t ^ ((std::process::id() as u64) << 32)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Child `role` (0 initiator, 1 target) of `simple_write <pair>` on a
    /// machine of `gpus` GPUs: its arguments parsed as it parses them.
    fn child(pair: &[&str], role: usize, gpus: Option<usize>) -> Args {
        let argv = || std::iter::once("simple_write").chain(pair.iter().copied());
        let (_, extra) = &pair_roles(&Args::parse_from(argv()), "4242", gpus)[role];
        Args::parse_from(argv().chain(extra.iter().map(String::as_str)))
    }

    #[test]
    fn pair_children_take_their_role_a_store_client_and_the_rest_of_the_pairs_flags() {
        let pair = [
            "-m",
            "pair",
            "-p",
            "7",
            "-g",
            "3",
            "--target-gpu",
            "5",
            "-s",
            "1M",
            "--wait",
            "stream",
            "--json",
            "x.json",
            "--timeout",
            "9",
        ];
        for (role, mode, gpu) in [(0, Mode::Initiator, 3), (1, Mode::Target, 5)] {
            let c = child(&pair, role, Some(8));
            assert_eq!(
                (c.mode, c.port, c.store_client, c.gpu),
                (mode, Some(4242), true, Some(gpu))
            );
            assert_eq!(
                (c.size, c.wait, c.timeout),
                (Some(1 << 20), WaitMode::Stream, Duration::from_secs(9))
            );
            assert_eq!(c.json.as_deref(), Some(std::path::Path::new("x.json")));
        }
    }

    #[test]
    fn the_pairs_gpu_is_the_initiators_and_the_target_keeps_its_default() {
        let gpu = |pair: &[&str], gpus| child(pair, 1, gpus).gpu;
        assert_eq!(gpu(&["-m", "pair", "-g", "3"], Some(8)), Some(1));
        assert_eq!(gpu(&["-m", "pair", "-g", "3"], Some(1)), Some(0));
        assert_eq!(gpu(&["-m", "pair"], Some(8)), None);
        assert_eq!(child(&["-m", "pair"], 0, Some(8)).gpu, None);
        // --check-connection uses no GPU, so the count is not known.
        assert_eq!(
            gpu(&["-m", "pair", "-g", "3", "--check-connection"], None),
            Some(3)
        );
    }
}
