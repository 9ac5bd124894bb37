//! NIXL notifications between two agents in two processes: sent alone
//! (`genNotif`) or attached to a transfer, received with `getNotifs` and
//! matched by exact tag or by prefix, as upstream's Python guide (NIXL PR #980) does
//! (`check_notif(agent, tag)`, `check_notif(..., tag_is_prefix=True)`).
//!
//! The initiator sends alone `HELLO`, `--messages` × `MSG:<i>` and one
//! binary message (notifications are bytes, not strings); the target
//! matches `HELLO`, collects the `MSG:` family by prefix (each index once)
//! and answers `ACK:alone`. Then the initiator WRITEs `--transfers` slots,
//! each request carrying `XFER:<i>`, and re-posts the first with its message
//! replaced (`REPOST:0`). NIXL sends an attached notification only once the
//! transfer's data is in the target's memory, so the target verifies a slot
//! the moment its notification arrives; one sent alone promises nothing
//! about transfers still in flight.
//!
//! ```text
//! cargo run --example notifications                       # hosts the store, runs both roles
//! cargo run --example notifications -- --metadata nixl-tcpstore
//! ```
//! Exit status: 0 success, 1 failure (a notification missing), 2 bad
//! arguments, 3 wrong data in a slot.

use std::collections::BTreeSet;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use clap::Parser;
use nixl_examples::cli::{DataMismatch, bytes_between};
use nixl_examples::deadline::{Pace, poll};
use nixl_examples::exchange::Exchange;
use nixl_examples::exchange::pair::{PairArgs, Role, Roles};
use nixl_examples::nixl::memory::HostBuffer;
use nixl_examples::nixl::serdes::{Desc, DescList, MemType};
use nixl_examples::nixl::xfer::{NotifInbox, notif_args, wait_done};
use nixl_examples::{pattern, say};
use nixl_sys::{Agent, XferOp};

/// Notifications between two NIXL agents in two processes: sent alone and
/// attached to transfers, matched by tag and by prefix; every expected one
/// must arrive, and every attached one's data must be in place.
///
#[derive(Parser, Debug)]
#[command(version, args_override_self = true)]
struct Args {
    #[command(flatten)]
    pair: PairArgs<Role>,
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
/// Pattern variant of slot i's WRITE; the re-post writes [`REPOST_VARIANT`] into slot 0.
const SLOT_VARIANT: u64 = 100;
const REPOST_VARIANT: u64 = 7;

fn main() -> ExitCode {
    let args = Args::parse();
    let deadline = args.pair.timeout * 3 + Duration::from_secs(10);
    args.pair
        .main(deadline, |role, agent, ex| run_role(&args, role, agent, ex))
}

/// One role: an agent, `--transfers` slots of `--buf-size` registered as
/// one buffer, the role's part, and cleanup on every path.
fn run_role(args: &Args, role: Role, agent: &Agent, ex: &mut Exchange) -> Result<()> {
    say!("[{}] Starting {0} process", role.name());
    let mut buf = HostBuffer::new(args.transfers as usize * args.buf_size as usize);
    let _reg = agent.register_memory(&buf, None)?; // dropped before the agent
    match role {
        Role::Target => target(args, agent, ex, &buf),
        Role::Initiator => initiator(args, agent, ex, &mut buf),
    }
}

fn slot_descs(buf: &HostBuffer, args: &Args) -> DescList {
    DescList::new(
        MemType::Dram,
        Desc::of(buf).split(args.transfers as u64).collect(),
    )
}

/// A tag, then every byte value (NUL and invalid UTF-8 included).
fn binary_message() -> Vec<u8> {
    [b"BIN:".as_slice(), &(0..=255u8).collect::<Vec<_>>()].concat()
}

/// The initiator: notifications alone, then WRITEs carrying them, then one
/// WRITE re-posted with its message replaced; each step waits for the
/// target's acknowledgement.
fn initiator(args: &Args, agent: &Agent, ex: &mut Exchange, buf: &mut HostBuffer) -> Result<()> {
    let size = args.buf_size as usize;
    for (i, slot) in buf.as_mut_slice().chunks_mut(size).enumerate() {
        pattern::fill(slot, args.seed, SLOT_VARIANT + i as u64);
    }
    ex.publish(agent)?;
    ex.load_peer(agent, TARGET)?;
    let (mut inbox, t) = (NotifInbox::new(), args.pair.timeout);
    let remote = ex.take_descs(agent, &mut inbox, TARGET)?;
    let (k, len) = (args.transfers as usize, args.buf_size);
    let ok = remote.descs.len() == k && remote.descs.iter().all(|d| d.len == len);
    let hint = "same --transfers and --buf-size on both sides?";
    ensure!(
        ok,
        "the target offered {remote:?}, not {k} slots of {len} bytes ({hint})"
    );

    let n = args.messages;
    say!("[initiator] Sending notifications alone: HELLO, {n} × MSG:<i>, one binary");
    let send = |msg: &[u8]| agent.send_notification(TARGET, msg, None);
    send(b"HELLO")?;
    for i in 0..n {
        send(format!("MSG:{i}").as_bytes())?;
    }
    send(&binary_message())?;
    inbox.wait_for(agent, TARGET, b"ACK:alone", t)?;
    say!("[initiator] Target acknowledged the notifications sent alone ✓");

    // One WRITE per slot, local [i] to remote [i], carrying `XFER:<i>`,
    // all from one pair of prepared lists.
    let local = agent.prepare_xfer_dlist("", &slot_descs(buf, args).to_xfer_dlist()?, None)?;
    let remote = agent.prepare_xfer_dlist(TARGET, &remote.to_xfer_dlist()?, None)?;
    let reqs = (0..args.transfers as i32)
        .map(|i| {
            let tag = notif_args(format!("XFER:{i}").as_bytes())?;
            Ok(agent.make_xfer_req(XferOp::Write, &local, &[i], &remote, &[i], Some(&tag))?)
        })
        .collect::<Result<Vec<_>>>()?;
    let k = reqs.len();
    say!("[initiator] Posting {k} WRITEs with attached notifications XFER:<i>...");
    for r in &reqs {
        agent.post_xfer_req(r, None)?;
    }
    // Polling a request progresses the worker: each completed request's notification goes out.
    for (i, r) in reqs.iter().enumerate() {
        wait_done(agent, r, &format!("WRITE {i}"), t)?;
    }
    inbox.wait_for(agent, TARGET, b"ACK:attached", t)?;
    say!("[initiator] Target verified every slot on its notification ✓");

    // The same request again, its message replaced at post time.
    pattern::fill(&mut buf.as_mut_slice()[..size], args.seed, REPOST_VARIANT);
    agent.post_xfer_req(&reqs[0], Some(&notif_args(b"REPOST:0")?))?;
    wait_done(agent, &reqs[0], "the re-posted WRITE 0", t)?;
    inbox.wait_for(agent, TARGET, b"ACK:repost", t)?;
    say!("[initiator] Target verified the re-posted WRITE ✓");
    send(b"BYE")?;
    // Requests before the prepared lists they were made from.
    drop((reqs, local, remote));
    Ok(())
}

/// The target: offer the slots, then match every notification the
/// initiator sends, alone and attached, verifying each slot on arrival.
fn target(args: &Args, agent: &Agent, exchange: &mut Exchange, buf: &HostBuffer) -> Result<()> {
    exchange.publish(agent)?;
    exchange.offer_descs(agent, INITIATOR, &slot_descs(buf, args))?;
    // Our answers go to the initiator, so we need its metadata too.
    exchange.load_peer(agent, INITIATOR)?;
    say!("[target] Waiting for notifications...");
    let (mut inbox, t) = (NotifInbox::new(), args.pair.timeout);
    let answer = |msg: &[u8]| agent.send_notification(INITIATOR, msg, None);

    // Sent alone: an exact tag, a prefix family, a binary message.
    inbox.wait_for(agent, INITIATOR, b"HELLO", t)?;
    say!("[target] Tag match: \"HELLO\" ✓");
    let n = args.messages as u64;
    let in_order = collect_family(agent, &mut inbox, "MSG:", n, t, |_| Ok(()))?;
    let order = if in_order { ", in order" } else { "" };
    say!("[target] Prefix match \"MSG:\": {n}/{n} arrived{order} ✓");
    let bin = binary_message();
    inbox.wait_for(agent, INITIATOR, &bin, t)?;
    let len = bin.len();
    say!("[target] Binary message: {len} bytes, every byte value, matched exactly ✓");
    answer(b"ACK:alone")?;

    // Attached to WRITEs: each slot is checked as its notification arrives.
    let k = args.transfers as u64;
    collect_family(agent, &mut inbox, "XFER:", k, t, |i| {
        verify_slot(buf, args, i, SLOT_VARIANT + i)
    })?;
    say!("[target] Attached to WRITEs: {k}/{k} \"XFER:<i>\", each slot verified on arrival ✓");
    // Only now may slot 0 be overwritten by the re-post.
    answer(b"ACK:attached")?;

    inbox.wait_for(agent, INITIATOR, b"REPOST:0", t)?;
    verify_slot(buf, args, 0, REPOST_VARIANT)?;
    say!("[target] Re-posted request with its message replaced: \"REPOST:0\", slot 0 verified ✓");
    answer(b"ACK:repost")?;
    // The initiator's last word: after it, nothing of ours is needed.
    inbox.wait_for(agent, INITIATOR, b"BYE", t)
}

/// Waits until `n` notifications `prefix<i>` (i < n) from the initiator
/// have arrived, calling `on_arrival(i)` on each as it is taken; returns
/// whether they came in order. A repeat, a foreign index or a timeout
/// fails, naming it or the ones missing.
fn collect_family(
    agent: &Agent,
    inbox: &mut NotifInbox,
    prefix: &str,
    n: u64,
    timeout: Duration,
    mut on_arrival: impl FnMut(u64) -> Result<()>,
) -> Result<bool> {
    let (p, mut seen, mut in_order, mut late) = (prefix.as_bytes(), BTreeSet::new(), true, false);
    let step = || loop {
        while let Some(m) = inbox.take(INITIATOR, |m| m.starts_with(p)) {
            let i = std::str::from_utf8(&m[p.len()..])
                .ok()
                .and_then(|i| i.parse().ok());
            let Some(i) = i.filter(|&i| i < n) else {
                bail!("unexpected {:?}", String::from_utf8_lossy(&m));
            };
            ensure!(seen.insert(i), "{prefix}{i} arrived twice");
            in_order &= seen.last() == Some(&i);
            on_arrival(i)?;
        }
        if seen.len() as u64 == n {
            return Ok(Some(()));
        }
        if inbox.poll(agent)? == 0 {
            return Ok(None);
        }
    };
    let pace = Pace::Every(Duration::from_micros(200));
    let arrived = poll(timeout, pace, step, |waited| {
        late = true;
        anyhow::anyhow!("fewer than {n} within {waited:?}")
    });
    if late {
        let missing: Vec<_> = (0..n).filter(|i| !seen.contains(i)).collect();
        let shown = missing.iter().take(10).map(|i| format!("{prefix}{i}"));
        let (shown, more) = (shown.collect::<Vec<_>>().join(", "), missing.len() > 10);
        let more = if more { ", ..." } else { "" };
        let e = arrived.unwrap_err();
        return Err(e.context(format!("missing {} of {n}: {shown}{more}", missing.len())));
    }
    let hint = "(same --messages/--transfers on both sides?)";
    arrived.with_context(|| format!("{prefix}<i> notifications {hint}"))?;
    Ok(in_order)
}

fn verify_slot(buf: &HostBuffer, args: &Args, slot: u64, variant: u64) -> Result<()> {
    let size = args.buf_size as usize;
    let bytes = &buf.as_slice()[slot as usize * size..][..size];
    match pattern::verify(bytes, args.seed, variant) {
        None => Ok(()),
        Some(m) => Err(DataMismatch(format!("slot {slot} on its notification: {m}")).into()),
    }
}
