//! `send_recv` as a benchmark: the same ring, backpressure and verification
//! (`examples/send_recv.rs` teaches them), plus VRAM slots with batched
//! staging, sampled verification, a same-run baseline of single large
//! WRITEs, fill-ahead and check batches, a timing breakdown and JSON.
//!
//! The Rust port of upstream's Python `send_recv` example (NIXL PR #980): 64 slots
//! × 16 MiB, 1000 transfers; the receiver sends `P:<n>` ("I have consumed
//! the first n") every num-buffers/4 transfers, and the sender waits when it
//! is num-buffers−4 transfers ahead. Transfer requests are prepared once
//! per slot (`prepXferDlist` + one `makeXferReq` per slot) and re-posted
//! every time the slot comes round.
//!
//! Every slot starts with an 8-byte sequence header. Upstream's Python example writes header
//! and payload in one WRITE and let the receiver poll the header; but a
//! single transfer gives no ordering between its bytes (UCX may split it
//! over lanes and fragments, RDMA NICs may place it in any order), so the
//! receiver can see the new header over a half-written payload. Here each
//! WRITE carries a notification `S:<seq>`, and the receiver reads header
//! and payload only after it arrives: NIXL's UCX backend sends a
//! transfer's notification only after flushing the endpoint, i.e. after
//! the data is in the target's memory. The header then serves to detect
//! overruns (a later sequence already in the slot). A separate header WRITE
//! after the payload's completion would order them too, but costs a second
//! request per slot and a completion round trip before it can be posted.
//! The notification's text is set at each post (`postXferReq` takes
//! optional arguments that replace the request's notification), so the
//! prepared requests stay as they are.
//!
//! Unlike upstream's Python example, the receiver checks every payload byte against a
//! pattern of sequence number and offset (`--verify sample` checks the
//! header and three 4 KiB blocks), the sender also measures the bandwidth
//! of single large WRITEs in the same run (`--baseline-reps`), and the
//! throughput is timed from the first post to the receiver's final
//! progress notification.
//!
//! VRAM slots are filled and checked through page-locked host staging
//! ([`SlotRing`]), in batches: the sender fills `--fill-ahead` slots at a
//! time with async copies and waits once, before the batch's first WRITE;
//! the receiver queues each arrived slot's copies (header and checked
//! ranges) and waits once per `--check-batch`, and reports progress only
//! for slots it has checked, so the sender never rewrites a slot whose
//! bytes have not been copied out and checked. (Before, with about five
//! synchronous copies per slot from pageable memory, an H100 receiver
//! spent ~72 µs per slot checking, against ~14 µs to move its 16 MiB.)
//!
//! ```text
//! cargo run --release --example send_recv_bench                    # hosts the store, spawns both roles
//! cargo run --release --example send_recv_bench -- --memory vram --verify sample --json sr.json
//! cargo run --release --example send_recv_bench -- --role receiver --port 9998   # one role by hand
//! ```

use std::cell::Cell;
use std::collections::VecDeque;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use clap::{Parser, ValueEnum};
use nixl_examples::cli::{
    EXIT_MISMATCH, EXIT_USAGE, UsageError, exit_status, fmt_bytes, print_usage_error,
};
use nixl_examples::deadline::{Pace, poll};
use nixl_examples::exchange::pair::PairArgs;
use nixl_examples::exchange::{Exchange, ExchangeHost};
use nixl_examples::gpu::Gpu;
use nixl_examples::launch::{self, RoleSpec};
use nixl_examples::logging;
use nixl_examples::nixl::agent::create_polled_agent;
use nixl_examples::nixl::serdes::{Desc, DescList, MemType};
use nixl_examples::nixl::xfer::{NotifInbox, post_and_wait};
use nixl_examples::say;
use nixl_examples::slots::phases::{ms, pct};
use nixl_examples::slots::{
    Coverage, EMPTY, HEADER_BYTES, Phases, RingArgs, Role, SlotCheck, SlotJob, SlotRing,
};
use nixl_sys::{Agent, OptArgs, XferDlistHandle, XferOp, XferRequest, XferStatus};
use serde_json::json;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Memory {
    /// Host memory.
    Dram,
    /// GPU memory (--gpu).
    Vram,
}

impl Memory {
    /// The name `--memory` takes.
    fn name(self) -> &'static str {
        match self {
            Memory::Dram => "dram",
            Memory::Vram => "vram",
        }
    }
}

/// Streaming between two NIXL agents in two processes: a ring of slots,
/// prepared WRITEs re-posted per slot, progress notifications for
/// backpressure, every payload verified by the receiver.
///
/// Without --role, hosts the exchange (TCPStore, or checks etcd) and runs
/// both roles as child processes. Results go to stdout, logs and errors to
/// stderr; exit status 0 success, 1 failure, 2 bad arguments, 3 data
/// mismatch or overrun.
#[derive(Parser, Debug)]
#[command(version, args_override_self = true)]
struct Args {
    #[command(flatten)]
    pair: PairArgs<Role>,
    #[command(flatten)]
    ring: RingArgs,
    /// Where both rings live.
    #[arg(long, value_enum, default_value_t = Memory::Dram)]
    memory: Memory,
    /// GPU for --memory vram (the receiver's, and the sender's unless --sender-gpu).
    #[arg(long, default_value_t = 0)]
    gpu: usize,
    /// The sender's GPU for --memory vram [default: --gpu].
    #[arg(long)]
    sender_gpu: Option<usize>,
    /// How much of each payload is generated and checked.
    #[arg(long, value_enum, default_value_t = Coverage::Full)]
    verify: Coverage,
    /// Timed single WRITEs of the whole ring (after one warm-up) for the
    /// baseline bandwidth; 0 skips the baseline.
    #[arg(long, default_value_t = 5)]
    baseline_reps: u32,
    /// Slots the sender fills ahead, as one batch, before posting their
    /// WRITEs; 0 fills each slot right before its WRITE [default: 16 for
    /// --memory vram, bounded by --num-buffers and by what 32 MiB of
    /// staging holds; 0 for dram].
    #[arg(long)]
    fill_ahead: Option<u32>,
    /// Slots the receiver checks per batch, bounded by --progress-every
    /// (and for vram by what 32 MiB of staging holds) [default:
    /// --progress-every for --memory vram, 1 for dram].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    check_batch: Option<u32>,
    /// Pattern seed; both roles must use the same one.
    #[arg(long, default_value_t = 0x5e9d)]
    seed: u64,
    /// Write the measured numbers as JSON to this file (by the sender).
    #[arg(long)]
    json: Option<PathBuf>,
}

impl Args {
    fn timeout(&self) -> Duration {
        self.pair.timeout
    }
    fn payload(&self) -> usize {
        self.ring.buffer_size as usize
    }
    /// The byte ranges of a payload that `seq` fills and the receiver checks.
    fn ranges(&self, seq: u64) -> Vec<std::ops::Range<usize>> {
        self.verify.ranges(self.payload(), seq)
    }
    /// VRAM: the most pinned staging bytes one slot's fill or check uses.
    fn staging_per_slot(&self) -> usize {
        HEADER_BYTES + self.verify.max_bytes(self.payload())
    }
    /// The most slots one batch of fills, or of checks, may hold: for
    /// VRAM what [`STAGING_BYTES`] holds (at least one), else no bound.
    fn staging_slots(&self, vram: bool) -> usize {
        if vram {
            (STAGING_BYTES / self.staging_per_slot()).max(1)
        } else {
            usize::MAX
        }
    }
}

const SENDER: &str = "sender";
const RECEIVER: &str = "receiver";
/// Progress lines on stdout every this many transfers (as upstream's Python example).
const REPORT_EVERY: u64 = 100;
/// VRAM: the most pinned staging one batch of fills, or of checks, may
/// use; at least one slot's worth is used whatever this says.
const STAGING_BYTES: usize = 32 << 20;
/// VRAM: the most slots the sender fills ahead in one batch.
const FILL_AHEAD: usize = 16;

fn main() -> ExitCode {
    let args = Args::parse();
    if let Err(e) = check_args(&args) {
        print_usage_error(&e);
        return ExitCode::from(EXIT_USAGE as u8);
    }
    let who = match args.pair.role {
        None => "main",
        Some(Role::Sender) => SENDER,
        Some(Role::Receiver) => RECEIVER,
    };
    logging::init(who);
    let result = match args.pair.role {
        None => run_both(&args),
        Some(role) => run_role(&args, role),
    };
    result.unwrap_or_else(|e| exit_status(who, &e))
}

/// What clap cannot express: relations between options, and whether the
/// rings fit in this machine's memory (checked before any is allocated).
fn check_args(args: &Args) -> Result<(), UsageError> {
    // Both rings live on this machine when this process runs both roles.
    let rings = match (args.memory, args.pair.role) {
        (Memory::Vram, _) => 0,
        (Memory::Dram, None) => 2,
        (Memory::Dram, Some(_)) => 1,
    };
    args.ring.check(rings)
}

/// Hosts the exchange and runs both roles as child processes.
fn run_both(args: &Args) -> Result<ExitCode> {
    if args.memory == Memory::Vram {
        // Fail here, once, rather than in both children.
        nixl_examples::gpu::context::device_count()
            .context("--memory vram needs an NVIDIA GPU (use --memory dram on this machine)")?;
    }
    let host = ExchangeHost::start(&args.pair.exchange, &[SENDER, RECEIVER], args.timeout())?;
    say!(
        "[main] Starting sender-receiver: {} slots × {}, {} transfers, {}, metadata via {}",
        args.ring.num_buffers,
        fmt_bytes(args.ring.buffer_size),
        args.ring.num_transfers,
        args.memory.name(),
        args.pair.exchange.metadata.name()
    );
    // This program again, with our arguments plus the role's.
    let port = host.port().to_string();
    let role = |name, gpu: usize| {
        RoleSpec::again(
            name,
            &["--role", name, "--port", &port, "--gpu", &gpu.to_string()],
        )
    };
    let sender_gpu = args.sender_gpu.unwrap_or(args.gpu);
    let roles = vec![role(RECEIVER, args.gpu), role(SENDER, sender_gpu)];
    // A backstop only: every wait inside the roles is bounded by --timeout.
    // Allow the data to move at no less than 50 MB/s on top.
    let bytes = args.ring.num_transfers as f64
        * args.ring.buffer_size as f64
        * (1 + args.baseline_reps as u64) as f64;
    let deadline =
        args.timeout() * 3 + Duration::from_secs(10) + Duration::from_secs_f64(bytes / 50e6);
    let exits = launch::run_roles(roles, deadline)?;
    drop(host);
    if exits.iter().all(|e| e.code == 0) {
        say!("[main] ✓ Success!");
    }
    Ok(launch::finish("main", &exits))
}

fn run_role(args: &Args, role: Role) -> Result<ExitCode> {
    let name = if role == Role::Sender {
        SENDER
    } else {
        RECEIVER
    };
    say!("[{name}] Starting");
    // First: it edits the environment, which must happen before CUDA
    // starts its threads.
    let mut exchange = Exchange::join(&args.pair.exchange, args.timeout())?;
    // The CUDA context must exist before the agent: UCX looks for CUDA when
    // the backend starts.
    let gpu =
        match args.memory {
            Memory::Dram => None,
            Memory::Vram => {
                let ordinal = if role == Role::Sender {
                    args.sender_gpu.unwrap_or(args.gpu)
                } else {
                    args.gpu
                };
                Some(Gpu::open(ordinal).context(
                    "--memory vram needs an NVIDIA GPU (use --memory dram on this machine)",
                )?)
            }
        };
    let nixl = create_polled_agent(name)?;
    let mut ring = match &gpu {
        None => SlotRing::host(args.ring.num_buffers as usize, args.payload()),
        Some(g) => SlotRing::device(g, args.ring.num_buffers as usize, args.payload())?,
    };
    let reg = ring.register(&nixl.agent)?;
    let result = match role {
        Role::Receiver => receiver(args, &nixl.agent, &mut exchange, &mut ring),
        Role::Sender => sender(args, &nixl.agent, &mut exchange, &mut ring),
    };
    exchange.withdraw(&nixl.agent);
    // Deregister before the ring's memory is freed.
    drop(reg);
    drop(ring);
    result
}

/// Exit status of a role: 0, or 3 when a slot held the wrong data.
fn exit_code(overruns: u64, mismatches: u64) -> ExitCode {
    if overruns + mismatches == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_MISMATCH as u8)
    }
}

fn gbps(bytes: u64, d: Duration) -> f64 {
    bytes as f64 / d.as_secs_f64().max(1e-9) / 1e9
}

/// Takes every `P:<n>` from the sender's inbox; returns the largest n.
fn take_progress(inbox: &mut NotifInbox, mut progress: u64) -> Result<u64> {
    while let Some(m) = inbox.take(RECEIVER, |m| m.starts_with(b"P:")) {
        let n: u64 = std::str::from_utf8(&m[2..])
            .ok()
            .and_then(|s| s.parse().ok())
            .with_context(|| {
                format!(
                    "malformed progress notification {:?}",
                    String::from_utf8_lossy(&m)
                )
            })?;
        progress = progress.max(n);
    }
    Ok(progress)
}

// ---------------------------------------------------------------- receiver

/// The receiver: connect, consume every sequence, summarise, and stay
/// until the sender is done with our memory.
fn receiver(
    args: &Args,
    agent: &Agent,
    exchange: &mut Exchange,
    ring: &mut SlotRing,
) -> Result<ExitCode> {
    connect_receiver(agent, exchange, ring)?;
    say!("[{RECEIVER}] Initialized, starting main loop");
    let mut rx = ReceiverLoop::new(args, agent, ring)?;
    rx.consume(ring)?;
    let stats = rx.summarise(ring);
    agent
        .send_notification(SENDER, format!("STATS:{stats}").as_bytes(), None)
        .map_err(|e| anyhow::anyhow!("sending our statistics to {SENDER} failed: {e}"))?;
    // Keep the slots registered until the sender has nothing in flight.
    rx.inbox.wait_for(agent, SENDER, b"DONE", args.timeout())?;
    say!("[{RECEIVER}] Done");
    Ok(exit_code(rx.overruns, rx.mismatches))
}

/// Publishes our metadata and slots, and loads the sender's metadata (for
/// the progress notifications).
fn connect_receiver(agent: &Agent, exchange: &mut Exchange, ring: &SlotRing) -> Result<()> {
    exchange.publish(agent)?;
    exchange.offer_descs(agent, SENDER, &ring.descs())?;
    exchange.load_peer(agent, SENDER)?;
    say!(
        "[{RECEIVER}] Connected to {SENDER} (metadata via {} at {})",
        exchange.mode().name(),
        exchange.endpoint()
    );
    Ok(())
}

/// Where the receiver is in the stream, what it found, where its time went.
struct ReceiverLoop<'a> {
    args: &'a Args,
    agent: &'a Agent,
    inbox: NotifInbox,
    phases: Phases,
    vram: bool,
    /// The most slots checked in one batch.
    max_batch: u64,
    /// The next sequence whose notification is awaited.
    next: u64,
    /// Sequences below this are checked.
    verified: u64,
    batches: u64,
    reports: u64,
    overruns: u64,
    mismatches: u64,
    first_problem: Option<String>,
    /// The first arrival: the stream is timed from here.
    start: Option<Instant>,
    /// How long the first notification took (the sender's set-up).
    first_wait: Duration,
}

impl<'a> ReceiverLoop<'a> {
    /// Sizes the check batches and reserves their staging.
    fn new(args: &'a Args, agent: &'a Agent, ring: &mut SlotRing) -> Result<Self> {
        let (vram, every) = (ring.mem_type() == MemType::Vram, args.ring.every());
        let want = args
            .check_batch
            .map_or(if vram { every } else { 1 }, u64::from);
        let max_batch = want.min(every).min(args.staging_slots(vram) as u64).max(1);
        ring.reserve_staging(0, max_batch as usize * args.staging_per_slot())?;
        ring.reset_copy_stats();
        Ok(Self {
            args,
            agent,
            inbox: NotifInbox::new(),
            phases: Phases::default(),
            vram,
            max_batch,
            next: 0,
            verified: 0,
            batches: 0,
            reports: 0,
            overruns: 0,
            mismatches: 0,
            first_problem: None,
            start: None,
            first_wait: Duration::ZERO,
        })
    }

    /// Checks every sequence, a batch at a time, and reports progress.
    ///
    /// DRAM: a batch is one slot (by default), checked in place as soon as
    /// its notification arrives. VRAM: each arrival only queues the async
    /// D2H copies of the slot's header and checked ranges into pinned
    /// staging (no wait: the copies run while we wait for the next
    /// notification); a complete batch is waited for with ONE stream
    /// synchronisation and then checked. A batch ends at every progress
    /// report or when the staging is full, so a report P:<n> is sent only
    /// after sequences 0..n have all been copied out and checked. That is
    /// what makes backpressure safe: the sender writes a slot again only
    /// once our progress has passed its previous sequence, so no slot is
    /// overwritten while its copy is queued or before it is checked.
    fn consume(&mut self, ring: &mut SlotRing) -> Result<()> {
        let (total, every) = (self.args.ring.num_transfers, self.args.ring.every());
        while self.verified < total {
            // Never past the next progress report, so every report is sent
            // (the sender may be waiting for it), nor past the staging.
            let batch_end = total
                .min(self.verified + self.max_batch)
                .min((self.verified / every + 1) * every);
            self.wait_for_batch(ring, batch_end)?;
            let checked = self.check_batch(ring)?;
            self.consume_slots(checked);
            self.report_progress(batch_end)?;
        }
        Ok(())
    }

    /// Waits for the notifications of the sequences up to `batch_end`,
    /// queueing each arrival's checks as it comes.
    fn wait_for_batch(&mut self, ring: &mut SlotRing, batch_end: u64) -> Result<()> {
        while self.next < batch_end {
            self.wait_for_arrival()?;
            // This sequence and the batch's next ones whose notifications
            // are already here: copies of consecutive slots share calls.
            let mut jobs = vec![self.job(self.next)];
            self.next += 1;
            while self.next < batch_end {
                let tag = format!("S:{}", self.next);
                if self.inbox.take(SENDER, |m| m == tag.as_bytes()).is_none() {
                    break;
                }
                jobs.push(self.job(self.next));
                self.next += 1;
            }
            if self.vram {
                self.phases
                    .time("queue D2H copies (header + checked)", || {
                        ring.queue_checks(jobs)
                    })?;
            } else {
                ring.queue_checks(jobs)?;
            }
        }
        Ok(())
    }

    /// Waits for `S:<next>`, which NIXL delivers once that WRITE's data is
    /// in our memory.
    fn wait_for_arrival(&mut self) -> Result<()> {
        let (next, timeout) = (self.next, self.args.timeout());
        let tag = format!("S:{next}").into_bytes();
        let (agent, inbox) = (self.agent, &mut self.inbox);
        let t = Instant::now();
        poll(
            timeout,
            Pace::Yield,
            || {
                if inbox.take(SENDER, |m| m == tag.as_slice()).is_none() {
                    inbox.poll(agent)?;
                    return Ok(inbox.take(SENDER, |m| m == tag.as_slice()).map(drop));
                }
                Ok(Some(()))
            },
            |_| {
                anyhow::anyhow!(
                    "sequence {next} did not arrive within {timeout:?} (no notification S:{next} from {SENDER}: did it stop?)"
                )
            },
        )?;
        if next == 0 {
            self.first_wait = t.elapsed();
        }
        self.phases.add("wait for data (notification)", t.elapsed());
        // From the first arrival, as upstream's Python example times it: waiting for the
        // sender's set-up and baseline is not part of the stream.
        self.start.get_or_insert_with(Instant::now);
        Ok(())
    }

    fn job(&self, seq: u64) -> SlotJob {
        SlotJob {
            slot: (seq % self.args.ring.num_buffers as u64) as usize,
            seq,
            ranges: self.args.ranges(seq),
        }
    }

    /// Checks the queued batch (VRAM: one wait for all its copies) and
    /// counts what is wrong; returns how many slots it checked.
    fn check_batch(&mut self, ring: &mut SlotRing) -> Result<usize> {
        if self.vram {
            self.phases
                .time("wait for D2H copies (1 sync/batch)", || ring.wait_queued())?;
        }
        let t = Instant::now();
        let checks = ring.check_queued(self.args.seed)?;
        self.batches += 1;
        let problems: Vec<String> = checks.iter().filter_map(|c| self.classify(c)).collect();
        self.phases
            .add("check header + verify payload", t.elapsed());
        for p in problems {
            if self.first_problem.is_none() {
                tracing::warn!("{p}");
            }
            self.first_problem.get_or_insert(p);
        }
        Ok(checks.len())
    }

    /// What is wrong with a checked slot, if anything: an overrun (a later
    /// sequence of the same slot is already there) or a mismatch.
    fn classify(&mut self, c: &SlotCheck) -> Option<String> {
        let (seq, slot, header, n) = (c.seq, c.slot, c.header, self.args.ring.num_buffers as u64);
        if header == seq {
            c.mismatch.map(|m| {
                self.mismatches += 1;
                format!("sequence {seq} (slot {slot}): payload {m}")
            })
        } else if header != EMPTY && header > seq && (header - seq) % n == 0 {
            self.overruns += 1;
            Some(format!(
                "sequence {seq} (slot {slot}) was overwritten by sequence {header} before it was consumed"
            ))
        } else {
            self.mismatches += 1;
            Some(format!(
                "sequence {seq} (slot {slot}): header holds {header:#x}"
            ))
        }
    }

    /// Spends --consume-us on each of `slots` slots, as a slow consumer would.
    fn consume_slots(&mut self, slots: usize) {
        if self.args.ring.consume_us > 0 {
            for _ in 0..slots {
                self.phases.time("consume (--consume-us)", || {
                    std::thread::sleep(Duration::from_micros(self.args.ring.consume_us))
                });
            }
        }
    }

    /// Marks the sequences below `batch_end` checked, and tells the sender
    /// at every report point (`P:<n>`); a progress line every 100.
    fn report_progress(&mut self, batch_end: u64) -> Result<()> {
        let (total, every) = (self.args.ring.num_transfers, self.args.ring.every());
        let before = self.verified;
        self.verified = batch_end;
        let verified = self.verified;
        if verified % every == 0 || verified == total {
            let t = Instant::now();
            self.agent
                .send_notification(SENDER, format!("P:{verified}").as_bytes(), None)
                .map_err(|e| anyhow::anyhow!("sending progress to {SENDER} failed: {e}"))?;
            self.reports += 1;
            self.phases.add("send progress notifications", t.elapsed());
        }
        if verified / REPORT_EVERY > before / REPORT_EVERY {
            say!("[{RECEIVER}] Processed {verified}/{total}");
        }
        Ok(())
    }

    /// Prints the receiver's results; returns them as the JSON the sender
    /// reports (`STATS:`).
    fn summarise(&mut self, ring: &SlotRing) -> serde_json::Value {
        let total = self.args.ring.num_transfers;
        let elapsed = self.start.map(|s| s.elapsed()).unwrap_or_default();
        // The first wait is not inside `elapsed`; leave it out of the shares too.
        self.phases
            .discount("wait for data (notification)", self.first_wait);
        let bytes = total * ring.slot_len() as u64;
        say!(
            "[{RECEIVER}] Completed {total} transfers ({:.2} GB) in {:.3} s: {:.2} GB/s (first arrival to last verified)",
            bytes as f64 / 1e9,
            elapsed.as_secs_f64(),
            gbps(bytes, elapsed)
        );
        say!("[{RECEIVER}] Progress updates sent: {}", self.reports);
        let (overruns, mismatches) = (self.overruns, self.mismatches);
        if overruns + mismatches == 0 {
            say!(
                "[{RECEIVER}] ✓ No buffer overrun (0 mismatches), every payload verified ({})",
                self.args.verify.name()
            );
        } else {
            say!("[{RECEIVER}] ✗ {overruns} overrun(s), {mismatches} mismatch(es)");
        }
        self.phases.print(RECEIVER, elapsed, total);
        let copies = ring.copy_stats();
        if let Some(c) = &copies {
            say!(
                "[{RECEIVER}] Checked in {} batches of up to {} slots, one wait each; D2H staging: {}",
                self.batches,
                self.max_batch,
                c.summary()
            );
        }
        json!({
            "transfers": total,
            "seconds": elapsed.as_secs_f64(),
            "gbps": gbps(bytes, elapsed),
            "overruns": overruns,
            "mismatches": mismatches,
            "first_problem": self.first_problem,
            "progress_reports": self.reports,
            "check_batches": self.batches,
            "max_check_batch": self.max_batch,
            "copies": copies.map(|c| c.json()),
            "phases_ms": self.phases.json(),
        })
    }
}

// ------------------------------------------------------------------ sender

/// The sender: connect, prepare one WRITE per slot, measure the baseline,
/// stream every sequence, drain, and report.
fn sender(
    args: &Args,
    agent: &Agent,
    exchange: &mut Exchange,
    ring: &mut SlotRing,
) -> Result<ExitCode> {
    let (inbox, remote) = connect_sender(agent, exchange, ring)?;
    let requests = prepare_requests(agent, ring, &remote)?;
    say!(
        "[{SENDER}] Ready: {} slots × {} (+8 B header) in {}, {} transfers, verify {}",
        ring.slots(),
        fmt_bytes(ring.payload() as u64),
        args.memory.name(),
        args.ring.num_transfers,
        args.verify.name()
    );
    let baseline = if args.baseline_reps > 0 {
        Some(baseline(args, agent, ring, &remote)?)
    } else {
        None
    };
    say!("[{SENDER}] Initialized, starting main loop");
    let mut tx = SenderLoop::new(args, agent, ring, requests, inbox)?;
    let start = Instant::now();
    tx.stream(ring)?;
    let send_end = start.elapsed();
    tx.drain()?;
    let run = Measured {
        bytes: args.ring.num_transfers * ring.slot_len() as u64,
        elapsed: start.elapsed(),
        send_end,
    };
    let rstats = tx.receiver_stats()?;
    tx.report(ring, baseline.as_ref(), &run);
    if let Some(path) = &args.json {
        let out = tx.json(exchange, ring, baseline.as_ref(), &run, &rstats);
        std::fs::write(path, format!("{out:#}\n"))
            .with_context(|| format!("writing {}", path.display()))?;
    }
    say!("[{SENDER}] Done");
    let count = |k: &str| rstats[k].as_u64().unwrap_or(0);
    Ok(exit_code(count("overruns"), count("mismatches")))
}

/// Publishes our metadata, loads the receiver's, and takes its slots,
/// which must match ours in number, size and memory type.
fn connect_sender(
    agent: &Agent,
    exchange: &mut Exchange,
    ring: &SlotRing,
) -> Result<(NotifInbox, DescList)> {
    let n = ring.slots();
    exchange.publish(agent)?;
    exchange.load_peer(agent, RECEIVER)?;
    let mut inbox = NotifInbox::new();
    let remote = exchange.take_descs(agent, &mut inbox, RECEIVER)?;
    let expect_type = ring.mem_type();
    ensure!(
        remote.mem_type == expect_type
            && remote.descs.len() == n
            && remote.descs.iter().all(|d| d.len == ring.slot_len() as u64),
        "the receiver offered {} {:?} slot(s) of {} bytes, expected {n} {expect_type:?} slots of {} bytes (same --num-buffers, --buffer-size and --memory on both sides?)",
        remote.descs.len(),
        remote.mem_type,
        remote.descs.first().map_or(0, |d| d.len),
        ring.slot_len()
    );
    say!(
        "[{SENDER}] Connected to {RECEIVER} (metadata via {} at {})",
        exchange.mode().name(),
        exchange.endpoint()
    );
    Ok((inbox, remote))
}

/// One WRITE request per slot, local [i] to remote [i], made once from
/// prepared lists and re-posted every time the slot comes round. The
/// requests are dropped before the lists they were made from.
struct Requests {
    reqs: Vec<XferRequest>,
    _lists: (XferDlistHandle, XferDlistHandle),
}

fn prepare_requests(agent: &Agent, ring: &SlotRing, remote: &DescList) -> Result<Requests> {
    let local_prep = agent
        .prepare_xfer_dlist("", &ring.descs().to_xfer_dlist()?, None)
        .context("preparing our slot list")?;
    let remote_prep = agent
        .prepare_xfer_dlist(RECEIVER, &remote.to_xfer_dlist()?, None)
        .context("preparing the receiver's slot list")?;
    let reqs = (0..ring.slots() as i32)
        .map(|i| agent.make_xfer_req(XferOp::Write, &local_prep, &[i], &remote_prep, &[i], None))
        .collect::<Result<Vec<_>, _>>()
        .context("making the per-slot WRITE requests")?;
    Ok(Requests {
        reqs,
        _lists: (local_prep, remote_prep),
    })
}

/// The sender's prepared requests, one per slot, and which are in flight.
struct Pipeline<'a> {
    agent: &'a Agent,
    requests: Requests,
    /// Slots with a posted request not yet seen complete, oldest first.
    in_flight: VecDeque<usize>,
    busy: Vec<bool>,
}

impl Pipeline<'_> {
    /// Checks the oldest in-flight requests until one is still running.
    /// Checking is what makes NIXL send a completed transfer's
    /// notification (the UCX backend sends it from `checkXfer` once the
    /// flush is done), so the sender must do this even while it waits.
    fn reap(&mut self) -> Result<usize> {
        let mut done = 0;
        while let Some(&slot) = self.in_flight.front() {
            match self.agent.get_xfer_status(&self.requests.reqs[slot]) {
                Ok(XferStatus::Success) => {
                    self.in_flight.pop_front();
                    self.busy[slot] = false;
                    done += 1;
                }
                Ok(XferStatus::InProgress) => break,
                Err(e) => bail!("the WRITE into slot {slot} failed: {e} (did the receiver exit?)"),
            }
        }
        Ok(done)
    }
}

/// Backpressure: how far ahead of the receiver the sender may get, and
/// what holding back cost.
struct Backpressure {
    /// Wait when this many sequences ahead of the receiver's last report
    /// (`None`: --no-backpressure).
    at: Option<u64>,
    waits: u64,
    time: Duration,
    /// The most sequences posted that the receiver had not reported consumed.
    max_ahead: u64,
}

/// Filling slots ahead of their WRITEs, in batches.
struct FillAhead {
    /// Slots per batch; 0 fills each slot right before its WRITE.
    k: u64,
    vram: bool,
    /// The phase the fills are timed as.
    phase: &'static str,
    /// Sequences below this have their fill done or queued.
    staged_to: u64,
    /// The first sequence of the batch queued and not yet waited for.
    wait_at: Option<u64>,
}

/// What the sender measured, for the report.
struct Measured {
    bytes: u64,
    /// From the first post to the receiver's last progress report.
    elapsed: Duration,
    /// From the first post to the last.
    send_end: Duration,
}

impl Measured {
    /// GB/s over `elapsed`.
    fn rate(&self) -> f64 {
        gbps(self.bytes, self.elapsed)
    }
}

/// The sender's loop state: its requests, the receiver's progress,
/// backpressure, fill-ahead, and where its time went.
struct SenderLoop<'a> {
    args: &'a Args,
    agent: &'a Agent,
    pipe: Pipeline<'a>,
    inbox: NotifInbox,
    /// Replaces a request's notification at post time (`S:<seq>`), so the
    /// prepared requests stay as they are.
    notif: OptArgs,
    phases: Phases,
    /// The receiver has consumed the sequences below this (its last `P:<n>`).
    progress: u64,
    bp: Backpressure,
    fill: FillAhead,
}

impl<'a> SenderLoop<'a> {
    /// Sizes the fill-ahead batches and reserves their staging.
    fn new(
        args: &'a Args,
        agent: &'a Agent,
        ring: &mut SlotRing,
        requests: Requests,
        inbox: NotifInbox,
    ) -> Result<Self> {
        let n = ring.slots();
        let mut notif = OptArgs::new()?;
        notif.set_has_notification(true)?;
        // With --fill-ahead (the default for VRAM) slots are filled ahead in
        // batches (see queue_fills). VRAM: the headers and pattern go into
        // pinned staging and async H2D copies take them into the next batch's
        // slots while this batch's WRITEs are posted; one wait per batch,
        // right before its first WRITE. DRAM (by default): each slot is filled
        // in place right before its WRITE, as always; with --fill-ahead, in
        // place a batch at a time (the same schedule, no copies to wait for).
        let vram = ring.mem_type() == MemType::Vram;
        let want = args
            .fill_ahead
            .map_or(if vram { FILL_AHEAD } else { 0 }, |k| k as usize);
        let k = want.min(n).min(args.staging_slots(vram)) as u64;
        ring.reserve_staging(k as usize * args.staging_per_slot(), 0)?;
        ring.reset_copy_stats();
        Ok(Self {
            args,
            agent,
            pipe: Pipeline {
                agent,
                requests,
                in_flight: VecDeque::with_capacity(n),
                busy: vec![false; n],
            },
            inbox,
            notif,
            phases: Phases::default(),
            progress: 0,
            bp: Backpressure {
                at: (!args.ring.no_backpressure).then(|| args.ring.at()),
                waits: 0,
                time: Duration::ZERO,
                max_ahead: 0,
            },
            fill: FillAhead {
                k,
                vram,
                phase: if k == 0 {
                    "fill slot (header + pattern)"
                } else if vram {
                    "fill ahead: stage + queue H2D copies"
                } else {
                    "fill ahead (in place)"
                },
                staged_to: 0,
                wait_at: None,
            },
        })
    }

    /// Posts every sequence's WRITE into its slot, in order.
    fn stream(&mut self, ring: &mut SlotRing) -> Result<()> {
        let total = self.args.ring.num_transfers;
        for seq in 0..total {
            self.respect_backpressure(seq)?;
            self.fill(ring, seq)?;
            self.post(seq)?;
            self.reap()?;
            self.fill_next_batch(ring, seq)?;
            if (seq + 1) % REPORT_EVERY == 0 {
                say!(
                    "[{SENDER}] Sent {}/{total} (receiver at {})",
                    seq + 1,
                    self.progress
                );
            }
        }
        Ok(())
    }

    /// Waits while `seq` is too far ahead of the receiver's last report,
    /// reaping completions (which sends their notifications) meanwhile.
    fn respect_backpressure(&mut self, seq: u64) -> Result<()> {
        let Some(at) = self.bp.at else {
            return Ok(());
        };
        if seq - self.progress < at {
            return Ok(());
        }
        self.bp.waits += 1;
        let (t, timeout) = (Instant::now(), self.args.timeout());
        let progress = Cell::new(self.progress);
        poll(
            timeout,
            Pace::Yield,
            || {
                self.pipe.reap()?;
                self.poll_receiver()?;
                progress.set(self.progress);
                Ok((seq - self.progress < at).then_some(()))
            },
            |_| {
                anyhow::anyhow!(
                    "the receiver reported no progress for {timeout:?} (it is at {}, we are at {seq}): did it stop?",
                    progress.get()
                )
            },
        )?;
        self.bp.time += t.elapsed();
        self.phases.add("backpressure wait", t.elapsed());
        Ok(())
    }

    /// Makes sure `seq`'s slot holds `seq` before its WRITE: filled now
    /// (after the slot's previous WRITE completed), or in a batch queued
    /// earlier and waited for here.
    fn fill(&mut self, ring: &mut SlotRing, seq: u64) -> Result<()> {
        let slot = (seq % ring.slots() as u64) as usize;
        if seq >= self.fill.staged_to {
            self.wait_for_slot(slot)?;
            let (args, busy, k) = (self.args, &self.pipe.busy, self.fill.k);
            if k > 0 {
                // Not queued ahead (the first batch, or the previous one
                // stopped at a slot still being written from): from here.
                self.fill.staged_to = self.phases.time(self.fill.phase, || {
                    queue_fills(args, ring, busy, seq, seq, k)
                })?;
                self.fill.wait_at = Some(seq);
            } else {
                self.phases.time(self.fill.phase, || {
                    ring.fill(slot, args.seed, seq, &args.ranges(seq))
                })?;
            }
        }
        if self.fill.wait_at.is_some_and(|w| seq >= w) {
            // The copies of this slot's batch must have landed before NIXL
            // reads the slot. UCX's cuda_ipc copy runs on its own stream,
            // not ordered after ours: only a host-side wait orders them.
            // One wait per batch, before its first WRITE; the batch was
            // queued a batch earlier, so its copies are usually done.
            if self.fill.vram {
                self.phases
                    .time("fill ahead: wait for H2D copies (1 sync/batch)", || {
                        ring.fill_wait()
                    })?;
            }
            self.fill.wait_at = None;
        }
        Ok(())
    }

    /// Waits until the previous WRITE out of `slot` has completed: NIXL
    /// may still be reading it.
    fn wait_for_slot(&mut self, slot: usize) -> Result<()> {
        if !self.pipe.busy[slot] {
            return Ok(());
        }
        let (t, timeout) = (Instant::now(), self.args.timeout());
        let pipe = &mut self.pipe;
        poll(
            timeout,
            Pace::Yield,
            || {
                pipe.reap()?;
                Ok((!pipe.busy[slot]).then_some(()))
            },
            |_| {
                anyhow::anyhow!(
                    "the previous WRITE into slot {slot} did not complete within {timeout:?}"
                )
            },
        )?;
        self.phases
            .add("wait for slot (previous WRITE)", t.elapsed());
        Ok(())
    }

    /// Posts `seq`'s slot's prepared WRITE with the notification `S:<seq>`.
    fn post(&mut self, seq: u64) -> Result<()> {
        let slot = (seq % self.pipe.busy.len() as u64) as usize;
        let t = Instant::now();
        self.notif
            .set_notification_message(format!("S:{seq}").as_bytes())?;
        self.agent
            .post_xfer_req(&self.pipe.requests.reqs[slot], Some(&self.notif))
            .map_err(|e| anyhow::anyhow!("posting the WRITE of sequence {seq} failed: {e}"))?;
        self.pipe.busy[slot] = true;
        self.pipe.in_flight.push_back(slot);
        self.phases.add("post WRITE", t.elapsed());
        // Sequences posted that the receiver has not reported consumed.
        self.bp.max_ahead = self.bp.max_ahead.max(seq + 1 - self.progress);
        Ok(())
    }

    /// Reaps completed WRITEs and takes the receiver's progress reports.
    fn reap(&mut self) -> Result<()> {
        let t = Instant::now();
        self.pipe.reap()?;
        self.poll_receiver()?;
        self.phases
            .add("check completions + notifications", t.elapsed());
        Ok(())
    }

    /// Takes newly arrived notifications and the progress they report.
    fn poll_receiver(&mut self) -> Result<()> {
        self.inbox.poll(self.agent)?;
        self.progress = take_progress(&mut self.inbox, self.progress)?;
        Ok(())
    }

    /// Once the current batch's copies are waited for, queues the next.
    fn fill_next_batch(&mut self, ring: &mut SlotRing, seq: u64) -> Result<()> {
        let (args, busy, k) = (self.args, &self.pipe.busy, self.fill.k);
        if k > 0 && self.fill.wait_at.is_none() && self.fill.staged_to < args.ring.num_transfers {
            // This batch's copies are done (its first WRITE is posted), so
            // the staging is free: queue the next batch now, so its copies
            // run while this batch's WRITEs are posted. (If its first slot
            // is still being written from, this is tried again after the
            // next post, or done at the top of the loop.)
            let from = self.fill.staged_to;
            self.fill.staged_to = self.phases.time(self.fill.phase, || {
                queue_fills(args, ring, busy, from, seq + 1, k)
            })?;
            if self.fill.staged_to > from {
                self.fill.wait_at = Some(from);
            }
        }
        Ok(())
    }

    /// Waits for the last WRITEs to complete and for the receiver's final
    /// progress report.
    fn drain(&mut self) -> Result<()> {
        let (t, timeout, total) = (
            Instant::now(),
            self.args.timeout(),
            self.args.ring.num_transfers,
        );
        let left = Cell::new(self.pipe.in_flight.len());
        let pipe = &mut self.pipe;
        poll(
            timeout,
            Pace::Yield,
            || {
                pipe.reap()?;
                left.set(pipe.in_flight.len());
                Ok(pipe.in_flight.is_empty().then_some(()))
            },
            |_| {
                anyhow::anyhow!(
                    "{} WRITE(s) did not complete within {timeout:?}",
                    left.get()
                )
            },
        )?;
        self.phases.add("drain: last completions", t.elapsed());
        let t = Instant::now();
        let progress = Cell::new(self.progress);
        poll(
            timeout,
            Pace::Yield,
            || {
                self.poll_receiver()?;
                progress.set(self.progress);
                Ok((self.progress >= total).then_some(()))
            },
            |_| {
                anyhow::anyhow!(
                    "the receiver's final progress report did not arrive within {timeout:?} (it is at {} of {total})",
                    progress.get()
                )
            },
        )?;
        self.phases
            .add("drain: receiver's final progress", t.elapsed());
        Ok(())
    }

    /// The receiver's statistics (`STATS:`), then `DONE`: it may go.
    fn receiver_stats(&mut self) -> Result<serde_json::Value> {
        let stats = self
            .inbox
            .wait_matching(
                self.agent,
                RECEIVER,
                |m| m.starts_with(b"STATS:"),
                self.args.timeout(),
            )
            .context("waiting for the receiver's statistics")?;
        let rstats =
            serde_json::from_slice(&stats[6..]).context("decoding the receiver's statistics")?;
        self.agent
            .send_notification(RECEIVER, b"DONE", None)
            .map_err(|e| anyhow::anyhow!("sending DONE to {RECEIVER} failed: {e}"))?;
        Ok(rstats)
    }

    /// Prints the sender's results.
    fn report(&self, ring: &SlotRing, baseline: Option<&Baseline>, run: &Measured) {
        let (total, rate) = (self.args.ring.num_transfers, run.rate());
        say!(
            "[{SENDER}] Completed {total} transfers ({:.2} GB) in {:.3} s: {rate:.2} GB/s (first post to the receiver's last progress report)",
            run.bytes as f64 / 1e9,
            run.elapsed.as_secs_f64()
        );
        say!(
            "[{SENDER}] Send-only time: {:.3} s ({:.2} GB/s)",
            run.send_end.as_secs_f64(),
            gbps(run.bytes, run.send_end)
        );
        say!(
            "[{SENDER}] Backpressure: {} waits, {:.1} ms, max ahead: {}/{}{}",
            self.bp.waits,
            ms(self.bp.time),
            self.bp.max_ahead,
            ring.slots(),
            if self.bp.at.is_some() {
                ""
            } else {
                " (disabled)"
            }
        );
        self.phases.print(SENDER, run.elapsed, total);
        if let Some(c) = ring.copy_stats() {
            say!(
                "[{SENDER}] Filled ahead in batches of up to {} slots, one wait each; H2D staging: {}",
                self.fill.k,
                c.summary()
            );
        }
        let Some(b) = baseline else { return };
        let r = rate / b.median;
        say!(
            "[{SENDER}] Streaming {rate:.2} GB/s vs single {:.2} GB WRITEs {:.2} GB/s (median): ratio {r:.2} ({:.2} against the best)",
            b.bytes as f64 / 1e9,
            b.median,
            rate / b.best
        );
        let fill = self.phases.get(self.fill.phase);
        if pct(fill, run.elapsed) > 25.0 {
            say!(
                "[{SENDER}] Note: {:.0}% of the time went into generating the pattern (--verify full); --verify sample measures the transfer pipeline alone",
                pct(fill, run.elapsed)
            );
        }
    }

    /// The run as JSON (--json), the receiver's statistics included.
    fn json(
        &self,
        exchange: &Exchange,
        ring: &SlotRing,
        baseline: Option<&Baseline>,
        run: &Measured,
        rstats: &serde_json::Value,
    ) -> serde_json::Value {
        let (args, rate) = (self.args, run.rate());
        json!({
            "example": "send_recv_bench",
            "metadata": exchange.mode().name(),
            "memory": args.memory.name(),
            "verify": args.verify.name(),
            "num_buffers": ring.slots(),
            "buffer_size": args.ring.buffer_size,
            "num_transfers": args.ring.num_transfers,
            "progress_every": args.ring.every(),
            "backpressure_at": self.bp.at,
            "bytes": run.bytes,
            "seconds": run.elapsed.as_secs_f64(),
            "gbps": rate,
            "send_only_seconds": run.send_end.as_secs_f64(),
            "baseline": baseline.map(|b| json!({
                "bytes": b.bytes, "reps": b.gbps.len(), "gbps_median": b.median, "gbps_best": b.best, "gbps_all": b.gbps,
            })),
            "ratio": baseline.map(|b| rate / b.median),
            "ratio_to_best": baseline.map(|b| rate / b.best),
            "backpressure": { "waits": self.bp.waits, "wait_ms": ms(self.bp.time), "max_ahead": self.bp.max_ahead },
            "sender_phases_ms": self.phases.json(),
            "fill_ahead": self.fill.k,
            "sender_copies": ring.copy_stats().map(|c| c.json()),
            "receiver": rstats,
        })
    }
}

/// Queues the fills of sequences `from..`, at most `k` of them, as one
/// batch (one [`SlotRing::fill_queue`]: VRAM, async copies; DRAM, filled
/// in place); returns the first sequence not queued. It stops
/// - at the end of the run;
/// - a ring ahead of `next_post`, the next sequence to be posted: the
///   sequences queued and not yet posted then all have different slots,
///   so none is overwritten before its WRITE is posted;
/// - at a slot whose previous WRITE is still in flight (`busy`): NIXL
///   may still be reading it.
///
/// The caller waits for the batch ([`SlotRing::fill_wait`]) before posting
/// its first WRITE.
fn queue_fills(
    args: &Args,
    ring: &mut SlotRing,
    busy: &[bool],
    from: u64,
    next_post: u64,
    k: u64,
) -> Result<u64> {
    let n = ring.slots() as u64;
    let end = args.ring.num_transfers.min(from + k).min(next_post + n);
    let mut jobs = Vec::new();
    let mut seq = from;
    while seq < end && !busy[(seq % n) as usize] {
        jobs.push(SlotJob {
            slot: (seq % n) as usize,
            seq,
            ranges: args.ranges(seq),
        });
        seq += 1;
    }
    if !jobs.is_empty() {
        ring.fill_queue(args.seed, &jobs)?;
    }
    Ok(seq)
}

/// The bandwidth of single large transfers on the same rings: one WRITE of
/// the whole local ring into the whole remote ring, timed from post to
/// completion (which in NIXL's UCX backend includes the flush, so the data
/// is in the receiver's memory).
struct Baseline {
    bytes: u64,
    gbps: Vec<f64>,
    median: f64,
    best: f64,
}

fn baseline(args: &Args, agent: &Agent, ring: &SlotRing, remote: &DescList) -> Result<Baseline> {
    let first = remote.descs[0];
    let contiguous = remote
        .descs
        .iter()
        .enumerate()
        .all(|(i, d)| d.addr == first.addr + i as u64 * first.len);
    ensure!(
        contiguous,
        "the receiver's slots are not contiguous: the baseline needs one region (use --baseline-reps 0)"
    );
    let remote_whole = DescList::new(
        remote.mem_type,
        vec![Desc {
            addr: first.addr,
            len: first.len * remote.descs.len() as u64,
            dev_id: first.dev_id,
        }],
    );
    let req = agent
        .create_xfer_req(
            XferOp::Write,
            &ring.whole().to_xfer_dlist()?,
            &remote_whole.to_xfer_dlist()?,
            RECEIVER,
            None,
        )
        .context("creating the baseline WRITE")?;
    let bytes = ring.len() as u64;
    post_and_wait(agent, &req, "the baseline warm-up WRITE", args.timeout())?;
    let mut rates = Vec::new();
    for i in 0..args.baseline_reps {
        let d = post_and_wait(agent, &req, &format!("baseline WRITE {i}"), args.timeout())?;
        rates.push(gbps(bytes, d));
    }
    let mut sorted = rates.clone();
    sorted.sort_by(f64::total_cmp);
    let median = sorted[sorted.len() / 2];
    let best = *sorted.last().unwrap();
    say!(
        "[{SENDER}] Baseline: {} × one WRITE of the whole ring ({:.2} GB): median {median:.2} GB/s, best {best:.2} GB/s",
        args.baseline_reps,
        bytes as f64 / 1e9
    );
    Ok(Baseline {
        bytes,
        gbps: rates,
        median,
        best,
    })
}
