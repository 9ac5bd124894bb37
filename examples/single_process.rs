//! Two NIXL agents in one process move data with the host API.
//!
//! The smallest complete NIXL program: a `target` and an `initiator` agent,
//! each with two registered 256-byte DRAM buffers, share metadata directly
//! (no store, no network), then the initiator READs the target's buffers with
//! a request built in one call, sends a plain notification, and WRITEs its
//! buffers back crosswise from prepared descriptor lists. Every byte is
//! checked after every transfer. DRAM only, so no GPU is needed; the
//! sequence follows upstream NIXL's single-process examples, and `two_proc`
//! does the same across two processes.
//!
//! ```text
//! cargo run --example single_process
//! ```
//!
//! Exit status: 0 success, 1 failure, 3 data mismatch.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use clap::Parser;
use nixl_examples::cli::{DataMismatch, exit_status, parse_timeout};
use nixl_examples::deadline::{Pace, poll};
use nixl_examples::nixl::agent::UcxAgent;
use nixl_examples::nixl::agent::create_polled_agent;
use nixl_examples::nixl::memory::HostBuffer;
use nixl_examples::nixl::runtime;
use nixl_examples::nixl::serdes::{Desc, DescList, MemType};
use nixl_examples::nixl::xfer::{NotifInbox, notif_args};
use nixl_examples::pattern;
use nixl_examples::say;
use nixl_sys::{RegistrationHandle, XferDescList, XferOp, XferRequest, XferStatus};

/// Two NIXL agents in one process: a READ posted twice, a notification and a
/// WRITE from prepared lists between DRAM buffers, every byte verified.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// Seconds any wait may take.
    #[arg(short, long, default_value = "10", value_parser = parse_timeout)]
    timeout: Duration,
    /// Fault injection for testing: `corrupt` flips byte 100 of the
    /// initiator's buffer 0 before the WRITE, so the check must fail (exit 3).
    #[arg(long, hide = true, value_parser = ["corrupt"])]
    inject: Option<String>,
}

const TARGET: &str = "target";
const INITIATOR: &str = "initiator";
const BUF_SIZE: usize = 256;
const SEED: u64 = 0x5eed;
/// The byte `--inject corrupt` flips.
const CORRUPT_AT: usize = 100;

// Pattern variants (see `nixl_examples::pattern`): each buffer gets its own,
// so data landing in the wrong buffer fails the check like wrong data does.
/// What the target's buffers hold before READ number `round` (1 or 2).
fn target_data(round: u64) -> [u64; 2] {
    [10 * round, 10 * round + 1]
}
/// What the initiator holds before each READ: anything the READ must overwrite.
const POISON: [u64; 2] = [90, 91];
/// What the initiator WRITEs.
const WRITTEN: [u64; 2] = [40, 41];
/// How the notification's message starts; the descriptors follow.
const DESCS_PREFIX: &[u8] = b"DESCS: ";

/// One agent and its two registered buffers.
struct Peer {
    name: &'static str,
    // Fields drop in this order on an early return: registrations before the
    // memory they cover, memory before the agent.
    regs: Vec<RegistrationHandle>,
    bufs: [HostBuffer; 2],
    nixl: UcxAgent,
    /// Notifications this agent has received and not yet matched.
    inbox: NotifInbox,
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(()) => {
            say!("Test Complete.");
            ExitCode::SUCCESS
        }
        Err(e) => exit_status("main", &e),
    }
}

fn run(args: &Args) -> Result<()> {
    let timeout = args.timeout;
    let (target, initiator) = create_agents()?;
    list_ucx_params(&target)?;
    let mut target = register(TARGET, target)?;
    let mut initiator = register(INITIATOR, initiator)?;
    exchange_metadata(&target, &initiator)?;
    let remote = serialize_descriptors(&target)?;
    read_in_one_call(&mut target, &mut initiator, &remote, timeout)?;
    notify(&mut target, &mut initiator, timeout)?;
    let corrupt = args.inject.is_some();
    write_prepared(&mut target, &mut initiator, &remote, corrupt, timeout)?;
    teardown(target, initiator)
}

/// Finds NIXL and creates both agents, each with its UCX backend.
fn create_agents() -> Result<(UcxAgent, UcxAgent)> {
    let rt = runtime::load()?;
    say!("Using NIXL Plugins from: {}", rt.plugin_dir.display());
    // No progress threads: this one thread drives both agents, and each
    // status or notification poll below advances that agent's UCX worker.
    // A progress thread would only spin beside us (see
    // `nixl_examples::nixl::agent::create_polled_agent`).
    let target = create_polled_agent(TARGET)?;
    let initiator = create_polled_agent(INITIATOR)?;
    let plugins: Vec<String> = target
        .agent
        .get_available_plugins()?
        .iter()
        .filter_map(|p| p.ok().map(str::to_string))
        .collect();
    say!("Available plugins: {}", plugins.join(", "));
    say!("Created agents: {TARGET} and {INITIATOR}");
    Ok((target, initiator))
}

/// Prints what the UCX plugin offers and what the backend was created with.
fn list_ucx_params(nixl: &UcxAgent) -> Result<()> {
    let (mems, defaults) = nixl.agent.get_plugin_params("UCX")?;
    let mems: Vec<String> = mems
        .iter()
        .filter_map(|m| m.ok())
        .map(|m| m.to_string())
        .collect();
    say!("Plugin parameters (memory types: {}):", mems.join(", "));
    for (k, v) in &defaults {
        say!("  {k} = {v}");
    }
    // The backend's are the defaults plus what create_polled_agent set
    // (one worker, no UCX error handling).
    let (_, actual) = nixl.agent.get_backend_params(&nixl.backend)?;
    say!("Backend parameters:");
    for (k, v) in &actual {
        say!("  {k} = {v}");
    }
    Ok(())
}

/// Allocates two 256-byte DRAM buffers for agent `name` and registers each:
/// NIXL moves only registered memory, and registration is where the backend
/// (UCX) maps it and makes the keys a peer needs to reach it.
fn register(name: &'static str, nixl: UcxAgent) -> Result<Peer> {
    let bufs = [HostBuffer::new(BUF_SIZE), HostBuffer::new(BUF_SIZE)];
    let mut regs = Vec::new();
    for (i, buf) in bufs.iter().enumerate() {
        let reg = nixl
            .agent
            .register_memory(buf, None)
            .with_context(|| format!("registering {name} buffer {i}"))?;
        regs.push(reg);
    }
    say!(
        "[{name}] Registered 2 DRAM buffers of {BUF_SIZE} B at {:#x} and {:#x}",
        bufs[0].addr(),
        bufs[1].addr()
    );
    Ok(Peer {
        name,
        regs,
        bufs,
        nixl,
        inbox: NotifInbox::new(),
    })
}

/// Gives the initiator the target's metadata (its name, UCX address and
/// memory keys). Two processes would pass these bytes through a store; here
/// they are handed over directly. Only the initiator needs them: it names the
/// remote side of every transfer, and the target learns the initiator's name
/// from the notifications it receives.
fn exchange_metadata(target: &Peer, initiator: &Peer) -> Result<()> {
    let md = target.nixl.agent.get_local_md()?;
    say!("[{}] Local metadata: {} bytes", target.name, md.len());
    let name = initiator
        .nixl
        .agent
        .load_remote_md(&md)
        .context("loading the target's metadata into the initiator")?;
    ensure!(
        name == TARGET,
        "the metadata named agent {name:?}, expected {TARGET:?}"
    );
    say!("[{}] Loaded name from metadata: {name}", initiator.name);
    Ok(())
}

/// The descriptors of `peer`'s two buffers: (address, length, device) each.
fn descs(peer: &Peer) -> DescList {
    let desc = |b: &HostBuffer| Desc {
        addr: b.addr(),
        len: b.len() as u64,
        dev_id: 0,
    };
    DescList::new(MemType::Dram, peer.bufs.iter().map(desc).collect())
}

/// Serializes the target's descriptor list and reads it back, as a peer in
/// another process would receive it, in two encodings: NIXL's own
/// (`nixlSerDes`, what C++ and Python peers read) and nixl-sys's (bincode,
/// Rust to Rust only). Returns the list as read back: the initiator uses it.
fn serialize_descriptors(target: &Peer) -> Result<DescList> {
    let sent = descs(target);
    let wire = sent.encode();
    let received = DescList::decode(&wire).context("reading back the nixlSerDes bytes")?;
    ensure!(
        received == sent,
        "nixlSerDes round trip changed the list: {received:?}"
    );

    let list = sent.to_xfer_dlist()?;
    let bincode = list.serialize()?;
    let back = XferDescList::deserialize(&bincode)?;
    ensure!(
        back == list,
        "nixl-sys round trip changed the list: {back:?}"
    );
    say!(
        "[{}] Descriptors serialized and read back: {} B nixlSerDes, {} B nixl-sys",
        target.name,
        wire.len(),
        bincode.len()
    );
    Ok(received)
}

/// Fills `peer`'s buffer i with pattern `variants[i]`.
fn fill(peer: &mut Peer, variants: [u64; 2]) {
    for (buf, variant) in peer.bufs.iter_mut().zip(variants) {
        pattern::fill(buf.as_mut_slice(), SEED, variant);
    }
}

/// Checks every byte of `buf` against pattern `variant`; a difference is a
/// [`DataMismatch`] naming `what`, the first offset and both bytes there.
fn check(buf: &HostBuffer, variant: u64, what: &str) -> Result<()> {
    match pattern::verify(buf.as_slice(), SEED, variant) {
        None => Ok(()),
        Some(m) => Err(DataMismatch(format!("{what}: {m}")).into()),
    }
}

/// Polls both agents once: collects each one's new notifications, which
/// also advances its UCX worker. With no progress threads nothing moves
/// between NIXL calls: a notification the initiator sent can sit in the
/// initiator's worker until the initiator is polled again, so a wait that
/// polled only the target could wait forever.
fn poll_both(target: &mut Peer, initiator: &mut Peer) -> Result<()> {
    target.inbox.poll(&target.nixl.agent)?;
    initiator.inbox.poll(&initiator.nixl.agent)?;
    Ok(())
}

/// Waits until the target has a notification from the initiator that
/// `matches`, polling both agents; returns the message.
fn target_receives(
    target: &mut Peer,
    initiator: &mut Peer,
    matches: impl Fn(&[u8]) -> bool,
    timeout: Duration,
) -> Result<Vec<u8>> {
    poll(
        timeout,
        Pace::Yield,
        || {
            poll_both(target, initiator)?;
            Ok(target.inbox.take(INITIATOR, &matches))
        },
        |waited| anyhow::anyhow!("the target received no such notification within {waited:?}"),
    )
}

/// Posts `req` on the initiator and waits until both sides are done: the
/// initiator sees the request complete, then the target receives `tag`,
/// which NIXL sends once the data is in place.
fn post_and_wait_both(
    target: &mut Peer,
    initiator: &mut Peer,
    req: &XferRequest,
    tag: &[u8],
    timeout: Duration,
) -> Result<()> {
    let agent = &initiator.nixl.agent;
    if agent.post_xfer_req(req, None).context("posting")? {
        poll(
            timeout,
            Pace::Yield,
            || {
                let done = match agent.get_xfer_status(req) {
                    Ok(XferStatus::Success) => true,
                    Ok(XferStatus::InProgress) => false,
                    Err(e) => bail!("the transfer failed: {e}"),
                };
                // Between shared-memory peers the data moves one-sided, but
                // where UCX has no one-sided path (over TCP, say) it emulates
                // READ and WRITE with messages the target's worker must handle.
                target.inbox.poll(&target.nixl.agent)?;
                Ok(done.then_some(()))
            },
            |waited| anyhow::anyhow!("the transfer did not complete within {waited:?}"),
        )?;
    }
    say!("[{}] Initiator done", initiator.name);
    target_receives(target, initiator, |m| m == tag, timeout)
        .with_context(|| format!("waiting for tag {:?}", String::from_utf8_lossy(tag)))?;
    say!("[{}] Target done", target.name);
    Ok(())
}

/// READs the target's two buffers into the initiator's with a request built
/// in one call (`createXferReq`: both descriptor lists checked against the
/// registered memory, the backend chosen), then posts that same request a
/// second time. Posting only starts the transfer; a transfer repeated with
/// the same buffers (every step of a training loop, say) is built once and
/// posted many times. The target's data changes between the postings and
/// the initiator is poisoned before each, so each check proves that this
/// posting moved fresh data.
fn read_in_one_call(
    target: &mut Peer,
    initiator: &mut Peer,
    remote: &DescList,
    timeout: Duration,
) -> Result<()> {
    let local = descs(initiator).to_xfer_dlist()?;
    let req = initiator
        .nixl
        .agent
        .create_xfer_req(
            XferOp::Read,
            &local,
            &remote.to_xfer_dlist()?,
            TARGET,
            Some(&notif_args(b"UUID1")?),
        )
        .context("creating the READ request")?;
    for round in 1..=2u64 {
        fill(target, target_data(round));
        fill(initiator, POISON);
        say!("[{}] Posting READ {round} of 2 (tag UUID1)", initiator.name);
        post_and_wait_both(target, initiator, &req, b"UUID1", timeout)
            .with_context(|| format!("READ {round}"))?;
        for (i, variant) in target_data(round).into_iter().enumerate() {
            check(
                &initiator.bufs[i],
                variant,
                &format!("initiator buffer {i} after READ {round}"),
            )?;
            check(
                &target.bufs[i],
                variant,
                &format!("target buffer {i} after READ {round}"),
            )?;
        }
        say!(
            "[{}] ✓ READ {round}: all 4 buffers verified",
            initiator.name
        );
    }
    drop(req);
    say!("[{}] READ request released", initiator.name);
    Ok(())
}

/// Sends a notification with no transfer attached: a message from agent to
/// agent over the same UCX connection (it needs the receiver's metadata
/// loaded, as transfers do). This one carries the initiator's serialized
/// descriptors, one way to announce buffers without a store; the target
/// checks that it arrived whole and decodes.
fn notify(target: &mut Peer, initiator: &mut Peer, timeout: Duration) -> Result<()> {
    let mine = descs(initiator);
    let mut msg = DESCS_PREFIX.to_vec();
    msg.extend_from_slice(&mine.encode());
    initiator
        .nixl
        .agent
        .send_notification(TARGET, &msg, None)
        .context("sending the notification")?;
    say!(
        "[{}] Sent notif: \"DESCS: \" + {} bytes of descriptors",
        initiator.name,
        msg.len() - DESCS_PREFIX.len()
    );
    let got = target_receives(target, initiator, |m| m.starts_with(DESCS_PREFIX), timeout)
        .context("waiting for the DESCS notification")?;
    ensure!(
        got == msg,
        "the notification arrived changed ({} bytes, sent {})",
        got.len(),
        msg.len()
    );
    let decoded =
        DescList::decode(&got[DESCS_PREFIX.len()..]).context("decoding the notification")?;
    ensure!(
        decoded == mine,
        "the notification's descriptors differ: {decoded:?}"
    );
    say!(
        "[{}] Received message from {INITIATOR}: {} DRAM buffers",
        target.name,
        decoded.descs.len()
    );
    say!("notif test complete, doing transfer 2");
    Ok(())
}

/// WRITEs the initiator's buffers 0 and 1 into the target's buffers 1 and
/// 0, from prepared descriptor lists. `createXferReq` is `prepXferDlist` on
/// each side plus `makeXferReq` with every index; preparing the lists
/// yourself does their checks once, and `makeXferReq` then picks entries by
/// index, so many different requests come cheaply from one pair of prepared
/// lists. The indices cross ([0, 1] to [1, 0]) so that a request that
/// ignored them would fail the check.
fn write_prepared(
    target: &mut Peer,
    initiator: &mut Peer,
    remote: &DescList,
    corrupt: bool,
    timeout: Duration,
) -> Result<()> {
    let agent = &initiator.nixl.agent;
    // "" (NIXL_INIT_AGENT) names the local side.
    let local_prep = agent
        .prepare_xfer_dlist("", &descs(initiator).to_xfer_dlist()?, None)
        .context("preparing the local descriptor list")?;
    let remote_prep = agent
        .prepare_xfer_dlist(TARGET, &remote.to_xfer_dlist()?, None)
        .context("preparing the remote descriptor list")?;
    let req = agent
        .make_xfer_req(
            XferOp::Write,
            &local_prep,
            &[0, 1],
            &remote_prep,
            &[1, 0],
            Some(&notif_args(b"UUID2")?),
        )
        .context("making the WRITE request from prepared lists")?;
    fill(initiator, WRITTEN);
    if corrupt {
        initiator.bufs[0].as_mut_slice()[CORRUPT_AT] ^= 0xff;
    }
    say!(
        "[{}] Transfer 2 started: WRITE local [0, 1] -> remote [1, 0] (tag UUID2)",
        initiator.name
    );
    post_and_wait_both(target, initiator, &req, b"UUID2", timeout).context("the WRITE")?;
    for (t, i) in [(1, 0), (0, 1)] {
        let what = format!("target buffer {t} after the WRITE (from initiator buffer {i})");
        check(&target.bufs[t], WRITTEN[i], &what)?;
        check(
            &initiator.bufs[i],
            WRITTEN[i],
            &format!("initiator buffer {i} after the WRITE"),
        )?;
    }
    say!("[{}] ✓ WRITE: all 4 buffers verified", initiator.name);
    // Requests before the prepared lists they were made from.
    drop(req);
    drop((local_prep, remote_prep));
    say!(
        "[{}] WRITE request and prepared lists released",
        initiator.name
    );
    Ok(())
}

/// Undoes the set-up in reverse: the initiator forgets the target, then each
/// agent deregisters its memory before the memory is freed and the agents
/// are destroyed.
fn teardown(target: Peer, initiator: Peer) -> Result<()> {
    initiator
        .nixl
        .agent
        .invalidate_remote_md(TARGET)
        .context("removing the target's metadata from the initiator")?;
    say!("[{}] Removed remote agent {TARGET}", initiator.name);
    for mut peer in [initiator, target] {
        for (i, reg) in peer.regs.iter_mut().enumerate() {
            reg.deregister()
                .with_context(|| format!("deregistering {} buffer {i}", peer.name))?;
        }
        say!("[{}] Memory deregistered", peer.name);
    }
    Ok(())
}
