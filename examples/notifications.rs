//! NIXL notifications between two agents in two processes: sent alone
//! (`genNotif`, nixl-sys `send_notification`) or attached to a transfer,
//! received with `getNotifs` (Python's `get_new_notifs`) and matched by
//! exact tag or by prefix, as the seeds' Python guide shows
//! (`check_notif(agent, tag)`, `check_notif(..., tag_is_prefix=True)`).
//!
//! The initiator sends, on its own: the tag `HELLO`, `--messages`
//! messages `MSG:<i>`, and one binary message (all 256 byte values:
//! notifications are bytes, not strings). The target matches `HELLO`
//! exactly, collects the `MSG:` family by prefix, checks that each index
//! arrived once, and answers `ACK:alone`.
//!
//! Then the initiator WRITEs `--transfers` slots into the target, each
//! request carrying the notification `XFER:<i>`, and re-posts the first
//! request with its message replaced at post time (`REPOST:0`). An attached
//! notification is sent only after the transfer's data is in the target's
//! memory (NIXL's UCX backend flushes the endpoint first), so the target
//! verifies a slot the moment its notification arrives. A notification
//! sent alone gives no such guarantee about transfers still in flight,
//! which is why the data checks wait for the attached ones.
//!
//! Every expected notification must arrive within `--timeout`; the target
//! names the missing ones and exits 1, or 3 if a slot's data is wrong.
//!
//! ```text
//! cargo run --example notifications                       # hosts the store, spawns both roles
//! cargo run --example notifications -- --metadata nixl-tcpstore
//! ```

use std::cell::{Cell, RefCell};
use std::collections::BTreeSet;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use clap::{Parser, ValueEnum};
use nixl_examples::cli::{DataMismatch, bytes_between, exit_status, fmt_timeout, parse_timeout};
use nixl_examples::deadline::{Pace, poll};
use nixl_examples::exchange::{Exchange, ExchangeArgs, ExchangeHost};
use nixl_examples::launch::{self, RoleSpec};
use nixl_examples::logging;
use nixl_examples::nixl::agent::create_polled_agent;
use nixl_examples::nixl::memory::HostBuffer;
use nixl_examples::nixl::serdes::{Desc, DescList, MemType};
use nixl_examples::nixl::xfer::{NotifInbox, notif_args};
use nixl_examples::pattern;
use nixl_examples::say;
use nixl_sys::{Agent, OptArgs, XferDlistHandle, XferOp, XferRequest, XferStatus};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Role {
    /// Registers the slots, receives and matches every notification.
    Target,
    /// Sends notifications alone and attached to WRITEs.
    Initiator,
}

/// Notifications between two NIXL agents in two processes: sent alone and
/// attached to transfers, matched by tag and by prefix; every expected one
/// must arrive, and every attached one's data must be in place.
///
/// Without --role, hosts the exchange and runs both roles as child
/// processes. Exit status 0 success, 1 failure (a notification missing),
/// 2 bad arguments, 3 data mismatch.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// Run only this role (the exchange must already be up).
    #[arg(long, value_enum)]
    role: Option<Role>,
    #[command(flatten)]
    exchange: ExchangeArgs,
    /// Seconds any wait may take.
    #[arg(short, long, default_value = "30", value_parser = parse_timeout)]
    timeout: Duration,
    /// Notifications `MSG:<i>` sent alone (the target collects them by prefix).
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=10000))]
    messages: u32,
    /// WRITEs with an attached notification `XFER:<i>`, one slot each.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=1024))]
    transfers: u32,
    /// Bytes per slot, e.g. 4096, 64K; at most 64M.
    #[arg(long, default_value = "4096", value_parser = bytes_between(1, 1 << 26))]
    buf_size: u64,
    /// Pattern seed; both roles must use the same one.
    #[arg(long, default_value_t = 0x90f1)]
    seed: u64,
}

const TARGET: &str = "target";
const INITIATOR: &str = "initiator";
/// Pattern variant of slot `i`'s first WRITE; the re-post writes
/// [`REPOST_VARIANT`] into slot 0.
const SLOT_VARIANT: u64 = 100;
const REPOST_VARIANT: u64 = 7;

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
        Some(role) => run_role(&args, role).map(|()| ExitCode::SUCCESS),
    };
    result.unwrap_or_else(|e| exit_status(who, &e))
}

fn timeout(args: &Args) -> Duration {
    args.timeout
}

fn run_both(args: &Args) -> Result<ExitCode> {
    let host = ExchangeHost::start(&args.exchange, &[TARGET, INITIATOR], timeout(args))?;
    say!("[main] Starting target and initiator processes...");
    let spawn = |role: &str| {
        let mut a = vec!["--role".to_string(), role.to_string()];
        a.extend(args.exchange.to_args(host.port()));
        a.extend(["--timeout".to_string(), fmt_timeout(args.timeout)]);
        for (k, v) in [
            ("--messages", args.messages as u64),
            ("--transfers", args.transfers as u64),
            ("--buf-size", args.buf_size),
            ("--seed", args.seed),
        ] {
            a.extend([k.to_string(), v.to_string()]);
        }
        RoleSpec::new(role, a)
    };
    let exits = launch::run_roles(
        vec![spawn(TARGET), spawn(INITIATOR)],
        timeout(args) * 3 + Duration::from_secs(10),
    )?;
    drop(host);
    if exits.iter().all(|e| e.code == 0) {
        say!("[main] ✓ Test Complete - Both processes succeeded!");
    }
    Ok(launch::finish("main", &exits))
}

fn run_role(args: &Args, role: Role) -> Result<()> {
    let name = if role == Role::Target {
        TARGET
    } else {
        INITIATOR
    };
    say!("[{name}] Starting {name} process");
    let mut exchange = Exchange::join(&args.exchange, timeout(args))?;
    let nixl = create_polled_agent(name)?;
    let mut buf = HostBuffer::new(args.transfers as usize * args.buf_size as usize);
    let reg = nixl
        .agent
        .register_memory(&buf, None)
        .context("registering the slots")?;
    let result = match role {
        Role::Target => target(args, &nixl.agent, &mut exchange, &buf),
        Role::Initiator => initiator(args, &nixl.agent, &mut exchange, &mut buf),
    };
    exchange.withdraw(&nixl.agent);
    drop(reg);
    result?;
    say!(
        "[{name}] {} process complete",
        if role == Role::Target {
            "Target"
        } else {
            "Initiator"
        }
    );
    Ok(())
}

fn slot_descs(buf: &HostBuffer, slots: u32, size: u64) -> DescList {
    DescList::new(
        MemType::Dram,
        (0..slots as u64)
            .map(|i| Desc {
                addr: buf.addr() + i * size,
                len: size,
                dev_id: 0,
            })
            .collect(),
    )
}

/// The binary message: a tag, then every byte value (NUL and invalid UTF-8
/// included).
fn binary_message() -> Vec<u8> {
    let mut m = b"BIN:".to_vec();
    m.extend(0..=255u8);
    m
}

/// Waits until `n` notifications from `from` starting with `prefix` have
/// arrived, calling `on_arrival` on each as it is taken, then checks the
/// family ([`check_family`]); returns whether they arrived in order. If
/// `timeout` passes first, the error names the ones missing.
fn collect_family(
    agent: &Agent,
    inbox: &mut NotifInbox,
    from: &str,
    prefix: &str,
    n: u64,
    timeout: Duration,
    mut on_arrival: impl FnMut(&[u8]) -> Result<()>,
) -> Result<bool> {
    let got = RefCell::new(Vec::new());
    poll(
        timeout,
        Pace::Every(Duration::from_micros(200)),
        || {
            let mut got = got.borrow_mut();
            loop {
                while (got.len() as u64) < n {
                    let Some(m) = inbox.take(from, |m| m.starts_with(prefix.as_bytes())) else {
                        break;
                    };
                    on_arrival(&m)?;
                    got.push(m);
                }
                if got.len() as u64 == n {
                    return Ok(Some(()));
                }
                if inbox.poll(agent)? == 0 {
                    return Ok(None);
                }
            }
        },
        |waited| {
            check_family(&got.borrow(), prefix, n)
                .err()
                .unwrap_or_else(|| {
                    anyhow::anyhow!("{prefix}<i> notifications: fewer than {n} within {waited:?}")
                })
        },
    )?;
    check_family(&got.into_inner(), prefix, n)
}

/// The index after `prefix` in `MSG:3`-style messages.
fn index_of(msg: &[u8], prefix: &[u8]) -> Option<u64> {
    std::str::from_utf8(msg.strip_prefix(prefix)?)
        .ok()?
        .parse()
        .ok()
}

/// Checks that `got` holds `prefix`+i for every i in 0..n exactly once;
/// the error names what is missing, duplicated or foreign.
fn check_family(got: &[Vec<u8>], prefix: &str, n: u64) -> Result<bool> {
    let mut seen = BTreeSet::new();
    let mut problems = Vec::new();
    for m in got {
        match index_of(m, prefix.as_bytes()) {
            Some(i) if i < n => {
                if !seen.insert(i) {
                    problems.push(format!("{prefix}{i} twice"));
                }
            }
            _ => problems.push(format!("unexpected {:?}", String::from_utf8_lossy(m))),
        }
    }
    let missing: Vec<String> = (0..n)
        .filter(|i| !seen.contains(i))
        .map(|i| format!("{prefix}{i}"))
        .collect();
    if !missing.is_empty() {
        let shown = missing
            .iter()
            .take(10)
            .cloned()
            .collect::<Vec<_>>()
            .join(", ");
        problems.push(format!(
            "missing {} of {n}: {shown}{}",
            missing.len(),
            if missing.len() > 10 { ", ..." } else { "" }
        ));
    }
    if !problems.is_empty() {
        bail!(
            "{prefix}<i> notifications: {} (same --messages/--transfers on both sides?)",
            problems.join("; ")
        );
    }
    let in_order = got
        .iter()
        .map(|m| index_of(m, prefix.as_bytes()))
        .collect::<Vec<_>>()
        .windows(2)
        .all(|w| w[0] < w[1]);
    Ok(in_order)
}

fn verify_slot(buf: &HostBuffer, args: &Args, slot: u64, variant: u64) -> Result<()> {
    let size = args.buf_size as usize;
    let bytes = &buf.as_slice()[slot as usize * size..(slot as usize + 1) * size];
    match pattern::verify(bytes, args.seed, variant) {
        None => Ok(()),
        Some(m) => {
            Err(DataMismatch(format!("slot {slot} when its notification arrived: {m}")).into())
        }
    }
}

/// The target: publish the slots, then match every notification the
/// initiator sends, alone and attached, verifying each slot on arrival.
fn target(args: &Args, agent: &Agent, exchange: &mut Exchange, buf: &HostBuffer) -> Result<()> {
    exchange.publish(agent)?;
    exchange.offer_descs(
        agent,
        INITIATOR,
        &slot_descs(buf, args.transfers, args.buf_size),
    )?;
    // Our answers go to the initiator, so we need its metadata too.
    exchange.load_peer(agent, INITIATOR)?;
    say!("[target] Waiting for notifications...");
    let mut inbox = NotifInbox::new();
    receive_alone(args, agent, &mut inbox)?;
    receive_attached(args, agent, &mut inbox, buf)?;
    receive_repost(args, agent, &mut inbox, buf)?;
    // The initiator's last word: after it, nothing of ours is needed.
    inbox.wait_for(agent, INITIATOR, b"BYE", timeout(args))?;
    Ok(())
}

/// Sent alone: an exact tag, a prefix family, a binary message.
fn receive_alone(args: &Args, agent: &Agent, inbox: &mut NotifInbox) -> Result<()> {
    let t = timeout(args);
    inbox.wait_for(agent, INITIATOR, b"HELLO", t)?;
    say!("[target] Tag match: \"HELLO\" ✓");
    let n = args.messages as u64;
    let in_order = collect_family(agent, inbox, INITIATOR, "MSG:", n, t, |_| Ok(()))?;
    say!(
        "[target] Prefix match \"MSG:\": {n}/{n} arrived{} ✓",
        if in_order { ", in order" } else { "" }
    );
    let bin = binary_message();
    inbox
        .wait_for(agent, INITIATOR, &bin, t)
        .context("waiting for the binary notification")?;
    say!(
        "[target] Binary message: {} bytes, every byte value, matched exactly ✓",
        bin.len()
    );
    answer(agent, b"ACK:alone")
}

/// Attached to WRITEs: each slot is checked as its notification arrives.
fn receive_attached(
    args: &Args,
    agent: &Agent,
    inbox: &mut NotifInbox,
    buf: &HostBuffer,
) -> Result<()> {
    let k = args.transfers as u64;
    collect_family(
        agent,
        inbox,
        INITIATOR,
        "XFER:",
        k,
        timeout(args),
        |m| match index_of(m, b"XFER:").filter(|&i| i < k) {
            Some(i) => verify_slot(buf, args, i, SLOT_VARIANT + i),
            None => Ok(()),
        },
    )?;
    say!("[target] Attached to WRITEs: {k}/{k} \"XFER:<i>\", each slot verified on arrival ✓");
    // Only now may slot 0 be overwritten by the re-post.
    answer(agent, b"ACK:attached")
}

/// The first request again, its message replaced at post time.
fn receive_repost(
    args: &Args,
    agent: &Agent,
    inbox: &mut NotifInbox,
    buf: &HostBuffer,
) -> Result<()> {
    inbox
        .wait_for(agent, INITIATOR, b"REPOST:0", timeout(args))
        .context("waiting for the re-posted request's notification")?;
    verify_slot(buf, args, 0, REPOST_VARIANT)?;
    say!("[target] Re-posted request with its message replaced: \"REPOST:0\", slot 0 verified ✓");
    answer(agent, b"ACK:repost")
}

fn answer(agent: &Agent, msg: &[u8]) -> Result<()> {
    agent
        .send_notification(INITIATOR, msg, None)
        .map_err(|e| anyhow::anyhow!("answering the initiator failed: {e}"))
}

/// The initiator: notifications alone, then WRITEs carrying them, then
/// one WRITE re-posted with its message replaced; each step waits for the
/// target's acknowledgement.
fn initiator(
    args: &Args,
    agent: &Agent,
    exchange: &mut Exchange,
    buf: &mut HostBuffer,
) -> Result<()> {
    let size = args.buf_size as usize;
    for (i, slot) in buf.as_mut_slice().chunks_mut(size).enumerate() {
        pattern::fill(slot, args.seed, SLOT_VARIANT + i as u64);
    }
    exchange.publish(agent)?;
    exchange.load_peer(agent, TARGET)?;
    let mut inbox = NotifInbox::new();
    let remote = exchange.take_descs(agent, &mut inbox, TARGET)?;
    ensure!(
        remote.descs.len() == args.transfers as usize
            && remote.descs.iter().all(|d| d.len == args.buf_size),
        "the target offered {} slot(s) of {} bytes, expected {} of {} (same --transfers and --buf-size on both sides?)",
        remote.descs.len(),
        remote.descs.first().map_or(0, |d| d.len),
        args.transfers,
        args.buf_size
    );
    send_alone(args, agent, &mut inbox)?;
    let writes = Writes::prepare(args, agent, buf, &remote)?;
    write_attached(args, agent, &mut inbox, &writes)?;
    repost(args, agent, &mut inbox, buf, &writes)?;
    send(agent, b"BYE")?;
    drop(writes);
    Ok(())
}

fn send(agent: &Agent, msg: &[u8]) -> Result<()> {
    agent.send_notification(TARGET, msg, None).map_err(|e| {
        anyhow::anyhow!(
            "sending notification {:?} failed: {e}",
            String::from_utf8_lossy(msg)
        )
    })
}

/// `HELLO`, the `MSG:<i>` family and the binary message, sent alone.
fn send_alone(args: &Args, agent: &Agent, inbox: &mut NotifInbox) -> Result<()> {
    say!(
        "[initiator] Sending notifications alone: HELLO, {} × MSG:<i>, one binary",
        args.messages
    );
    send(agent, b"HELLO")?;
    for i in 0..args.messages {
        send(agent, format!("MSG:{i}").as_bytes())?;
    }
    send(agent, &binary_message())?;
    inbox.wait_for(agent, TARGET, b"ACK:alone", timeout(args))?;
    say!("[initiator] Target acknowledged the notifications sent alone ✓");
    Ok(())
}

/// One WRITE per slot, local [i] to remote [i], carrying `XFER:<i>`; the
/// requests are dropped before the prepared lists they were made from.
struct Writes {
    reqs: Vec<XferRequest>,
    _lists: (XferDlistHandle, XferDlistHandle),
}

impl Writes {
    fn prepare(args: &Args, agent: &Agent, buf: &HostBuffer, remote: &DescList) -> Result<Self> {
        let local_prep = agent
            .prepare_xfer_dlist(
                "",
                &slot_descs(buf, args.transfers, args.buf_size).to_xfer_dlist()?,
                None,
            )
            .context("preparing our slots")?;
        let remote_prep = agent
            .prepare_xfer_dlist(TARGET, &remote.to_xfer_dlist()?, None)
            .context("preparing the target's slots")?;
        let reqs = (0..args.transfers as i32)
            .map(|i| -> Result<_> {
                Ok(agent.make_xfer_req(
                    XferOp::Write,
                    &local_prep,
                    &[i],
                    &remote_prep,
                    &[i],
                    Some(&notif_args(format!("XFER:{i}").as_bytes())?),
                )?)
            })
            .collect::<Result<Vec<_>>>()
            .context("making the WRITE requests")?;
        Ok(Self {
            reqs,
            _lists: (local_prep, remote_prep),
        })
    }
}

/// Every WRITE in flight at once; their notifications go out as each
/// completes.
fn write_attached(
    args: &Args,
    agent: &Agent,
    inbox: &mut NotifInbox,
    writes: &Writes,
) -> Result<()> {
    say!(
        "[initiator] Posting {} WRITEs with attached notifications XFER:<i>...",
        args.transfers
    );
    for (i, r) in writes.reqs.iter().enumerate() {
        agent
            .post_xfer_req(r, None)
            .map_err(|e| anyhow::anyhow!("posting WRITE {i} failed: {e}"))?;
    }
    let t = timeout(args);
    wait_all(agent, &writes.reqs.iter().collect::<Vec<_>>(), t)?;
    inbox.wait_for(agent, TARGET, b"ACK:attached", t)?;
    say!("[initiator] Target verified every slot on its notification ✓");
    Ok(())
}

/// The same request again, with its message replaced at post time.
fn repost(
    args: &Args,
    agent: &Agent,
    inbox: &mut NotifInbox,
    buf: &mut HostBuffer,
    writes: &Writes,
) -> Result<()> {
    let size = args.buf_size as usize;
    pattern::fill(&mut buf.as_mut_slice()[..size], args.seed, REPOST_VARIANT);
    let mut opt = OptArgs::new()?;
    opt.set_has_notification(true)?;
    opt.set_notification_message(b"REPOST:0")?;
    agent
        .post_xfer_req(&writes.reqs[0], Some(&opt))
        .map_err(|e| anyhow::anyhow!("re-posting WRITE 0 failed: {e}"))?;
    let t = timeout(args);
    wait_all(agent, &[&writes.reqs[0]], t)?;
    inbox.wait_for(agent, TARGET, b"ACK:repost", t)?;
    say!("[initiator] Target verified the re-posted WRITE ✓");
    Ok(())
}

/// Polls every request until all completed (each poll may send a completed
/// request's notification), for at most `timeout`.
fn wait_all(agent: &Agent, reqs: &[&XferRequest], timeout: Duration) -> Result<()> {
    let mut pending: Vec<usize> = (0..reqs.len()).collect();
    let left = Cell::new(pending.len());
    poll(
        timeout,
        Pace::Yield,
        || {
            let mut still = Vec::new();
            for &i in &pending {
                match agent.get_xfer_status(reqs[i]) {
                    Ok(XferStatus::Success) => {}
                    Ok(XferStatus::InProgress) => still.push(i),
                    Err(e) => bail!("WRITE {i} failed: {e} (did the target exit?)"),
                }
            }
            pending = still;
            left.set(pending.len());
            Ok(pending.is_empty().then_some(()))
        },
        |_| {
            anyhow::anyhow!(
                "{} WRITE(s) did not complete within {timeout:?}",
                left.get()
            )
        },
    )
}
