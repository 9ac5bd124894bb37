//! Two NIXL agents in two processes move data with the host API.
//!
//! The Rust port of the seeds' `2proc` example (NIXL PR #980): a target
//! registers two 256-byte DRAM buffers and publishes its agent metadata and
//! descriptors through a TCPStore; the initiator
//!
//! 1. READs both buffers in one transfer request built in one call
//!    (`createXferReq`, notification `UUID1`), then
//! 2. WRITEs its buffers back from prepared descriptor lists
//!    (`prepXferDlist` + `makeXferReq`), local [0, 1] to remote [1, 0],
//!    notification `UUID2`.
//!
//! The target waits for each tag as a notification. Unlike the seeds, both
//! sides check every byte against a position-dependent pattern, and any
//! failure makes the whole run exit non-zero.
//!
//! ```text
//! cargo run --example two_proc                 # hosts the store, spawns both roles
//! cargo run --example two_proc -- --role target --port 9998   # one role by hand
//! ```

use std::process::{Child, Command, ExitCode};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use clap::{Parser, ValueEnum};
use nixl_examples::nixl::agent::create_ucx_agent;
use nixl_examples::nixl::memory::HostBuffer;
use nixl_examples::nixl::serdes::{Desc, DescList, MemType};
use nixl_examples::nixl::view::load_peer;
use nixl_examples::nixl::xfer::{NotifInbox, notif_args, post_and_wait};
use nixl_examples::pattern;
use nixl_examples::say;
use nixl_examples::store::native::TcpStore;
use nixl_examples::store::{self, Store, StoreBackend, StoreOptions};
use nixl_sys::XferOp;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Role {
    /// Registers two buffers, publishes them, waits for the transfers.
    Target,
    /// Reads the target's buffers, then writes them back swapped.
    Initiator,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum StoreKind {
    Native,
    Libtorch,
}

/// Two NIXL agents, two processes, host API over DRAM: a READ and a WRITE
/// with notifications, every byte verified.
///
/// Without --role, hosts the TCPStore and runs both roles as child processes.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// Run only this role (the store must already be up at --host/--port).
    #[arg(long, value_enum)]
    role: Option<Role>,
    /// Store host.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Store port (0 = any free port; only without --role).
    #[arg(short, long, default_value_t = 9998)]
    port: u16,
    /// Seconds any wait may take.
    #[arg(short, long, default_value_t = 30)]
    timeout: u64,
    /// Bytes per buffer (each side has two).
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u64).range(1..=(1 << 30)))]
    buf_size: u64,
    /// Pattern seed; both roles must use the same one.
    #[arg(long, default_value_t = 0x2b0c)]
    seed: u64,
    /// Store implementation.
    #[arg(long, value_enum, default_value_t = StoreKind::Native)]
    store: StoreKind,
}

const TARGET_META: &str = "target_meta";
const TARGET_DESCS: &str = "target_descs";
// Pattern variants: the target's original data, the initiator's poison
// before the READ, and what the initiator WRITEs back.
const TARGET_DATA: u64 = 0;
const POISON: u64 = 7;
const WRITTEN: u64 = 1;

fn main() -> ExitCode {
    let args = Args::parse();
    let result = match args.role {
        None => run_both(&args),
        Some(role) => run_role(&args, role),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let who = match args.role {
                None => "main",
                Some(Role::Target) => "target",
                Some(Role::Initiator) => "initiator",
            };
            eprintln!("[{who}] error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn backend(args: &Args) -> StoreBackend {
    match args.store {
        StoreKind::Native => StoreBackend::Native,
        StoreKind::Libtorch => StoreBackend::Libtorch,
    }
}

fn store_opts(args: &Args, is_server: bool) -> StoreOptions {
    StoreOptions {
        host: args.host.clone(),
        port: args.port,
        is_server,
        num_workers: None,
        wait_workers: false,
        timeout: Duration::from_secs(args.timeout),
    }
}

/// Hosts the store and runs the two roles as child processes.
fn run_both(args: &Args) -> Result<()> {
    say!("[main] Starting TCPStore on port {}...", args.port);
    let (store, port): (Box<dyn Store>, u16) = match args.store {
        // The native store reports the port it bound (useful with --port 0).
        StoreKind::Native => {
            let s = TcpStore::open(&store_opts(args, true)).context("starting the store")?;
            let port = s.port();
            (Box::new(s), port)
        }
        StoreKind::Libtorch => (store::open(backend(args), &store_opts(args, true)).context("starting the store")?, args.port),
    };
    say!("[main] Starting target and initiator processes...");
    let exe = std::env::current_exe()?;
    let spawn = |role: &str| -> Result<Child> {
        let mut cmd = Command::new(&exe);
        cmd.args(["--role", role, "--host", &args.host, "--port", &port.to_string()])
            .args(["--timeout", &args.timeout.to_string(), "--buf-size", &args.buf_size.to_string()])
            .args(["--seed", &args.seed.to_string()])
            .args(["--store", if args.store == StoreKind::Native { "native" } else { "libtorch" }]);
        // In containers UCX's shared-memory transport cannot open
        // /proc/<pid>/fd links of the peer; this makes it use another way.
        if std::env::var_os("UCX_POSIX_USE_PROC_LINK").is_none() {
            cmd.env("UCX_POSIX_USE_PROC_LINK", "n");
        }
        cmd.spawn().with_context(|| format!("spawning the {role} process"))
    };
    let mut children = [("target", spawn("target")?), ("initiator", spawn("initiator")?)];

    // Wait for both; when one fails, give the other a moment to report its
    // side, then stop it, so a failure never turns into a hang.
    let deadline = Instant::now() + Duration::from_secs(args.timeout * 2 + 10);
    let mut codes: [Option<i32>; 2] = [None, None];
    let mut failed_at: Option<Instant> = None;
    while codes.iter().any(Option::is_none) {
        for (i, (_, child)) in children.iter_mut().enumerate() {
            if codes[i].is_none() {
                if let Some(status) = child.try_wait()? {
                    let code = status.code().unwrap_or(128 + 9);
                    codes[i] = Some(code);
                    if code != 0 && failed_at.is_none() {
                        failed_at = Some(Instant::now());
                    }
                }
            }
        }
        let give_up = Instant::now() > deadline || failed_at.is_some_and(|t| t.elapsed() > Duration::from_secs(3));
        if give_up {
            for (i, (_, child)) in children.iter_mut().enumerate() {
                if codes[i].is_none() {
                    let _ = child.kill();
                    let _ = child.wait();
                    codes[i] = Some(-9);
                }
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    drop(store);
    let [t, i] = codes.map(|c| c.unwrap_or(-1));
    if t == 0 && i == 0 {
        say!("[main] ✓ Test Complete - Both processes succeeded!");
        Ok(())
    } else {
        eprintln!("[main] ✗ Process error - Target: {t}, Initiator: {i}");
        bail!("{} failed", [("target", t), ("initiator", i)].iter().filter(|(_, c)| *c != 0).map(|(n, _)| *n).collect::<Vec<_>>().join(" and "))
    }
}

fn run_role(args: &Args, role: Role) -> Result<()> {
    let store = store::open(backend(args), &store_opts(args, false))
        .with_context(|| format!("connecting to the store at {}:{}", args.host, args.port))?;
    let timeout = Duration::from_secs(args.timeout);
    match role {
        Role::Target => target(args, store.as_ref(), timeout),
        Role::Initiator => initiator(args, store.as_ref(), timeout),
    }
}

fn two_descs(buf: &HostBuffer, size: u64) -> DescList {
    DescList::new(
        MemType::Dram,
        vec![Desc { addr: buf.addr(), len: size, dev_id: 0 }, Desc { addr: buf.addr() + size, len: size, dev_id: 0 }],
    )
}

/// Checks `bytes` against pattern `variant`, naming `what` on failure.
fn check(bytes: &[u8], seed: u64, variant: u64, what: &str) -> Result<()> {
    match pattern::verify(bytes, seed, variant) {
        None => Ok(()),
        Some(m) => bail!("{what}: {m}"),
    }
}

fn target(args: &Args, store: &dyn Store, timeout: Duration) -> Result<()> {
    let n = args.buf_size as usize;
    say!("[target] Starting target process");
    let nixl = create_ucx_agent("target")?;
    let mut buf = HostBuffer::new(2 * n);
    pattern::fill(buf.as_mut_slice(), args.seed, TARGET_DATA);
    let _reg = nixl.agent.register_memory(&buf, None).context("registering the target's buffers")?;
    say!("[target] Memory registered");

    store.set(TARGET_META, &nixl.agent.get_local_md()?)?;
    store.set(TARGET_DESCS, &two_descs(&buf, args.buf_size).encode())?;
    say!("[target] Published metadata and xfer descriptors to TCP server");
    say!("[target] Waiting for transfers...");

    let mut inbox = NotifInbox::new();
    inbox.wait_for(&nixl.agent, "initiator", b"UUID1", timeout)?;
    // The READ's data is checked where it lands, on the initiator. Checking
    // here that the READ left our memory alone would race the WRITE, which
    // the initiator may already have started.
    say!("[target] Transfer 1 done");

    inbox.wait_for(&nixl.agent, "initiator", b"UUID2", timeout)?;
    // The WRITE sent initiator buffer 0 to our buffer 1 and 1 to 0.
    let mut expected = vec![0u8; 2 * n];
    pattern::fill(&mut expected, args.seed, WRITTEN);
    let got = buf.as_slice();
    ensure!(got[n..] == expected[..n], "target buffer 1 after the WRITE does not hold initiator buffer 0");
    ensure!(got[..n] == expected[n..], "target buffer 0 after the WRITE does not hold initiator buffer 1");
    say!("[target] Transfer 2 done");

    let _ = store.delete_key(TARGET_META);
    let _ = store.delete_key(TARGET_DESCS);
    drop(_reg);
    say!("[target] Target process complete");
    Ok(())
}

fn initiator(args: &Args, store: &dyn Store, timeout: Duration) -> Result<()> {
    let n = args.buf_size as usize;
    say!("[initiator] Starting initiator process");
    let nixl = create_ucx_agent("initiator")?;
    let agent = &nixl.agent;
    let mut buf = HostBuffer::new(2 * n);
    pattern::fill(buf.as_mut_slice(), args.seed, POISON);
    let _reg = agent.register_memory(&buf, None).context("registering the initiator's buffers")?;
    say!("[initiator] Memory registered");

    let md = store.get(TARGET_META).context("waiting for the target's metadata")?;
    load_peer(agent, &md, "target", timeout)?;
    let remote = DescList::decode(&store.get(TARGET_DESCS).context("waiting for the target's descriptors")?)
        .context("decoding the target's descriptors")?;
    ensure!(
        remote.mem_type == MemType::Dram && remote.descs.len() == 2 && remote.descs.iter().all(|d| d.len == args.buf_size),
        "the target published {remote:?}, expected two DRAM buffers of {} bytes (same --buf-size on both sides?)",
        args.buf_size
    );
    say!("[initiator] Successfully retrieved target descriptors");
    let local = two_descs(&buf, args.buf_size);

    // Transfer 1: a transfer request built in one call (initialize_xfer).
    say!("[initiator] Starting transfer 1 (READ)...");
    let req1 = agent
        .create_xfer_req(XferOp::Read, &local.to_xfer_dlist()?, &remote.to_xfer_dlist()?, "target", Some(&notif_args(b"UUID1")?))
        .context("creating transfer 1 (READ)")?;
    post_and_wait(agent, &req1, "transfer 1 (READ)", timeout)?;
    check(buf.as_slice(), args.seed, TARGET_DATA, "initiator buffers after the READ")?;
    say!("[initiator] Transfer 1 done");

    // Transfer 2: prepared descriptor lists, then a request by indices
    // (prep_xfer_dlist + make_prepped_xfer). NIXL_INIT_AGENT ("") names
    // the local side.
    say!("[initiator] Starting transfer 2 (WRITE)...");
    pattern::fill(buf.as_mut_slice(), args.seed, WRITTEN);
    let local_prep = agent.prepare_xfer_dlist("", &local.to_xfer_dlist()?, None).context("preparing the local descriptor list")?;
    let remote_prep =
        agent.prepare_xfer_dlist("target", &remote.to_xfer_dlist()?, None).context("preparing the remote descriptor list")?;
    let req2 = agent
        .make_xfer_req(XferOp::Write, &local_prep, &[0, 1], &remote_prep, &[1, 0], Some(&notif_args(b"UUID2")?))
        .context("making transfer 2 (WRITE) from prepared lists")?;
    post_and_wait(agent, &req2, "transfer 2 (WRITE)", timeout)?;
    say!("[initiator] Transfer 2 done");

    drop((req1, req2, local_prep, remote_prep));
    let _ = agent.invalidate_remote_md("target");
    drop(_reg);
    say!("[initiator] Initiator process complete");
    Ok(())
}
