//! The host API's nouns in the order a program uses them: two NIXL agents
//! in one process create their UCX backends, register memory, hand over
//! metadata, READ with a transfer request built in one call, send a
//! notification, and WRITE crosswise from prepared descriptor lists.
//!
//! DRAM only, no GPU; every byte is checked after every transfer. The
//! sequence follows upstream NIXL's single-process examples; `two_proc`
//! does the same across two processes, through a store.
//!
//! ```text
//! cargo run --example single_process
//! ```
//! Exit status: 0 success, 1 failure, 3 data mismatch.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use clap::Parser;
use nixl_examples::cli::{DataMismatch, exit_status, parse_timeout};
use nixl_examples::deadline::{Pace, poll};
use nixl_examples::nixl::agent::{UcxAgent, create_polled_agent};
use nixl_examples::nixl::memory::HostBuffer;
use nixl_examples::nixl::serdes::{Desc, DescList, MemType};
use nixl_examples::nixl::xfer::{NotifInbox, notif_args};
use nixl_examples::{pattern, say};
use nixl_sys::{RegistrationHandle, XferOp, XferRequest, XferStatus};

/// Two NIXL agents in one process: a READ, a notification and a WRITE from
/// prepared lists between DRAM buffers, every byte verified.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// Seconds any wait may take.
    #[arg(short, long, default_value = "10", value_parser = parse_timeout)]
    timeout: Duration,
    /// For the tests: flip byte 100 of the WRITE's source, so the check must fail (exit 3).
    #[arg(long, hide = true)]
    corrupt: bool,
}

const TARGET: &str = "target";
const INITIATOR: &str = "initiator";
const BUF_SIZE: usize = 256;
const SEED: u64 = 0x5eed;
// Pattern variants: one per buffer, so data landing in the wrong buffer
// fails the check like wrong data does.
const TARGET_DATA: [u64; 2] = [10, 11];
const POISON: [u64; 2] = [90, 91];
const WRITTEN: [u64; 2] = [40, 41];

/// One agent and its two registered buffers. Fields drop in order:
/// registrations before the memory they cover, memory before the agent.
struct Peer {
    name: &'static str,
    regs: Vec<RegistrationHandle>,
    bufs: [HostBuffer; 2],
    nixl: UcxAgent,
    inbox: NotifInbox,
}

fn main() -> ExitCode {
    let done = run(&Args::parse()).map(|()| say!("Test Complete."));
    done.map_or_else(|e| exit_status("main", &e), |()| ExitCode::SUCCESS)
}

fn run(args: &Args) -> Result<()> {
    // No progress threads: this one thread drives both agents, and each
    // status or notification poll advances that agent's UCX worker.
    let mut target = register(TARGET, create_polled_agent(TARGET)?)?;
    let mut initiator = register(INITIATOR, create_polled_agent(INITIATOR)?)?;

    // Metadata (name, UCX address, memory keys): two processes pass these
    // bytes through a store; here they are handed over directly. Only the
    // initiator needs them: it names the remote side of every transfer.
    let md = target.nixl.agent.get_local_md()?;
    let name = initiator.nixl.agent.load_remote_md(&md)?;
    ensure!(name == TARGET, "the metadata named agent {name:?}");
    say!("[initiator] Loaded name from metadata: {name}");

    let remote = descs(&target);
    read(&mut target, &mut initiator, &remote, args.timeout)?;
    notify(&mut target, &mut initiator, args.timeout)?;
    write_prepared(&mut target, &mut initiator, &remote, args)?;
    teardown(target, initiator)
}

/// Two 256-byte DRAM buffers for agent `name`, each registered: NIXL moves
/// only registered memory; registering is where UCX maps it and makes the
/// keys a peer needs to reach it.
fn register(name: &'static str, nixl: UcxAgent) -> Result<Peer> {
    let bufs = [HostBuffer::new(BUF_SIZE), HostBuffer::new(BUF_SIZE)];
    let regs = bufs
        .iter()
        .map(|b| nixl.agent.register_memory(b, None))
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("registering {name}'s buffers"))?;
    say!("[{name}] Registered 2 DRAM buffers of {BUF_SIZE} B");
    let inbox = NotifInbox::new();
    Ok(Peer {
        name,
        regs,
        bufs,
        nixl,
        inbox,
    })
}

/// The descriptors of `peer`'s two buffers: (address, length, device) each.
fn descs(peer: &Peer) -> DescList {
    DescList::new(MemType::Dram, peer.bufs.iter().map(Desc::of).collect())
}

/// READs the target's two buffers into the initiator's with a request built
/// in one call (`createXferReq`: both lists checked against the registered
/// memory, the backend chosen). Posting only starts it; a request can be
/// posted again and again. The initiator is poisoned first, so the check
/// proves the READ moved the data.
fn read(t: &mut Peer, i: &mut Peer, remote: &DescList, timeout: Duration) -> Result<()> {
    fill(t, TARGET_DATA);
    fill(i, POISON);
    let (local, remote) = (descs(i).to_xfer_dlist()?, remote.to_xfer_dlist()?);
    let tag = notif_args(b"UUID1")?;
    let agent = &i.nixl.agent;
    let req = agent
        .create_xfer_req(XferOp::Read, &local, &remote, TARGET, Some(&tag))
        .context("creating the READ request")?;
    say!("[initiator] Posting READ (tag UUID1)");
    let pending = agent.post_xfer_req(&req, None)?;
    wait_both(t, i, pending.then_some(&req), b"UUID1", timeout).context("the READ")?;
    for (k, variant) in TARGET_DATA.into_iter().enumerate() {
        let what = format!("initiator buffer {k} after the READ");
        check(&i.bufs[k], variant, &what)?;
    }
    say!("[initiator] ✓ READ: both buffers verified");
    Ok(())
}

/// Waits until the initiator's `req` (if in progress) completes and the
/// target has a notification starting with `tag` (NIXL sends a transfer's
/// once its data is in place); returns it. With no progress threads nothing
/// moves between NIXL calls, so this polls both agents: a message can sit in
/// the sender's worker until the sender is polled.
fn wait_both(
    t: &mut Peer,
    i: &mut Peer,
    req: Option<&XferRequest>,
    tag: &[u8],
    timeout: Duration,
) -> Result<Vec<u8>> {
    let mut done = req.is_none();
    let step = || {
        if let (false, Some(req)) = (done, req) {
            done = match i.nixl.agent.get_xfer_status(req) {
                Ok(XferStatus::Success) => true,
                Ok(XferStatus::InProgress) => false,
                Err(e) => bail!("the transfer failed: {e}"),
            };
        }
        t.inbox.poll(&t.nixl.agent)?;
        i.inbox.poll(&i.nixl.agent)?;
        Ok(done
            .then(|| t.inbox.take(INITIATOR, |m| m.starts_with(tag)))
            .flatten())
    };
    let tag = String::from_utf8_lossy(tag);
    poll(timeout, Pace::Yield, step, |waited| {
        anyhow::anyhow!("notification {tag:?} did not arrive within {waited:?}")
    })
}

/// Sends a notification with no transfer attached: a message from agent to
/// agent over the same UCX connection. This one carries the initiator's
/// descriptors in NIXL's own encoding (`nixlSerDes`, what C++ and Python
/// peers read): one way to announce buffers without a store.
fn notify(t: &mut Peer, i: &mut Peer, timeout: Duration) -> Result<()> {
    let mine = descs(i);
    let msg = [b"DESCS: ".as_slice(), &mine.encode()].concat();
    i.nixl.agent.send_notification(TARGET, &msg, None)?;
    say!("[initiator] Sent notif DESCS + {} B", msg.len() - 7);
    let got = wait_both(t, i, None, b"DESCS: ", timeout)?;
    let decoded = DescList::decode(&got[7..]).context("decoding the notification")?;
    ensure!(decoded == mine, "the descriptors differ: {decoded:?}");
    say!("[target] Received {} descriptors", decoded.descs.len());
    Ok(())
}

/// WRITEs the initiator's buffers 0 and 1 into the target's 1 and 0 from
/// prepared descriptor lists: `createXferReq` is `prepXferDlist` on each
/// side plus `makeXferReq` with every index; preparing once lets many
/// requests pick entries by index cheaply. The indices cross so that a
/// request that ignored them would fail the check.
fn write_prepared(t: &mut Peer, i: &mut Peer, remote: &DescList, args: &Args) -> Result<()> {
    fill(i, WRITTEN);
    if args.corrupt {
        i.bufs[0].as_mut_slice()[100] ^= 0xff;
    }
    let agent = &i.nixl.agent;
    // "" (NIXL_INIT_AGENT) names the local side.
    let local_prep = agent.prepare_xfer_dlist("", &descs(i).to_xfer_dlist()?, None)?;
    let remote_prep = agent.prepare_xfer_dlist(TARGET, &remote.to_xfer_dlist()?, None)?;
    let tag = notif_args(b"UUID2")?;
    let (l, r) = (&local_prep, &remote_prep);
    let req = agent
        .make_xfer_req(XferOp::Write, l, &[0, 1], r, &[1, 0], Some(&tag))
        .context("making the WRITE request from prepared lists")?;
    say!("[initiator] Posting WRITE local [0, 1] -> remote [1, 0] (tag UUID2)");
    let pending = agent.post_xfer_req(&req, None)?;
    wait_both(t, i, pending.then_some(&req), b"UUID2", args.timeout).context("the WRITE")?;
    for (tk, ik) in [(1, 0), (0, 1)] {
        let what = format!("target buffer {tk} after the WRITE (from initiator buffer {ik})");
        check(&t.bufs[tk], WRITTEN[ik], &what)?;
    }
    say!("[initiator] ✓ WRITE: both target buffers verified");
    // Requests before the prepared lists they were made from.
    drop((req, local_prep, remote_prep));
    Ok(())
}

/// Fills `peer`'s buffer k with pattern `variants[k]`.
fn fill(peer: &mut Peer, variants: [u64; 2]) {
    for (buf, variant) in peer.bufs.iter_mut().zip(variants) {
        pattern::fill(buf.as_mut_slice(), SEED, variant);
    }
}

/// Checks every byte of `buf`; a difference is a [`DataMismatch`] naming
/// `what`, the first offset and both bytes there.
fn check(buf: &HostBuffer, variant: u64, what: &str) -> Result<()> {
    match pattern::verify(buf.as_slice(), SEED, variant) {
        None => Ok(()),
        Some(m) => Err(DataMismatch(format!("{what}: {m}")).into()),
    }
}

/// Undoes the set-up in reverse: the initiator forgets the target, each
/// agent deregisters its memory before the memory is freed.
fn teardown(target: Peer, initiator: Peer) -> Result<()> {
    initiator.nixl.agent.invalidate_remote_md(TARGET)?;
    say!("[initiator] Removed remote agent {TARGET}");
    for mut peer in [initiator, target] {
        for reg in &mut peer.regs {
            reg.deregister().context("deregistering")?;
        }
        say!("[{}] Memory deregistered", peer.name);
    }
    Ok(())
}
