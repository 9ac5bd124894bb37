//! Two NIXL agents in two processes move data with the host API.
//!
//! The Rust port of the seeds' `2proc` example (NIXL PR #980): a target
//! registers two 256-byte DRAM buffers and publishes its agent metadata and
//! descriptors (through a TCPStore, or NIXL's own etcd or TCPStore
//! exchange with the descriptors as a notification: `--metadata`, see
//! `nixl_examples::exchange`); the initiator
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
//! cargo run --example two_proc -- --metadata etcd --etcd-endpoints http://127.0.0.1:2379
//! cargo run --example two_proc -- --role target --port 9998   # one role by hand
//! ```

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use clap::{Parser, ValueEnum};
use nixl_examples::cli::{bytes_between, exit_status, fmt_timeout, parse_timeout};
use nixl_examples::exchange::{Exchange, ExchangeArgs, ExchangeHost, MetadataMode};
use nixl_examples::launch::{self, RoleSpec};
use nixl_examples::logging;
use nixl_examples::nixl::agent::create_polled_agent;
use nixl_examples::nixl::memory::HostBuffer;
use nixl_examples::nixl::serdes::{Desc, DescList, MemType};
use nixl_examples::nixl::xfer::{NotifInbox, notif_args, post_and_wait};
use nixl_examples::pattern;
use nixl_examples::say;
use nixl_sys::XferOp;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Role {
    /// Registers two buffers, publishes them, waits for the transfers.
    Target,
    /// Reads the target's buffers, then writes them back swapped.
    Initiator,
}

/// Two NIXL agents, two processes, host API over DRAM: a READ and a WRITE
/// with notifications, every byte verified.
///
/// Without --role, hosts the exchange (a TCPStore, or checks etcd) and runs
/// both roles as child processes.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// Run only this role (the exchange must already be up: the store at
    /// --host/--port, or etcd).
    #[arg(long, value_enum)]
    role: Option<Role>,
    #[command(flatten)]
    exchange: ExchangeArgs,
    /// Seconds any wait may take.
    #[arg(short, long, default_value = "30", value_parser = parse_timeout)]
    timeout: Duration,
    /// Bytes per buffer (each side has two), e.g. 256, 64K, 1M; at most 1G.
    #[arg(long, default_value = "256", value_parser = bytes_between(1, 1 << 30))]
    buf_size: u64,
    /// Pattern seed; both roles must use the same one.
    #[arg(long, default_value_t = 0x2b0c)]
    seed: u64,
}

const TARGET: &str = "target";
const INITIATOR: &str = "initiator";
// Pattern variants: the target's original data, the initiator's poison
// before the READ, and what the initiator WRITEs back.
const TARGET_DATA: u64 = 0;
const POISON: u64 = 7;
const WRITTEN: u64 = 1;

fn main() -> ExitCode {
    let args = Args::parse();
    let who = match args.role {
        None => "main",
        Some(Role::Target) => TARGET,
        Some(Role::Initiator) => INITIATOR,
    };
    logging::init(who);
    let result = match args.role {
        None => run_both(&args),
        Some(role) => run_role(&args, role),
    };
    result.unwrap_or_else(|e| exit_status(who, &e))
}

/// Hosts the exchange and runs the two roles as child processes.
fn run_both(args: &Args) -> Result<ExitCode> {
    let timeout = args.timeout;
    let host = ExchangeHost::start(&args.exchange, &[TARGET, INITIATOR], timeout)?;
    say!("[main] Starting target and initiator processes...");
    let role = |name: &str| {
        let mut a = vec!["--role".to_string(), name.to_string()];
        a.extend(args.exchange.to_args(host.port()));
        a.extend(["--timeout", &fmt_timeout(args.timeout)].map(str::to_string));
        a.extend(["--buf-size", &args.buf_size.to_string()].map(str::to_string));
        a.extend(["--seed", &args.seed.to_string()].map(str::to_string));
        RoleSpec::new(name, a)
    };
    let exits = launch::run_roles(
        vec![role(TARGET), role(INITIATOR)],
        timeout * 2 + Duration::from_secs(10),
    )?;
    drop(host);
    if exits.iter().all(|e| e.code == 0) {
        say!("[main] ✓ Test Complete - Both processes succeeded!");
    }
    Ok(launch::finish("main", &exits))
}

fn run_role(args: &Args, role: Role) -> Result<ExitCode> {
    let timeout = args.timeout;
    let mut exchange = Exchange::join(&args.exchange, timeout)?;
    match role {
        Role::Target => target(args, &mut exchange, timeout),
        Role::Initiator => initiator(args, &mut exchange, timeout),
    }?;
    Ok(ExitCode::SUCCESS)
}

fn two_descs(buf: &HostBuffer, size: u64) -> DescList {
    DescList::new(
        MemType::Dram,
        vec![
            Desc {
                addr: buf.addr(),
                len: size,
                dev_id: 0,
            },
            Desc {
                addr: buf.addr() + size,
                len: size,
                dev_id: 0,
            },
        ],
    )
}

/// Checks `bytes` against pattern `variant`, naming `what` on failure.
fn check(bytes: &[u8], seed: u64, variant: u64, what: &str) -> Result<()> {
    match pattern::verify(bytes, seed, variant) {
        None => Ok(()),
        Some(m) => bail!("{what}: {m}"),
    }
}

fn target(args: &Args, exchange: &mut Exchange, timeout: Duration) -> Result<()> {
    let n = args.buf_size as usize;
    say!("[target] Starting target process");
    let nixl = create_polled_agent(TARGET)?;
    let mut buf = HostBuffer::new(2 * n);
    pattern::fill(buf.as_mut_slice(), args.seed, TARGET_DATA);
    let _reg = nixl
        .agent
        .register_memory(&buf, None)
        .context("registering the target's buffers")?;
    say!("[target] Memory registered");

    let result = serve(args, exchange, &nixl.agent, &buf, timeout);
    exchange.withdraw(&nixl.agent);
    drop(_reg);
    result?;
    say!("[target] Target process complete");
    Ok(())
}

/// The target's part once its buffers are registered.
fn serve(
    args: &Args,
    exchange: &mut Exchange,
    agent: &nixl_sys::Agent,
    buf: &HostBuffer,
    timeout: Duration,
) -> Result<()> {
    let n = args.buf_size as usize;
    exchange.publish(agent)?;
    exchange.offer_descs(agent, INITIATOR, &two_descs(buf, args.buf_size))?;
    if exchange.mode() == MetadataMode::Tcpstore {
        say!("[target] Published metadata and xfer descriptors to TCP server");
    } else {
        say!(
            "[target] Published metadata via {} and sent xfer descriptors to the initiator",
            exchange.mode().name()
        );
    }
    say!("[target] Waiting for transfers...");

    let mut inbox = NotifInbox::new();
    inbox.wait_for(agent, INITIATOR, b"UUID1", timeout)?;
    // The READ's data is checked where it lands, on the initiator. Checking
    // here that the READ left our memory alone would race the WRITE, which
    // the initiator may already have started.
    say!("[target] Transfer 1 done");

    inbox.wait_for(agent, INITIATOR, b"UUID2", timeout)?;
    // The WRITE sent initiator buffer 0 to our buffer 1 and 1 to 0.
    let mut expected = vec![0u8; 2 * n];
    pattern::fill(&mut expected, args.seed, WRITTEN);
    let got = buf.as_slice();
    ensure!(
        got[n..] == expected[..n],
        "target buffer 1 after the WRITE does not hold initiator buffer 0"
    );
    ensure!(
        got[..n] == expected[n..],
        "target buffer 0 after the WRITE does not hold initiator buffer 1"
    );
    say!("[target] Transfer 2 done");
    Ok(())
}

fn initiator(args: &Args, exchange: &mut Exchange, timeout: Duration) -> Result<()> {
    say!("[initiator] Starting initiator process");
    let nixl = create_polled_agent(INITIATOR)?;
    let mut buf = HostBuffer::new(2 * args.buf_size as usize);
    pattern::fill(buf.as_mut_slice(), args.seed, POISON);
    let reg = nixl
        .agent
        .register_memory(&buf, None)
        .context("registering the initiator's buffers")?;
    say!("[initiator] Memory registered");
    let result = transfer(args, exchange, &nixl.agent, &mut buf, timeout);
    exchange.withdraw(&nixl.agent);
    drop(reg);
    result?;
    say!("[initiator] Initiator process complete");
    Ok(())
}

/// The initiator's part once its buffers are registered.
fn transfer(
    args: &Args,
    exchange: &mut Exchange,
    agent: &nixl_sys::Agent,
    buf: &mut HostBuffer,
    timeout: Duration,
) -> Result<()> {
    exchange.publish(agent)?;
    exchange.load_peer(agent, TARGET)?;
    let mut inbox = NotifInbox::new();
    let remote = exchange.take_descs(agent, &mut inbox, TARGET)?;
    ensure!(
        remote.mem_type == MemType::Dram
            && remote.descs.len() == 2
            && remote.descs.iter().all(|d| d.len == args.buf_size),
        "the target published {remote:?}, expected two DRAM buffers of {} bytes (same --buf-size on both sides?)",
        args.buf_size
    );
    say!("[initiator] Successfully retrieved target descriptors");
    let local = two_descs(buf, args.buf_size);

    // Transfer 1: a transfer request built in one call (initialize_xfer).
    say!("[initiator] Starting transfer 1 (READ)...");
    let req1 = agent
        .create_xfer_req(
            XferOp::Read,
            &local.to_xfer_dlist()?,
            &remote.to_xfer_dlist()?,
            TARGET,
            Some(&notif_args(b"UUID1")?),
        )
        .context("creating transfer 1 (READ)")?;
    post_and_wait(agent, &req1, "transfer 1 (READ)", timeout)?;
    check(
        buf.as_slice(),
        args.seed,
        TARGET_DATA,
        "initiator buffers after the READ",
    )?;
    say!("[initiator] Transfer 1 done");

    // Transfer 2: prepared descriptor lists, then a request by indices
    // (prep_xfer_dlist + make_prepped_xfer). NIXL_INIT_AGENT ("") names
    // the local side.
    say!("[initiator] Starting transfer 2 (WRITE)...");
    pattern::fill(buf.as_mut_slice(), args.seed, WRITTEN);
    let local_prep = agent
        .prepare_xfer_dlist("", &local.to_xfer_dlist()?, None)
        .context("preparing the local descriptor list")?;
    let remote_prep = agent
        .prepare_xfer_dlist(TARGET, &remote.to_xfer_dlist()?, None)
        .context("preparing the remote descriptor list")?;
    let req2 = agent
        .make_xfer_req(
            XferOp::Write,
            &local_prep,
            &[0, 1],
            &remote_prep,
            &[1, 0],
            Some(&notif_args(b"UUID2")?),
        )
        .context("making transfer 2 (WRITE) from prepared lists")?;
    post_and_wait(agent, &req2, "transfer 2 (WRITE)", timeout)?;
    say!("[initiator] Transfer 2 done");

    drop((req1, req2, local_prep, remote_prep));
    let _ = agent.invalidate_remote_md(TARGET);
    Ok(())
}
