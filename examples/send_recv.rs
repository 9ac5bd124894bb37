//! Streaming with backpressure: a sender WRITEs into a ring of slots in a
//! receiver's memory, the receiver consumes and reports progress.
//!
//! The Rust port of the seeds' `send_recv` example (NIXL PR #980): 64 slots
//! × 16 MiB, 1000 transfers; the receiver sends `P:<n>` ("I have consumed
//! the first n") every num-buffers/4 transfers, and the sender waits when it
//! is num-buffers−4 transfers ahead. Transfer requests are prepared once
//! per slot (`prepXferDlist` + one `makeXferReq` per slot) and re-posted
//! every time the slot comes round.
//!
//! Every slot starts with an 8-byte sequence header. The seeds write header
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
//! Unlike the seeds, the receiver checks every payload byte against a
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
//! cargo run --release --example send_recv                          # hosts the store, spawns both roles
//! cargo run --release --example send_recv -- --metadata etcd       # NIXL's etcd exchange
//! cargo run --release --example send_recv -- --role receiver --port 9998   # one role by hand
//! ```

use std::collections::VecDeque;
use std::ops::Range;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use clap::{Parser, ValueEnum};
use nixl_examples::cli::EXIT_MISMATCH;
use nixl_examples::cli::{fmt_bytes, parse_bytes};
use nixl_examples::exchange::{Exchange, ExchangeArgs, ExchangeHost};
use nixl_examples::gpu::Gpu;
use nixl_examples::launch::{self, RoleSpec};
use nixl_examples::nixl::agent::create_polled_agent;
use nixl_examples::nixl::serdes::{Desc, DescList, MemType};
use nixl_examples::nixl::xfer::{NotifInbox, post_and_wait};
use nixl_examples::say;
use nixl_examples::slots::{EMPTY, HEADER_BYTES, SlotJob, SlotRing};
use nixl_sys::{Agent, OptArgs, XferOp, XferRequest, XferStatus};
use serde_json::json;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Role {
    /// Registers the slot ring, publishes it, consumes and verifies.
    Receiver,
    /// Writes sequence after sequence into the receiver's slots.
    Sender,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Memory {
    /// Host memory.
    Dram,
    /// GPU memory (--gpu).
    Vram,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Verify {
    /// Every payload byte is written and checked.
    Full,
    /// Header plus the first, the last and one sequence-dependent 4 KiB
    /// block of each payload; the rest of a slot keeps older bytes. For
    /// measuring the transfer pipeline without the cost of generating and
    /// checking every byte.
    Sample,
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
#[command(version)]
struct Args {
    /// Run only this role (the exchange must already be up).
    #[arg(long, value_enum)]
    role: Option<Role>,
    #[command(flatten)]
    exchange: ExchangeArgs,
    /// Seconds any single wait may take (metadata, a slot, progress).
    #[arg(short, long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    timeout: u64,
    /// Slots in the ring.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=4096))]
    num_buffers: u32,
    /// Payload bytes per slot (K, M, G suffixes: powers of 1024); each slot
    /// also has an 8-byte header.
    #[arg(long, default_value = "16M", value_parser = parse_bytes)]
    buffer_size: u64,
    /// Sequences to send.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..))]
    num_transfers: u64,
    /// The receiver reports progress every this many transfers
    /// [default: num-buffers/4, at least 1].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    progress_every: Option<u32>,
    /// The sender waits when this many transfers ahead of the receiver's
    /// last progress report [default: num-buffers-4, at least 1].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    backpressure_at: Option<u32>,
    /// Never wait for the receiver. Shows what backpressure prevents: with
    /// a receiver slower than the sender (--consume-us) slots are
    /// overwritten before they are consumed, the receiver counts the
    /// overruns and the run exits 3.
    #[arg(long)]
    no_backpressure: bool,
    /// Microseconds the receiver spends on each slot after checking it,
    /// as a slow consumer would.
    #[arg(long, default_value_t = 0)]
    consume_us: u64,
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
    #[arg(long, value_enum, default_value_t = Verify::Full)]
    verify: Verify,
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
    fn progress_every(&self) -> u64 {
        self.progress_every.unwrap_or((self.num_buffers / 4).max(1)) as u64
    }
    fn backpressure_at(&self) -> u64 {
        self.backpressure_at
            .unwrap_or(self.num_buffers.saturating_sub(4).max(1)) as u64
    }
    fn timeout(&self) -> Duration {
        Duration::from_secs(self.timeout)
    }
    fn payload(&self) -> usize {
        self.buffer_size as usize
    }
}

const SENDER: &str = "sender";
const RECEIVER: &str = "receiver";
const SAMPLE_BLOCK: usize = 4096;
/// Progress lines on stdout every this many transfers (as the seeds).
const REPORT_EVERY: u64 = 100;
/// VRAM: the most pinned staging one batch of fills, or of checks, may
/// use; at least one slot's worth is used whatever this says.
const STAGING_BYTES: usize = 32 << 20;
/// VRAM: the most slots the sender fills ahead in one batch.
const FILL_AHEAD: usize = 16;

fn main() -> ExitCode {
    let args = Args::parse();
    if let Err(e) = check_args(&args) {
        eprintln!("error: {e}");
        return ExitCode::from(2);
    }
    let who = match args.role {
        None => "main",
        Some(Role::Sender) => SENDER,
        Some(Role::Receiver) => RECEIVER,
    };
    let result = match args.role {
        None => run_both(&args),
        Some(role) => run_role(&args, role),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("[{who}] error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// What clap cannot express: relations between options.
fn check_args(args: &Args) -> Result<()> {
    let (i, b, n) = (
        args.progress_every(),
        args.backpressure_at(),
        args.num_buffers as u64,
    );
    ensure!(
        b <= n,
        "--backpressure-at {b} exceeds --num-buffers {n}: the sender would overwrite slots the receiver has not consumed"
    );
    // The sender stops at `b` ahead and waits for a report; reports come
    // every `i`. With i > b the receiver could consume everything posted
    // without reaching the next report: both would wait forever.
    ensure!(
        i <= b,
        "--progress-every {i} exceeds --backpressure-at {b}: the sender would wait for a report that never comes"
    );
    ensure!(
        args.buffer_size
            .checked_add(8)
            .and_then(|s| s.checked_mul(n))
            .is_some_and(|t| t <= 1 << 40),
        "--num-buffers × --buffer-size is too large"
    );
    Ok(())
}

/// Hosts the exchange and runs both roles as child processes.
fn run_both(args: &Args) -> Result<ExitCode> {
    if args.memory == Memory::Vram {
        // Fail here, once, rather than in both children.
        nixl_examples::gpu::context::device_count()
            .context("--memory vram needs an NVIDIA GPU (use --memory dram on this machine)")?;
    }
    let host = ExchangeHost::start(&args.exchange, &[SENDER, RECEIVER], args.timeout())?;
    say!(
        "[main] Starting sender-receiver: {} slots × {}, {} transfers, {:?}, metadata via {}",
        args.num_buffers,
        fmt_bytes(args.buffer_size),
        args.num_transfers,
        args.memory,
        args.exchange.metadata.name()
    );
    let common = |role: &str, gpu: usize| -> Vec<String> {
        let mut v = vec!["--role".to_string(), role.to_string()];
        v.extend(args.exchange.to_args(host.port()));
        v.extend(
            [
                ("--timeout", args.timeout.to_string()),
                ("--num-buffers", args.num_buffers.to_string()),
                ("--buffer-size", args.buffer_size.to_string()),
                ("--num-transfers", args.num_transfers.to_string()),
                ("--progress-every", args.progress_every().to_string()),
                ("--backpressure-at", args.backpressure_at().to_string()),
                ("--memory", format!("{:?}", args.memory).to_lowercase()),
                ("--gpu", gpu.to_string()),
                ("--verify", format!("{:?}", args.verify).to_lowercase()),
                ("--baseline-reps", args.baseline_reps.to_string()),
                ("--seed", args.seed.to_string()),
                ("--consume-us", args.consume_us.to_string()),
            ]
            .into_iter()
            .flat_map(|(k, v)| [k.to_string(), v]),
        );
        if args.no_backpressure {
            v.push("--no-backpressure".into());
        }
        if let Some(k) = args.fill_ahead {
            v.extend(["--fill-ahead".into(), k.to_string()]);
        }
        if let Some(b) = args.check_batch {
            v.extend(["--check-batch".into(), b.to_string()]);
        }
        v
    };
    let mut sender_args = common(SENDER, args.sender_gpu.unwrap_or(args.gpu));
    if let Some(j) = &args.json {
        sender_args.extend(["--json".into(), j.display().to_string()]);
    }
    let roles = vec![
        RoleSpec::new(RECEIVER, common(RECEIVER, args.gpu)),
        RoleSpec::new(SENDER, sender_args),
    ];
    // A backstop only: every wait inside the roles is bounded by --timeout.
    // Allow the data to move at no less than 50 MB/s on top.
    let bytes = args.num_transfers as f64
        * args.buffer_size as f64
        * (1 + args.baseline_reps as u64) as f64;
    let deadline =
        args.timeout() * 3 + Duration::from_secs(10) + Duration::from_secs_f64(bytes / 50e6);
    let exits = launch::run_roles(roles, deadline)?;
    drop(host);
    let code = launch::overall(&exits);
    if exits.iter().all(|e| e.code == 0) {
        say!("[main] ✓ Success!");
    } else {
        eprintln!("[main] ✗ Error - {}", launch::summary(&exits));
    }
    Ok(code)
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
    let mut exchange = Exchange::join(&args.exchange, args.timeout())?;
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
        None => SlotRing::host(args.num_buffers as usize, args.payload()),
        Some(g) => SlotRing::device(g, args.num_buffers as usize, args.payload())?,
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

/// The byte ranges of a payload that `seq` fills and the receiver checks.
#[allow(clippy::single_range_in_vec_init)] // one range: the whole payload
fn check_ranges(verify: Verify, payload: usize, seq: u64) -> Vec<Range<usize>> {
    if verify == Verify::Full || payload <= 3 * SAMPLE_BLOCK {
        return vec![0..payload];
    }
    // A block chosen by the sequence number, so over a run every part of
    // the payload gets looked at somewhere.
    let blocks = payload / SAMPLE_BLOCK;
    let pick = (seq.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) as usize % blocks;
    let last = (payload - SAMPLE_BLOCK) & !7;
    let mut v = vec![
        0..SAMPLE_BLOCK,
        pick * SAMPLE_BLOCK..(pick + 1) * SAMPLE_BLOCK,
        last..payload,
    ];
    v.sort_by_key(|r| r.start);
    v.dedup_by(|b, a| b.start < a.end);
    v
}

/// The most payload bytes [`check_ranges`] gives one slot (a bound for
/// sizing staging).
fn max_check_bytes(verify: Verify, payload: usize) -> usize {
    if verify == Verify::Full || payload <= 3 * SAMPLE_BLOCK {
        payload
    } else {
        // Two blocks, and the last one, which also takes the payload's
        // tail after the last multiple of 8 (under 8 bytes).
        3 * SAMPLE_BLOCK + 8
    }
}

/// Accumulated time per phase of a loop.
#[derive(Default)]
struct Phases(Vec<(&'static str, Duration)>);

impl Phases {
    fn add(&mut self, name: &'static str, d: Duration) {
        match self.0.iter_mut().find(|(n, _)| *n == name) {
            Some((_, t)) => *t += d,
            None => self.0.push((name, d)),
        }
    }

    fn time<T>(&mut self, name: &'static str, f: impl FnOnce() -> T) -> T {
        let t = Instant::now();
        let r = f();
        self.add(name, t.elapsed());
        r
    }

    /// Lines `  name  12.34 ms (5.6%)  12.3 µs/transfer`, then what the
    /// phases do not cover.
    fn print(&self, who: &str, total: Duration, transfers: u64) {
        say!(
            "[{who}] Timing breakdown (of {:.3} s, {transfers} transfers):",
            total.as_secs_f64()
        );
        let per = |d: Duration| d.as_secs_f64() * 1e6 / transfers.max(1) as f64;
        let mut covered = Duration::ZERO;
        for (n, d) in &self.0 {
            covered += *d;
            say!(
                "  {n:<46} {:>10.2} ms ({:>5.1}%) {:>9.2} µs/transfer",
                ms(*d),
                pct(*d, total),
                per(*d)
            );
        }
        let other = total.saturating_sub(covered);
        say!(
            "  {:<46} {:>10.2} ms ({:>5.1}%) {:>9.2} µs/transfer",
            "other",
            ms(other),
            pct(other, total),
            per(other)
        );
    }

    fn json(&self) -> serde_json::Value {
        serde_json::Value::Object(
            self.0
                .iter()
                .map(|(n, d)| (n.to_string(), json!(ms(*d))))
                .collect(),
        )
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn pct(d: Duration, total: Duration) -> f64 {
    if total.is_zero() {
        0.0
    } else {
        100.0 * d.as_secs_f64() / total.as_secs_f64()
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

fn receiver(
    args: &Args,
    agent: &Agent,
    exchange: &mut Exchange,
    ring: &mut SlotRing,
) -> Result<ExitCode> {
    let timeout = args.timeout();
    let (n, total) = (ring.slots() as u64, args.num_transfers);
    exchange.publish(agent)?;
    exchange.offer_descs(agent, SENDER, &ring.descs())?;
    // The sender's metadata, for the progress notifications.
    exchange.load_peer(agent, SENDER)?;
    say!(
        "[{RECEIVER}] Connected to {SENDER} (metadata via {} at {})",
        exchange.mode().name(),
        exchange.endpoint()
    );
    say!("[{RECEIVER}] Initialized, starting main loop");

    let mut inbox = NotifInbox::new();
    let mut phases = Phases::default();
    let (mut overruns, mut mismatches, mut reports) = (0u64, 0u64, 0u64);
    let mut first_problem: Option<String> = None;
    let mut start: Option<Instant> = None;
    let mut first_wait_time = Duration::ZERO;
    // Slots are checked in batches. DRAM: a batch is one slot, checked in
    // place as soon as its notification arrives. VRAM: each arrival only
    // queues the async D2H copies of the slot's header and checked ranges
    // into pinned staging (no wait: the copies run while we wait for the
    // next notification); a complete batch is waited for with ONE stream
    // synchronisation and then checked. A batch ends at every progress
    // report or when the staging is full, so a report P:<n> is sent only
    // after sequences 0..n have all been copied out and checked. That is
    // what makes backpressure safe: the sender writes a slot again only
    // once our progress has passed its previous sequence, so no slot is
    // overwritten while its copy is queued or before it is checked.
    let vram = ring.mem_type() == MemType::Vram;
    let (every, payload) = (args.progress_every(), ring.payload());
    let per_slot = HEADER_BYTES + max_check_bytes(args.verify, payload);
    let staging_cap = if vram {
        (STAGING_BYTES / per_slot).max(1) as u64
    } else {
        u64::MAX
    };
    let want = args
        .check_batch
        .map_or(if vram { every } else { 1 }, u64::from);
    let max_batch = want.min(every).min(staging_cap).max(1);
    ring.reserve_staging(0, max_batch as usize * per_slot)?;
    ring.reset_copy_stats();
    let job = |seq: u64| SlotJob {
        slot: (seq % n) as usize,
        seq,
        ranges: check_ranges(args.verify, payload, seq),
    };
    let (mut next, mut verified, mut batches) = (0u64, 0u64, 0u64);
    while verified < total {
        // Never past the next progress report, so every report is sent
        // (the sender may be waiting for it), nor past the staging.
        let batch_end = total
            .min(verified + max_batch)
            .min((verified / every + 1) * every);
        let tag = format!("S:{next}").into_bytes();
        let t = Instant::now();
        let mut backoff = Backoff::default();
        loop {
            if inbox.take(SENDER, |m| m == tag.as_slice()).is_some() {
                break;
            }
            if t.elapsed() > timeout {
                bail!(
                    "sequence {next} did not arrive within {timeout:?} (no notification S:{next} from {SENDER}: did it stop?)"
                );
            }
            if inbox.poll(agent)? == 0 {
                backoff.idle();
            }
        }
        if next == 0 {
            first_wait_time = t.elapsed();
        }
        phases.add("wait for data (notification)", t.elapsed());
        // From the first arrival, as the seeds time it: waiting for the
        // sender's set-up and baseline is not part of the stream.
        start.get_or_insert_with(Instant::now);

        // This sequence and the batch's next ones whose notifications are
        // already here: copies of consecutive slots share calls.
        let mut jobs = vec![job(next)];
        next += 1;
        while next < batch_end
            && inbox
                .take(SENDER, |m| m == format!("S:{next}").as_bytes())
                .is_some()
        {
            jobs.push(job(next));
            next += 1;
        }
        if vram {
            phases.time("queue D2H copies (header + checked)", || {
                ring.queue_checks(jobs)
            })?;
        } else {
            ring.queue_checks(jobs)?;
        }
        if next < batch_end {
            continue;
        }

        if vram {
            phases.time("wait for D2H copies (1 sync/batch)", || ring.wait_queued())?;
        }
        let t = Instant::now();
        let checks = ring.check_queued(args.seed)?;
        batches += 1;
        let mut problems = Vec::new();
        for c in &checks {
            let (seq, slot, header) = (c.seq, c.slot, c.header);
            let problem = if header == seq {
                c.mismatch.map(|m| {
                    mismatches += 1;
                    format!("sequence {seq} (slot {slot}): payload {m}")
                })
            } else if header != EMPTY && header > seq && (header - seq) % n == 0 {
                overruns += 1;
                Some(format!(
                    "sequence {seq} (slot {slot}) was overwritten by sequence {header} before it was consumed"
                ))
            } else {
                mismatches += 1;
                Some(format!(
                    "sequence {seq} (slot {slot}): header holds {header:#x}"
                ))
            };
            problems.extend(problem);
        }
        phases.add("check header + verify payload", t.elapsed());
        for p in problems {
            if first_problem.is_none() {
                eprintln!("[{RECEIVER}] {p}");
            }
            first_problem.get_or_insert(p);
        }

        if args.consume_us > 0 {
            for _ in &checks {
                phases.time("consume (--consume-us)", || {
                    std::thread::sleep(Duration::from_micros(args.consume_us))
                });
            }
        }

        let before = verified;
        verified = batch_end;
        if verified % every == 0 || verified == total {
            let t = Instant::now();
            agent
                .send_notification(SENDER, format!("P:{verified}").as_bytes(), None)
                .map_err(|e| anyhow::anyhow!("sending progress to {SENDER} failed: {e}"))?;
            reports += 1;
            phases.add("send progress notifications", t.elapsed());
        }
        if verified / REPORT_EVERY > before / REPORT_EVERY {
            say!("[{RECEIVER}] Processed {verified}/{total}");
        }
    }
    let elapsed = start.map(|s| s.elapsed()).unwrap_or_default();
    // The first wait is not inside `elapsed`; leave it out of the shares too.
    if let Some((_, first_wait)) = phases
        .0
        .iter_mut()
        .find(|(n, _)| *n == "wait for data (notification)")
    {
        *first_wait = first_wait.saturating_sub(first_wait_time);
    }
    let bytes = total * ring.slot_len() as u64;
    say!(
        "[{RECEIVER}] Completed {total} transfers ({:.2} GB) in {:.3} s: {:.2} GB/s (first arrival to last verified)",
        bytes as f64 / 1e9,
        elapsed.as_secs_f64(),
        gbps(bytes, elapsed)
    );
    say!("[{RECEIVER}] Progress updates sent: {reports}");
    if overruns + mismatches == 0 {
        say!(
            "[{RECEIVER}] ✓ No buffer overrun (0 mismatches), every payload verified ({:?})",
            args.verify
        );
    } else {
        say!("[{RECEIVER}] ✗ {overruns} overrun(s), {mismatches} mismatch(es)");
    }
    phases.print(RECEIVER, elapsed, total);
    let copies = ring.copy_stats();
    if let Some(c) = &copies {
        say!(
            "[{RECEIVER}] Checked in {batches} batches of up to {max_batch} slots, one wait each; D2H staging: {}",
            c.summary()
        );
    }

    let stats = json!({
        "transfers": total,
        "seconds": elapsed.as_secs_f64(),
        "gbps": gbps(bytes, elapsed),
        "overruns": overruns,
        "mismatches": mismatches,
        "first_problem": first_problem,
        "progress_reports": reports,
        "check_batches": batches,
        "max_check_batch": max_batch,
        "copies": copies.map(|c| c.json()),
        "phases_ms": phases.json(),
    });
    agent
        .send_notification(SENDER, format!("STATS:{stats}").as_bytes(), None)
        .map_err(|e| anyhow::anyhow!("sending our statistics to {SENDER} failed: {e}"))?;
    // Keep the slots registered until the sender has nothing in flight.
    inbox.wait_for(agent, SENDER, b"DONE", timeout)?;
    say!("[{RECEIVER}] Done");
    Ok(if overruns + mismatches == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_MISMATCH as u8)
    })
}

// ------------------------------------------------------------------ sender

/// The sender's prepared requests, one per slot, and which are in flight.
struct Pipeline<'a> {
    agent: &'a Agent,
    reqs: Vec<XferRequest>,
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
            match self.agent.get_xfer_status(&self.reqs[slot]) {
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
    let (n, payload) = (ring.slots() as u64, ring.payload());
    let end = args.num_transfers.min(from + k).min(next_post + n);
    let mut jobs = Vec::new();
    let mut seq = from;
    while seq < end && !busy[(seq % n) as usize] {
        jobs.push(SlotJob {
            slot: (seq % n) as usize,
            seq,
            ranges: check_ranges(args.verify, payload, seq),
        });
        seq += 1;
    }
    if !jobs.is_empty() {
        ring.fill_queue(args.seed, &jobs)?;
    }
    Ok(seq)
}

fn sender(
    args: &Args,
    agent: &Agent,
    exchange: &mut Exchange,
    ring: &mut SlotRing,
) -> Result<ExitCode> {
    let timeout = args.timeout();
    let (n, total) = (ring.slots(), args.num_transfers);
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

    // Prepared once: both lists, then one request per slot, local [i] to remote [i].
    let local_prep = agent
        .prepare_xfer_dlist("", &ring.descs().to_xfer_dlist()?, None)
        .context("preparing our slot list")?;
    let remote_prep = agent
        .prepare_xfer_dlist(RECEIVER, &remote.to_xfer_dlist()?, None)
        .context("preparing the receiver's slot list")?;
    let reqs = (0..n as i32)
        .map(|i| agent.make_xfer_req(XferOp::Write, &local_prep, &[i], &remote_prep, &[i], None))
        .collect::<Result<Vec<_>, _>>()
        .context("making the per-slot WRITE requests")?;
    say!(
        "[{SENDER}] Ready: {n} slots × {} (+8 B header) in {:?}, {total} transfers, verify {:?}",
        fmt_bytes(ring.payload() as u64),
        ring.mem_type(),
        args.verify
    );

    let baseline = if args.baseline_reps > 0 {
        Some(baseline(args, agent, ring, &remote)?)
    } else {
        None
    };

    say!("[{SENDER}] Initialized, starting main loop");
    let mut pipe = Pipeline {
        agent,
        reqs,
        in_flight: VecDeque::with_capacity(n),
        busy: vec![false; n],
    };
    let mut notif = OptArgs::new()?;
    notif.set_has_notification(true)?;
    let mut phases = Phases::default();
    let (bp_at, backpressure) = (args.backpressure_at(), !args.no_backpressure);
    let (mut progress, mut bp_waits, mut bp_time, mut max_ahead) =
        (0u64, 0u64, Duration::ZERO, 0u64);
    // With --fill-ahead (the default for VRAM) slots are filled ahead in
    // batches (see queue_fills). VRAM: the headers and pattern go into
    // pinned staging and async H2D copies take them into the next batch's
    // slots while this batch's WRITEs are posted; one wait per batch,
    // right before its first WRITE. DRAM (by default): each slot is filled
    // in place right before its WRITE, as always; with --fill-ahead, in
    // place a batch at a time (the same schedule, no copies to wait for).
    let vram = ring.mem_type() == MemType::Vram;
    let per_slot = HEADER_BYTES + max_check_bytes(args.verify, ring.payload());
    let staging_cap = if vram {
        (STAGING_BYTES / per_slot).max(1)
    } else {
        usize::MAX
    };
    let want = args
        .fill_ahead
        .map_or(if vram { FILL_AHEAD } else { 0 }, |k| k as usize);
    let fill_ahead = want.min(n).min(staging_cap) as u64;
    let fill_phase = if vram {
        "fill ahead: stage + queue H2D copies"
    } else {
        "fill ahead (in place)"
    };
    ring.reserve_staging(fill_ahead as usize * per_slot, 0)?;
    // Sequences below this have their fill done or queued.
    let mut staged_to = 0u64;
    // The first sequence of the batch queued and not yet waited for.
    let mut wait_at: Option<u64> = None;
    ring.reset_copy_stats();
    let start = Instant::now();
    for seq in 0..total {
        let slot = (seq % n as u64) as usize;
        if backpressure && seq - progress >= bp_at {
            bp_waits += 1;
            let t = Instant::now();
            let mut backoff = Backoff::default();
            while seq - progress >= bp_at {
                if t.elapsed() > timeout {
                    bail!(
                        "the receiver reported no progress for {timeout:?} (it is at {progress}, we are at {seq}): did it stop?"
                    );
                }
                let reaped = pipe.reap()?;
                let got = inbox.poll(agent)?;
                progress = take_progress(&mut inbox, progress)?;
                if reaped + got == 0 {
                    backoff.idle();
                }
            }
            bp_time += t.elapsed();
            phases.add("backpressure wait", t.elapsed());
        }

        if seq >= staged_to {
            if pipe.busy[slot] {
                let t = Instant::now();
                let mut backoff = Backoff::default();
                while pipe.busy[slot] {
                    if t.elapsed() > timeout {
                        bail!(
                            "the previous WRITE into slot {slot} did not complete within {timeout:?}"
                        );
                    }
                    if pipe.reap()? == 0 {
                        backoff.idle();
                    }
                }
                phases.add("wait for slot (previous WRITE)", t.elapsed());
            }
            if fill_ahead > 0 {
                // Not queued ahead (the first batch, or the previous one
                // stopped at a slot still being written from): from here.
                staged_to = phases.time(fill_phase, || {
                    queue_fills(args, ring, &pipe.busy, seq, seq, fill_ahead)
                })?;
                wait_at = Some(seq);
            } else {
                phases.time("fill slot (header + pattern)", || {
                    ring.fill(
                        slot,
                        args.seed,
                        seq,
                        &check_ranges(args.verify, ring.payload(), seq),
                    )
                })?;
            }
        }
        if wait_at.is_some_and(|w| seq >= w) {
            // The copies of this slot's batch must have landed before NIXL
            // reads the slot. UCX's cuda_ipc copy runs on its own stream,
            // not ordered after ours: only a host-side wait orders them.
            // One wait per batch, before its first WRITE; the batch was
            // queued a batch earlier, so its copies are usually done.
            if vram {
                phases.time("fill ahead: wait for H2D copies (1 sync/batch)", || {
                    ring.fill_wait()
                })?;
            }
            wait_at = None;
        }

        let t = Instant::now();
        notif.set_notification_message(format!("S:{seq}").as_bytes())?;
        agent
            .post_xfer_req(&pipe.reqs[slot], Some(&notif))
            .map_err(|e| anyhow::anyhow!("posting the WRITE of sequence {seq} failed: {e}"))?;
        pipe.busy[slot] = true;
        pipe.in_flight.push_back(slot);
        phases.add("post WRITE", t.elapsed());
        // Sequences posted that the receiver has not reported consumed.
        max_ahead = max_ahead.max(seq + 1 - progress);

        let t = Instant::now();
        pipe.reap()?;
        inbox.poll(agent)?;
        progress = take_progress(&mut inbox, progress)?;
        phases.add("check completions + notifications", t.elapsed());
        if fill_ahead > 0 && wait_at.is_none() && staged_to < total {
            // This batch's copies are done (its first WRITE is posted), so
            // the staging is free: queue the next batch now, so its copies
            // run while this batch's WRITEs are posted. (If its first slot
            // is still being written from, this is tried again after the
            // next post, or done at the top of the loop.)
            let from = staged_to;
            staged_to = phases.time(fill_phase, || {
                queue_fills(args, ring, &pipe.busy, from, seq + 1, fill_ahead)
            })?;
            if staged_to > from {
                wait_at = Some(from);
            }
        }
        if (seq + 1) % REPORT_EVERY == 0 {
            say!(
                "[{SENDER}] Sent {}/{total} (receiver at {progress})",
                seq + 1
            );
        }
    }
    let send_end = start.elapsed();

    let t = Instant::now();
    let mut backoff = Backoff::default();
    while !pipe.in_flight.is_empty() {
        if t.elapsed() > timeout {
            bail!(
                "{} WRITE(s) did not complete within {timeout:?}",
                pipe.in_flight.len()
            );
        }
        if pipe.reap()? == 0 {
            backoff.idle();
        }
    }
    phases.add("drain: last completions", t.elapsed());
    let t = Instant::now();
    let mut backoff = Backoff::default();
    while progress < total {
        if t.elapsed() > timeout {
            bail!(
                "the receiver's final progress report did not arrive within {timeout:?} (it is at {progress} of {total})"
            );
        }
        if inbox.poll(agent)? == 0 {
            backoff.idle();
        }
        progress = take_progress(&mut inbox, progress)?;
    }
    phases.add("drain: receiver's final progress", t.elapsed());
    let elapsed = start.elapsed();

    let stats = inbox
        .wait_matching(agent, RECEIVER, |m| m.starts_with(b"STATS:"), timeout)
        .context("waiting for the receiver's statistics")?;
    let rstats: serde_json::Value =
        serde_json::from_slice(&stats[6..]).context("decoding the receiver's statistics")?;
    agent
        .send_notification(RECEIVER, b"DONE", None)
        .map_err(|e| anyhow::anyhow!("sending DONE to {RECEIVER} failed: {e}"))?;

    let bytes = total * ring.slot_len() as u64;
    let rate = gbps(bytes, elapsed);
    say!(
        "[{SENDER}] Completed {total} transfers ({:.2} GB) in {:.3} s: {rate:.2} GB/s (first post to the receiver's last progress report)",
        bytes as f64 / 1e9,
        elapsed.as_secs_f64()
    );
    say!(
        "[{SENDER}] Send-only time: {:.3} s ({:.2} GB/s)",
        send_end.as_secs_f64(),
        gbps(bytes, send_end)
    );
    say!(
        "[{SENDER}] Backpressure: {bp_waits} waits, {:.1} ms, max ahead: {max_ahead}/{n}{}",
        ms(bp_time),
        if backpressure { "" } else { " (disabled)" }
    );
    phases.print(SENDER, elapsed, total);
    let copies = ring.copy_stats();
    if let Some(c) = &copies {
        say!(
            "[{SENDER}] Filled ahead in batches of up to {fill_ahead} slots, one wait each; H2D staging: {}",
            c.summary()
        );
    }
    let ratio = baseline.as_ref().map(|b| rate / b.median);
    if let (Some(b), Some(r)) = (&baseline, ratio) {
        say!(
            "[{SENDER}] Streaming {rate:.2} GB/s vs single {:.2} GB WRITEs {:.2} GB/s (median): ratio {r:.2} (goal ≥ 0.80; {:.2} against the best)",
            b.bytes as f64 / 1e9,
            b.median,
            rate / b.best
        );
        let fill = phases
            .0
            .iter()
            .find(|(n, _)| n.starts_with("fill"))
            .map_or(Duration::ZERO, |p| p.1);
        if r < 0.8 && pct(fill, elapsed) > 25.0 {
            say!(
                "[{SENDER}] Note: {:.0}% of the time went into generating the pattern (--verify full); --verify sample measures the transfer pipeline alone",
                pct(fill, elapsed)
            );
        }
    }

    let overruns = rstats["overruns"].as_u64().unwrap_or(0);
    let mismatches = rstats["mismatches"].as_u64().unwrap_or(0);
    if let Some(path) = &args.json {
        let out = json!({
            "example": "send_recv",
            "metadata": exchange.mode().name(),
            "memory": format!("{:?}", args.memory).to_lowercase(),
            "verify": format!("{:?}", args.verify).to_lowercase(),
            "num_buffers": n,
            "buffer_size": args.buffer_size,
            "num_transfers": total,
            "progress_every": args.progress_every(),
            "backpressure_at": if backpressure { json!(bp_at) } else { json!(null) },
            "bytes": bytes,
            "seconds": elapsed.as_secs_f64(),
            "gbps": rate,
            "send_only_seconds": send_end.as_secs_f64(),
            "baseline": baseline.as_ref().map(|b| json!({
                "bytes": b.bytes, "reps": b.gbps.len(), "gbps_median": b.median, "gbps_best": b.best, "gbps_all": b.gbps,
            })),
            "ratio": ratio,
            "ratio_to_best": baseline.as_ref().map(|b| rate / b.best),
            "backpressure": { "waits": bp_waits, "wait_ms": ms(bp_time), "max_ahead": max_ahead },
            "sender_phases_ms": phases.json(),
            "fill_ahead": fill_ahead,
            "sender_copies": copies.map(|c| c.json()),
            "receiver": rstats,
        });
        std::fs::write(path, format!("{out:#}\n"))
            .with_context(|| format!("writing {}", path.display()))?;
    }
    say!("[{SENDER}] Done");
    drop((pipe, local_prep, remote_prep));
    Ok(if overruns + mismatches == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_MISMATCH as u8)
    })
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

/// Waiting without taking a core from the peer (the machine may have only
/// two): yield for the first polls, then sleep 20 µs between polls.
/// Spinning alone measured up to 30% lower throughput here, sleeping
/// alone adds 20 µs to every short wait.
#[derive(Default)]
struct Backoff(u32);

impl Backoff {
    fn idle(&mut self) {
        if self.0 < 64 {
            self.0 += 1;
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(20));
        }
    }
}
