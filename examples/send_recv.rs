//! Streaming with backpressure: a sender WRITEs sequence after sequence
//! into a ring of slots in the receiver's memory; the receiver checks each
//! and reports progress, and the sender never gets so far ahead that it
//! would overwrite a slot not yet consumed.
//!
//! The Rust port of upstream's Python `send_recv` example (NIXL PR #980), DRAM
//! only: 64 slots × 16 MiB, 1000 transfers; the receiver sends `P:<n>` ("I
//! have consumed the first n") every num-buffers/4 transfers, and the
//! sender waits when it is num-buffers−4 ahead. Each slot's WRITE request is
//! made once and re-posted every time the slot comes round.
//!
//! Every slot starts with an 8-byte sequence header. One WRITE gives no
//! order between its bytes, so the receiver does not poll the header (it
//! could see the new header over a half-written payload): each WRITE
//! carries a notification `S:<seq>`, set at each post, which NIXL sends only
//! once the data is in the receiver's memory. The header then tells an
//! overrun (a later sequence already in the slot) from wrong data. Every
//! payload byte is checked. `send_recv_bench` is this with VRAM, baselines
//! and a timing breakdown.
//!
//! ```text
//! cargo run --release --example send_recv                          # hosts the store, runs both roles
//! cargo run --release --example send_recv -- --consume-us 1000 --no-backpressure   # overruns, exit 3
//! cargo run --release --example send_recv -- --role receiver --port 9998   # one role by hand
//! ```
//! Exit status: 0 verified, 1 failure, 2 bad arguments, 3 wrong data or an overrun.

use std::collections::VecDeque;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use clap::Parser;
use nixl_examples::cli::{DataMismatch, print_usage_error};
use nixl_examples::deadline::{Pace, poll};
use nixl_examples::exchange::Exchange;
use nixl_examples::exchange::pair::{PairArgs, Roles};
use nixl_examples::nixl::serdes::MemType;
use nixl_examples::nixl::xfer::NotifInbox;
use nixl_examples::say;
use nixl_examples::slots::{Coverage, EMPTY, RingArgs, Role, SlotCheck, SlotJob, SlotRing};
use nixl_sys::{Agent, OptArgs, XferOp, XferRequest, XferStatus};

/// Streaming between two NIXL agents in two processes: a ring of slots,
/// prepared WRITEs re-posted per slot, progress notifications for
/// backpressure, every payload verified by the receiver.
#[derive(Parser, Debug)]
#[command(version, args_override_self = true)]
struct Args {
    #[command(flatten)]
    pair: PairArgs<Role>,
    #[command(flatten)]
    ring: RingArgs,
    /// Pattern seed; both roles must use the same one.
    #[arg(long, default_value_t = 0x5e9d)]
    seed: u64,
}

const SENDER: &str = "sender";
const RECEIVER: &str = "receiver";
/// A progress line on stdout every this many transfers (as upstream's Python example).
const REPORT_EVERY: u64 = 100;

fn main() -> ExitCode {
    let args = Args::parse();
    // Both rings live on this machine when this process runs both roles.
    let rings = if args.pair.role.is_none() { 2 } else { 1 };
    if let Err(e) = args.ring.check(rings) {
        print_usage_error(&e);
        return ExitCode::from(2);
    }
    // A backstop only: every wait inside the roles is bounded by --timeout;
    // on top, the data may move at no less than 50 MB/s.
    let bytes = args.ring.num_transfers as f64 * args.ring.buffer_size as f64;
    let deadline = args.pair.timeout * 3 + Duration::from_secs_f64(10.0 + bytes / 50e6);
    args.pair
        .main(deadline, |role, agent, ex| run_role(&args, role, agent, ex))
}

/// One role: the ring in DRAM, registered, then the role's part.
fn run_role(args: &Args, role: Role, agent: &Agent, ex: &mut Exchange) -> Result<()> {
    let (n, size) = (
        args.ring.num_buffers as usize,
        args.ring.buffer_size as usize,
    );
    let mut ring = SlotRing::host(n, size);
    let _reg = ring.register(agent)?; // dropped before the ring
    say!("[{}] Starting", role.name());
    match role {
        Role::Receiver => receiver(args, agent, ex, &mut ring),
        Role::Sender => sender(args, agent, ex, &mut ring),
    }
}

/// The sender: take the receiver's ring, prepare one WRITE per slot, then
/// post every sequence, holding back when too far ahead.
fn sender(args: &Args, agent: &Agent, ex: &mut Exchange, ring: &mut SlotRing) -> Result<()> {
    ex.publish(agent)?;
    ex.load_peer(agent, RECEIVER)?;
    let mut inbox = NotifInbox::new();
    let remote = ex.take_descs(agent, &mut inbox, RECEIVER)?;
    let (n, len) = (ring.slots(), ring.slot_len() as u64);
    let ok = remote.mem_type == MemType::Dram && remote.descs.len() == n;
    ensure!(
        ok && remote.descs.iter().all(|d| d.len == len),
        "the receiver offered {} slot(s) of {} bytes, expected {n} of {len} (same --num-buffers and --buffer-size on both sides?)",
        remote.descs.len(),
        remote.descs.first().map_or(0, |d| d.len)
    );
    let (mode, at) = (ex.mode().name(), ex.endpoint());
    say!("[{SENDER}] Connected to {RECEIVER} (metadata via {mode} at {at})");

    // One WRITE per slot, local [i] to remote [i], made once from prepared
    // lists and re-posted every time the slot comes round.
    let local = agent.prepare_xfer_dlist("", &ring.descs().to_xfer_dlist()?, None)?;
    let remote = agent.prepare_xfer_dlist(RECEIVER, &remote.to_xfer_dlist()?, None)?;
    let reqs = (0..n as i32)
        .map(|i| agent.make_xfer_req(XferOp::Write, &local, &[i], &remote, &[i], None))
        .collect::<Result<Vec<_>, _>>()
        .context("making the per-slot WRITE requests")?;
    let in_flight = VecDeque::with_capacity(n);
    let mut s = Stream {
        agent,
        reqs,
        in_flight,
        inbox,
        progress: 0,
    };
    let result = stream(args, ring, &mut s);
    // Requests before the prepared lists they were made from.
    drop((s, local, remote));
    result
}

/// Posts every sequence into its slot, then waits for the last WRITEs and
/// the receiver's final report, and lets the receiver go (`DONE`).
fn stream(args: &Args, ring: &mut SlotRing, s: &mut Stream) -> Result<()> {
    let (total, t, at, payload) = (
        args.ring.num_transfers,
        args.pair.timeout,
        args.ring.at(),
        ring.payload(),
    );
    // Replaces a request's notification at post time: the requests stay as made.
    let mut notif = OptArgs::new()?;
    notif.set_has_notification(true)?;
    let (start, mut waits, mut held, mut max_ahead) = (Instant::now(), 0, Duration::ZERO, 0);
    for seq in 0..total {
        let slot = (seq % ring.slots() as u64) as usize;
        if !args.ring.no_backpressure && seq - s.progress >= at {
            let (what, t0) = ("no progress report from the receiver", Instant::now());
            s.wait(t, what, |s| seq - s.progress < at)?;
            (waits, held) = (waits + 1, held + t0.elapsed());
        }
        // NIXL may still be reading the slot for its previous WRITE.
        let what = format!("the previous WRITE from slot {slot} did not complete");
        s.wait(t, &what, |s| !s.in_flight.contains(&slot))?;
        ring.fill(slot, args.seed, seq, &Coverage::Full.ranges(payload, seq))?;
        notif.set_notification_message(format!("S:{seq}").as_bytes())?;
        s.agent.post_xfer_req(&s.reqs[slot], Some(&notif))?;
        s.in_flight.push_back(slot);
        max_ahead = max_ahead.max(seq + 1 - s.progress);
        s.turn()?;
        if (seq + 1) % REPORT_EVERY == 0 {
            say!(
                "[{SENDER}] Sent {}/{total} (receiver at {})",
                seq + 1,
                s.progress
            );
        }
    }
    let what = "the last WRITEs and the receiver's final progress report did not come";
    s.wait(t, what, |s| s.in_flight.is_empty() && s.progress >= total)?;
    let elapsed = start.elapsed();
    let gb = (total * ring.slot_len() as u64) as f64 / 1e9;
    let rate = gb / elapsed.as_secs_f64().max(1e-9);
    say!(
        "[{SENDER}] Streamed {total} transfers ({gb:.2} GB) in {:.3} s: {rate:.2} GB/s (first post to last report)",
        elapsed.as_secs_f64()
    );
    let ms = held.as_secs_f64() * 1e3;
    say!(
        "[{SENDER}] Backpressure: {waits} waits ({ms:.1} ms), at most {max_ahead} sequence(s) ahead"
    );
    s.agent.send_notification(RECEIVER, b"DONE", None)?;
    Ok(())
}

/// The sender's side of the stream: one prepared WRITE per slot, the slots
/// whose WRITE is in flight, and the receiver's progress.
struct Stream<'a> {
    agent: &'a Agent,
    reqs: Vec<XferRequest>,
    in_flight: VecDeque<usize>,
    inbox: NotifInbox,
    /// The receiver has consumed the sequences below this (its last `P:<n>`).
    progress: u64,
}

impl Stream<'_> {
    /// Checks the oldest WRITEs in flight until one is still running, and
    /// takes the receiver's progress reports. Checking is what makes NIXL
    /// send a completed WRITE's notification (the UCX backend sends it from
    /// `checkXfer` once the data is flushed), so every wait does this.
    fn turn(&mut self) -> Result<()> {
        while let Some(&slot) = self.in_flight.front() {
            match self.agent.get_xfer_status(&self.reqs[slot]) {
                Ok(XferStatus::Success) => drop(self.in_flight.pop_front()),
                Ok(XferStatus::InProgress) => break,
                Err(e) => bail!("the WRITE into slot {slot} failed: {e} (did the receiver exit?)"),
            }
        }
        self.inbox.poll(self.agent)?;
        while let Some(m) = self.inbox.take(RECEIVER, |m| m.starts_with(b"P:")) {
            let n = std::str::from_utf8(&m[2..])
                .ok()
                .and_then(|s| s.parse().ok());
            let n: u64 = n.with_context(|| format!("malformed progress {m:?}"))?;
            self.progress = self.progress.max(n);
        }
        Ok(())
    }

    /// Turns until `done`, for at most `timeout`; the error says what
    /// did not happen (`what`) and where the receiver is.
    fn wait(&mut self, timeout: Duration, what: &str, done: impl Fn(&Self) -> bool) -> Result<()> {
        let waited = poll(
            timeout,
            Pace::Yield,
            || {
                self.turn()?;
                Ok(done(self).then_some(()))
            },
            |w| anyhow::anyhow!("{what} within {w:?}"),
        );
        waited.with_context(|| format!("the {RECEIVER} is at {} (did it stop?)", self.progress))
    }
}

/// The receiver: offer the ring, then for each sequence wait for its
/// notification, check the slot, report progress; stay until the sender
/// has nothing in flight.
fn receiver(args: &Args, agent: &Agent, ex: &mut Exchange, ring: &mut SlotRing) -> Result<()> {
    ex.publish(agent)?;
    ex.offer_descs(agent, SENDER, &ring.descs())?;
    // Our progress reports go to the sender: we need its metadata too.
    ex.load_peer(agent, SENDER)?;
    let (mode, at) = (ex.mode().name(), ex.endpoint());
    say!("[{RECEIVER}] Connected to {SENDER} (metadata via {mode} at {at})");
    let (total, t, mut inbox) = (
        args.ring.num_transfers,
        args.pair.timeout,
        NotifInbox::new(),
    );
    let (mut overruns, mut mismatches, mut first_problem, mut start) = (0, 0, None, None);
    for seq in 0..total {
        let tag = format!("S:{seq}");
        inbox
            .wait_for(agent, SENDER, tag.as_bytes(), t)
            .with_context(|| {
                format!("sequence {seq} did not arrive within {t:?} (did the {SENDER} stop?)")
            })?;
        // Timed from the first arrival, as upstream's Python example does.
        start.get_or_insert_with(Instant::now);
        let slot = (seq % args.ring.num_buffers as u64) as usize;
        let ranges = Coverage::Full.ranges(ring.payload(), seq); // every byte
        ring.queue_checks(vec![SlotJob { slot, seq, ranges }])?;
        for c in ring.check_queued(args.seed)? {
            let Some((overrun, problem)) = classify(&c, args.ring.num_buffers as u64) else {
                continue;
            };
            *(if overrun {
                &mut overruns
            } else {
                &mut mismatches
            }) += 1;
            if first_problem.is_none() {
                tracing::warn!("{problem}");
                first_problem = Some(problem);
            }
        }
        std::thread::sleep(Duration::from_micros(args.ring.consume_us));
        let done = seq + 1;
        if done % args.ring.every() == 0 || done == total {
            agent.send_notification(SENDER, format!("P:{done}").as_bytes(), None)?;
        }
        if done % REPORT_EVERY == 0 {
            say!("[{RECEIVER}] Processed {done}/{total}");
        }
    }
    let elapsed = start.map(|s| s.elapsed()).unwrap_or_default();
    let bytes = total * ring.slot_len() as u64;
    say!(
        "[{RECEIVER}] Completed {total} transfers ({:.2} GB) in {:.3} s: {:.2} GB/s (first arrival to last verified)",
        bytes as f64 / 1e9,
        elapsed.as_secs_f64(),
        bytes as f64 / elapsed.as_secs_f64().max(1e-9) / 1e9
    );
    // Keep the slots registered until the sender has nothing in flight.
    inbox.wait_for(agent, SENDER, b"DONE", t)?;
    match first_problem {
        None => say!("[{RECEIVER}] ✓ No buffer overrun (0 mismatches), every payload verified"),
        Some(p) => {
            say!("[{RECEIVER}] ✗ {overruns} overrun(s), {mismatches} mismatch(es)");
            return Err(DataMismatch(p).into());
        }
    }
    Ok(())
}

/// What is wrong with a checked slot, if anything, and whether it is an
/// overrun (a later sequence of the same slot, `n` on, is already there)
/// rather than wrong data.
fn classify(c: &SlotCheck, n: u64) -> Option<(bool, String)> {
    let (seq, slot, header) = (c.seq, c.slot, c.header);
    let at = format!("sequence {seq} (slot {slot})");
    if header == seq {
        c.mismatch.map(|m| (false, format!("{at}: payload {m}")))
    } else if header != EMPTY && header > seq && (header - seq) % n == 0 {
        let by = format!("was overwritten by sequence {header} before it was consumed");
        Some((true, format!("{at} {by}")))
    } else {
        Some((false, format!("{at}: header holds {header:#x}")))
    }
}
