//! NIXL's device API in one sitting: a kernel in one process writes a
//! buffer into another process's GPU memory and raises a signal there; the
//! other process's kernel waits for the signal; no CPU in the data path.
//!
//! The host's part, in order: CUDA first (UCX looks for it when the agent's
//! backend starts), register the GPU buffers with a NIXL agent, swap agent
//! metadata and descriptor lists through a store, prepare memory views
//! (device-side handles of local and remote buffers), launch. The kernels
//! are in `cuda/put_and_signal.cu`; KERNEL_GUIDE.md explains them.
//!
//! ```text
//! cargo run --release --example put_and_signal                 # both roles, as child processes
//! cargo run --release --example put_and_signal -- --path store # stores through nixlGetPtr instead of nixlPut
//! ```
//! Exit status: 0 verified, 1 failure, 3 wrong data.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use clap::{Parser, ValueEnum};
use cudarc::driver::{CudaModule, LaunchConfig, PushKernelArg};
use nixl_examples::cli::{DataMismatch, exit_status, parse_bytes, parse_timeout, store_error};
use nixl_examples::gpu::module::{Fatbin, load};
use nixl_examples::gpu::path::{Path, refuse_missing};
use nixl_examples::gpu::{DeviceBuffer, Gpu};
use nixl_examples::launch::{self, RoleSpec};
use nixl_examples::nixl::agent::create_ucx_agent;
use nixl_examples::nixl::serdes::{Desc, DescList, MemType};
use nixl_examples::nixl::view::MemViewElem;
use nixl_examples::nixl::view::{load_peer, prep_local, prep_remote};
use nixl_examples::store::{Store, StoreOptions, native::TcpStore};
use nixl_examples::{logging, pattern, say};
use nixl_sys::MemView;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Role {
    Initiator,
    Target,
}

/// GPU-initiated write + signal between two processes, the smallest complete program.
#[derive(Parser, Debug)]
#[command(version, args_override_self = true)]
struct Args {
    /// Run one role only (the store must be up at --port); without it, this
    /// process hosts the store and runs both roles as child processes.
    #[arg(long, value_enum)]
    role: Option<Role>,
    /// Bytes to write (a multiple of 16).
    #[arg(long, default_value = "64M", value_parser = bytes16)]
    size: u64,
    /// Thread blocks of the initiator's kernel; each writes its own slice.
    #[arg(long, default_value_t = 132)]
    blocks: u32,
    #[arg(long, value_enum, default_value_t = Path::Put)]
    path: Path,
    /// GPU of this role [default: initiator 0; target 1 when there are two GPUs].
    #[arg(long)]
    gpu: Option<usize>,
    /// Store port (with --role).
    #[arg(long, default_value_t = 9997)]
    port: u16,
    /// Seconds any wait may take.
    #[arg(short, long, default_value = "30", value_parser = parse_timeout)]
    timeout: Duration,
}

/// The paths this example's two kernels take (`cuda/put_and_signal.cu`);
/// `--path ll` is refused (exit 2).
const PATHS: [Path; 2] = [Path::Put, Path::Store];

const SEED: u64 = 0x1eaf;

/// A byte count that is a multiple of 16 (the stores are 16 bytes wide).
fn bytes16(s: &str) -> Result<u64, String> {
    let v = parse_bytes(s)?;
    (v % 16 == 0)
        .then_some(v)
        .ok_or_else(|| format!("{v} is not a multiple of 16"))
}

fn timeout(a: &Args) -> Duration {
    a.timeout
}

fn main() -> ExitCode {
    let args = Args::parse();
    let who = match args.role {
        None => "main",
        Some(Role::Target) => "target",
        Some(Role::Initiator) => "initiator",
    };
    logging::init(who);
    let result = refuse_missing("put_and_signal", &PATHS, &[args.path])
        .map_err(Into::into)
        .and_then(|()| match args.role {
            None => run_both(&args),
            Some(Role::Target) => target(&args),
            Some(Role::Initiator) => initiator(&args),
        });
    result.unwrap_or_else(|e| exit_status(who, &e))
}

/// Hosts the store on a free port and runs target and initiator as
/// children: this program again, with our arguments plus the role's.
fn run_both(a: &Args) -> Result<ExitCode> {
    let store = TcpStore::open(&StoreOptions::server(0, timeout(a))).map_err(store_error)?;
    let target_gpu = (nixl_examples::gpu::context::device_count()? >= 2) as usize;
    let port = store.port().to_string();
    let role = |name: &str, gpu: usize| {
        RoleSpec::again(
            name,
            &["--role", name, "--gpu", &gpu.to_string(), "--port", &port],
        )
    };
    let roles = vec![role("target", target_gpu), role("initiator", 0)];
    let exits = launch::run_roles(roles, timeout(a) * 3)?;
    if exits.iter().all(|e| e.code == 0) {
        say!(
            "[main] ✓ a GPU kernel wrote {} bytes into another process's GPU",
            a.size
        );
    }
    Ok(launch::finish("main", &exits))
}

/// Exposes a data buffer and a signal, waits on the GPU, verifies.
fn target(a: &Args) -> Result<ExitCode> {
    let store = TcpStore::open(&StoreOptions::client("127.0.0.1", a.port, timeout(a)))
        .map_err(store_error)?;
    let gpu = Gpu::open(a.gpu.unwrap_or(0))?;
    let kernels = load(&gpu.ctx, Fatbin::PutAndSignal)?;
    let data = DeviceBuffer::zeroed(&gpu.ctx, a.size as usize)?;
    let signal = DeviceBuffer::zeroed(&gpu.ctx, 8)?;
    let nixl = create_ucx_agent("target")?;
    let regs = [&data, &signal].map(|b| nixl.agent.register_memory(b, None));
    let _regs = regs
        .into_iter()
        .collect::<Result<Vec<_>, _>>()
        .context("registering (VRAM)")?;
    // One descriptor list: index 0 is the data, index 1 the signal.
    let descs = DescList::new(MemType::Vram, vec![Desc::of(&data), Desc::of(&signal)]);
    store.set("put_and_signal/target_meta", &nixl.agent.get_local_md()?)?;
    store.set("put_and_signal/target_descs", &descs.encode())?;
    say!("[target] Published metadata and descriptors; waiting for the signal...");

    let expected = blocks_that_signal(a.size, a.blocks);
    let seen = wait_signal(&gpu, &kernels, &signal, expected, a.timeout)?;
    ensure!(
        seen == expected,
        "the signal reached {seen} of {expected} within {:?}: the initiator stopped (died or froze)",
        a.timeout
    );
    let mut host = vec![0u8; a.size as usize];
    data.download(&gpu.stream, &mut host)?;
    let verdict = pattern::verify(&host, SEED, 0);
    store.set(
        "put_and_signal/verdict",
        verdict.as_ref().map_or(b"ok".as_slice(), |_| b"mismatch"),
    )?;
    // The initiator maps our memory until it says otherwise: deregister after.
    store
        .get("put_and_signal/initiator_done")
        .context("waiting for the initiator to release its views")?;
    match verdict {
        None => {
            say!(
                "[target] ✓ Signal {seen}/{expected}; all {} bytes verified",
                a.size
            );
            Ok(ExitCode::SUCCESS)
        }
        Some(m) => Err(DataMismatch(m.to_string()).into()),
    }
}

/// Blocks that write a slice, and so add 1 to the signal: the same split as
/// `slice_of` in put_and_signal.cu (an even share, rounded up to 16 bytes);
/// a block whose slice would start past the end idles.
fn blocks_that_signal(size: u64, blocks: u32) -> u64 {
    let slice = size.div_ceil(u64::from(blocks.max(1))).div_ceil(16) * 16;
    size.div_ceil(slice.max(1))
}

/// One thread spins on the signal with a GPU-side deadline; returns the last value seen.
fn wait_signal(
    gpu: &Gpu,
    m: &Arc<CudaModule>,
    signal: &DeviceBuffer,
    expected: u64,
    timeout: Duration,
) -> Result<u64> {
    let seen = DeviceBuffer::zeroed(&gpu.ctx, 8)?;
    let f = m.load_function("wait_signal")?;
    let (sig, out, ns) = (signal.addr(), seen.addr(), timeout.as_nanos() as u64);
    let mut launch = gpu.stream.launch_builder(&f);
    launch.arg(&sig).arg(&expected).arg(&ns).arg(&out);
    // SAFETY: both words are live device memory until the sync below.
    unsafe { launch.launch(LaunchConfig::for_num_elems(1)) }?;
    gpu.sync()?;
    Ok(seen.read_u64(&gpu.stream)?)
}

/// Owns the source, writes it into the target's buffer from a kernel.
fn initiator(a: &Args) -> Result<ExitCode> {
    let store = TcpStore::open(&StoreOptions::client("127.0.0.1", a.port, timeout(a)))
        .map_err(store_error)?;
    let gpu = Gpu::open(a.gpu.unwrap_or(0))?;
    let kernels = load(&gpu.ctx, Fatbin::PutAndSignal)?;
    let mut host = vec![0u8; a.size as usize];
    pattern::fill(&mut host, SEED, 0);
    let src = DeviceBuffer::zeroed(&gpu.ctx, a.size as usize)?;
    src.upload(&gpu.stream, &host)?;
    let nixl = create_ucx_agent("initiator")?;
    let _reg = nixl
        .agent
        .register_memory(&src, None)
        .context("registering (VRAM)")?;

    let md = store
        .get("put_and_signal/target_meta")
        .context("waiting for the target's metadata")?;
    load_peer(&nixl.agent, &md, "target", timeout(a))?;
    let remote = DescList::decode(&store.get("put_and_signal/target_descs")?)?;
    let local = DescList::new(MemType::Vram, vec![Desc::of(&src)]);
    // SAFETY: the source stays registered, and the target keeps its buffers
    // until `initiator_done`, both beyond the views' lifetime (dropped below).
    let (src_view, dst_view) = unsafe {
        let src_view = prep_local(&nixl.agent, &nixl.backend, &local)?;
        (
            src_view,
            prep_remote(&nixl.agent, &nixl.backend, &remote, "target")?,
        )
    };
    let errors = write(&gpu, &kernels, a, &src, &src_view, &dst_view)?;
    drop((src_view, dst_view));
    store.set("put_and_signal/initiator_done", b"")?;
    ensure!(
        errors == 0,
        "{errors} block(s) saw a NIXL device call fail (or no peer pointer, with --path store)"
    );
    let verdict = store
        .get("put_and_signal/verdict")
        .context("waiting for the target's verdict")?;
    ensure!(verdict == b"ok", "the target found wrong data");
    say!(
        "[initiator] ✓ Wrote {} bytes from {} blocks ({} path); the target verified them",
        a.size,
        a.blocks,
        if a.path == Path::Put {
            "nixlPut"
        } else {
            "nixlGetPtr store"
        }
    );
    Ok(ExitCode::SUCCESS)
}

/// Launches `blocks` × 512 threads of the chosen path and waits; returns
/// how many blocks saw an error. The target's view holds the data at index
/// 0 and the signal at index 1.
fn write(
    gpu: &Gpu,
    m: &Arc<CudaModule>,
    a: &Args,
    src: &DeviceBuffer,
    src_view: &MemView,
    dst_view: &MemView,
) -> Result<u64> {
    let errors = DeviceBuffer::zeroed(&gpu.ctx, 8)?;
    let (dst, signal) = (MemViewElem::new(dst_view, 0), MemViewElem::new(dst_view, 1));
    let (src_elem, src_ptr, err) = (MemViewElem::new(src_view, 0), src.addr(), errors.addr());
    let f = m.load_function(if a.path == Path::Put {
        "put_and_signal"
    } else {
        "store_and_signal"
    })?;
    let mut launch = gpu.stream.launch_builder(&f);
    if a.path == Path::Put {
        launch.arg(&src_elem)
    } else {
        launch.arg(&src_ptr)
    };
    launch.arg(&dst).arg(&signal).arg(&a.size).arg(&err);
    let cfg = LaunchConfig {
        grid_dim: (a.blocks, 1, 1),
        block_dim: (512, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: views, source and error word outlive the sync below.
    unsafe { launch.launch(cfg) }?;
    gpu.sync()?;
    Ok(errors.read_u64(&gpu.stream)?)
}
