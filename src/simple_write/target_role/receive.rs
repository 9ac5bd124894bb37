//! The target's rounds: wait on the GPU for every signal of the round,
//! acknowledge, then verify the data and publish the verdict.

use anyhow::{Result, bail};
use cudarc::driver::CudaStream;

use super::held::Held;
use crate::cli::DataMismatch;
use crate::gpu::DeviceBuffer;
use crate::gpu::kernels::{KernelReport, wait_value_geq};
use crate::gpu::ll;
use crate::gpu::run::run_watched;
use crate::group::Member;
use crate::nixl::view::MemViewElem;
use crate::simple_write::kernels::{AckMode, Path, WaitMode, WaitParams, WritePath};
use crate::simple_write::plan::Round;
use crate::simple_write::protocol::{self as p, Verdict};
use crate::stats::Summary;
use crate::{pattern, say};

/// Receives every round of the plan; after a round whose data did not
/// verify it publishes the verdict and fails with [`DataMismatch`].
pub(super) fn run_all(held: &Held, member: &Member) -> Result<()> {
    if held.wait == WaitMode::Stream && held.plan.rounds.iter().any(|r| polls_lines(r.path)) {
        tracing::info!(
            "note: LL and LL128 rounds poll their lines with a spinning kernel, and this GPU time-slices between the two \
             processes: each direction then waits for a time slice (milliseconds); run under MPS (--mps) or \
             across GPUs to measure LL"
        );
    }
    let mut host = vec![0u8; held.plan.max_wire_size() as usize];
    let (mut signal_base, mut first_iter, mut ack_base) = (0u64, 0u32, 0u64);
    for (i, round) in held.plan.rounds.iter().enumerate() {
        // Not before the initiator says so: its baselines must run alone.
        member.get(&p::go(i), p::INITIATOR, "start of the round")?;
        let wait = Wait {
            held,
            round,
            index: i,
            base: signal_base,
            first_iter,
            ack_base,
        };
        let (report, stamps) = wait.run(member)?;
        if i == 0 {
            say!("[target] Signal received!");
        }
        let n = round.wire_span() as usize;
        if n > 0 {
            held.data.download(&held.gpu.stream, &mut host[..n])?;
        }
        // Cleared before the initiator may start the next round, so a put
        // that silently wrote nothing can never pass on stale data.
        held.data.zero(&held.gpu.stream)?;
        held.done.zero(&held.gpu.stream)?;
        let arrivals = match &stamps {
            Some(st) => Some(arrival_intervals(
                held,
                st,
                round.iters as usize,
                report.t_start_ns,
            )?),
            None => None,
        };
        let variant = round.final_variant(first_iter);
        let verdict = if round.slots > 1 {
            judge_slots(&host[..n], held.plan.seed, first_iter, arrivals, round)
        } else {
            match payload_of(&host[..n], round, wait.last_seq()) {
                Ok(data) => judge(&data, held.plan.seed, variant, arrivals, i, round),
                Err(e) => line_mismatch(&host[..n], round, e),
            }
        };
        member.put(&p::verdict(i), &verdict)?;
        if let Verdict::Mismatch { first, .. } = verdict {
            return Err(DataMismatch(format!("round {i}: {first}")).into());
        }
        signal_base = wait.end();
        first_iter += round.warmup + round.iters;
        ack_base += round.acks();
    }
    Ok(())
}

/// Whether rounds on `path` carry their own flags in lines (LL, LL128),
/// which only a kernel can poll: no word for a stream wait to watch.
fn polls_lines(path: WritePath) -> bool {
    path == Path::Ll || path == Path::Ll128
}

/// The payload the round left in our buffer: the bytes themselves, or on
/// the LL path the lines' data once every line's flags carry the round's
/// last sequence number; on the LL128 path the same of the wait kernel's
/// copy of the lines as it read them ([`Round::seen_copy`]).
fn payload_of<'a>(
    buf: &'a [u8],
    round: &Round,
    last_seq: u32,
) -> Result<std::borrow::Cow<'a, [u8]>, ll::LineMismatch> {
    match round.path {
        WritePath::Data(Path::Ll) => ll::LL
            .unpack(buf, round.size as usize, last_seq)
            .map(Into::into),
        WritePath::Data(Path::Ll128) => {
            let (at, n) = round.seen_copy().expect("an LL128 round has a copy");
            let seen = &buf[at as usize..(at + n) as usize];
            ll::LL128
                .unpack(seen, round.size as usize, last_seq)
                .map(Into::into)
        }
        _ => Ok(buf.into()),
    }
}

/// A line (LL, LL128) without the last iteration's flags: wrong data as well.
fn line_mismatch(buf: &[u8], round: &Round, e: ll::LineMismatch) -> Verdict {
    let checksum = pattern::byte_sum(buf);
    eprintln!(
        "[target] ✗ {} lines MISMATCH: round of {} B, {}: {e}",
        e.protocol, round.size, round.level
    );
    Verdict::Mismatch {
        checksum,
        expected_checksum: 0,
        first: e.to_string(),
    }
}

/// Checks the received bytes against the pattern; prints upstream's
/// checksum line (✓ on stdout, ✗ with the first wrong byte on stderr).
fn judge(
    data: &[u8],
    seed: u64,
    variant: u64,
    arrivals: Option<Summary>,
    index: usize,
    round: &Round,
) -> Verdict {
    let checksum = pattern::byte_sum(data);
    match pattern::verify(data, seed, variant) {
        None => {
            say!("[target] ✓ Checksum OK: {checksum}");
            Verdict::Ok { checksum, arrivals }
        }
        Some(m) => {
            let mut expected = vec![0u8; data.len()];
            pattern::fill(&mut expected, seed, variant);
            let expected_checksum = pattern::byte_sum(&expected);
            crate::eline!(
                "[target] ✗ Checksum MISMATCH: got={checksum} expected={expected_checksum}"
            );
            crate::eline!(
                "[target]   round {index} ({} B, {}): {m}",
                round.size,
                round.level
            );
            Verdict::Mismatch {
                checksum,
                expected_checksum,
                first: m.to_string(),
            }
        }
    }
}

/// `--hbm`: checks every slot the round wrote against the pattern where
/// the sources hold it (slot `k` at byte `k × slot_bytes`), with the
/// variant of its last writer ([`Round::slot_writers`]).
fn judge_slots(
    buf: &[u8],
    seed: u64,
    first_iter: u32,
    arrivals: Option<Summary>,
    round: &Round,
) -> Verdict {
    let (size, stride) = (round.size as usize, round.slot_bytes() as usize);
    let writers = round.slot_writers(first_iter);
    let mut checksum = 0;
    for &(slot, variant) in &writers {
        let at = slot as usize * stride;
        let data = &buf[at..at + size];
        checksum += pattern::byte_sum(data);
        if let Some(m) = pattern::verify_at(data, at as u64, seed, variant) {
            let first = format!("slot {slot} of {} (bytes {at}..): {m}", round.slots);
            crate::eline!(
                "[target] ✗ MISMATCH: round of {size} B, {}, {first}",
                round.level
            );
            return Verdict::Mismatch {
                checksum,
                expected_checksum: 0,
                first,
            };
        }
    }
    say!(
        "[target] ✓ Checksum OK: {checksum} ({} of {} slots written and checked)",
        writers.len(),
        round.slots
    );
    Verdict::Ok { checksum, arrivals }
}

/// One round's wait on the target's GPU, in either wait mode.
struct Wait<'a> {
    held: &'a Held,
    round: &'a Round,
    index: usize,
    /// The signal's value before the round.
    base: u64,
    /// Global index of the round's first iteration.
    first_iter: u32,
    /// The initiator's ack word before the round.
    ack_base: u64,
}

impl Wait<'_> {
    /// The signal's value once every group has signalled every iteration.
    fn end(&self) -> u64 {
        let r = self.round;
        self.base + r.signals_per_iter() * (r.warmup + r.iters) as u64
    }

    /// The LL sequence number of the round's last iteration (iteration
    /// `i`, global, carries `i + 1`).
    fn last_seq(&self) -> u32 {
        self.first_iter + self.round.warmup + self.round.iters
    }

    /// Whether this round waits with `nixl_ll_wait` or `nixl_ll128_wait`:
    /// lines can only be polled by a kernel, so in stream mode too.
    fn polls_lines(&self) -> bool {
        polls_lines(self.round.path)
    }

    /// Waits for the round; returns the report and, with a spinning wait,
    /// the per-iteration arrival stamps.
    fn run(&self, member: &Member) -> Result<(KernelReport, Option<DeviceBuffer>)> {
        let held = self.held;
        let lines = self.polls_lines();
        let stream_mode = held.wait == WaitMode::Stream && !lines;
        // Per-iteration arrival times exist only where a kernel follows the
        // data iteration by iteration (on the LL path: in ping-pong).
        let stamps = match stream_mode || (lines && !self.round.pingpong) {
            true => None,
            false => Some(DeviceBuffer::zeroed(
                &held.gpu.ctx,
                self.round.iters.max(1) as usize * 8,
            )?),
        };
        let params = self.params(stamps.as_ref());
        let finished = run_watched(
            &held.gpu,
            &held.report,
            held.plan.timeout(),
            stream_mode.then_some(held.signal.addr()),
            // SAFETY: the view, signal, stamps and report outlive the work.
            |s| unsafe {
                if stream_mode {
                    self.queue_host_sequenced(s, &params)
                } else if lines {
                    let WritePath::Data(path) = self.round.path else {
                        unreachable!("only the LL and LL128 paths poll lines")
                    };
                    Ok(held.kernels.launch_ll_wait(
                        s,
                        path,
                        (self.ll_blocks(), self.ll_threads()),
                        &params,
                    )?)
                } else {
                    Ok(held.kernels.launch_wait(s, &params)?)
                }
            },
            || member.probe(),
        )?;
        if finished.released {
            bail!("{}", self.silent(None));
        }
        self.check(&finished.report)?;
        Ok((finished.report, stamps))
    }

    fn params(&self, stamps: Option<&DeviceBuffer>) -> WaitParams {
        let (held, r) = (self.held, self.round);
        let view = held.ack_view.as_ref().expect("view lives until tear-down");
        WaitParams {
            ack: MemViewElem::new(view, 0),
            signal: held.signal.addr(),
            report: held.report.addr(),
            iter_ns: stamps.map_or(0, DeviceBuffer::addr),
            base: self.base,
            step: r.signals_per_iter(),
            timeout_ns: held.plan.timeout().as_nanos() as u64,
            warmup: r.warmup,
            iters: r.iters,
            pong: r.pingpong as u32,
            ack_mode: AckMode::of(r.path) as u32,
            ack_base: self.ack_base,
            lines: held.data.addr(),
            line_count: match r.path {
                WritePath::Data(Path::Ll) => ll::LL.lines(r.size),
                WritePath::Data(Path::Ll128) => ll::LL128.lines(r.size),
                _ => 0,
            },
            first_seq: self.first_iter + 1,
            reserved: 0,
            done: held.done.addr(),
        }
    }

    /// Threads of the LL wait kernel: one per line, whole warps, at most
    /// 1024 in ping-pong and 512 in bandwidth rounds. A ping-pong of a few
    /// lines then syncs one warp between seeing the data and acknowledging
    /// it; and under MPS a 512-thread block still fits beside one of the
    /// initiator's blocks on an SM (1024 threads could need a whole SM's
    /// registers, and a bandwidth grid leaves only one SM free).
    ///
    /// LL128: a warp polls four lines at once, so one warp per four
    /// lines, within the same bounds.
    fn ll_threads(&self) -> u32 {
        let max = if self.round.pingpong { 1024 } else { 512 };
        let lanes = match self.round.path {
            WritePath::Data(Path::Ll128) => ll::LL128.lines(self.round.size).div_ceil(4) * 32,
            _ => ll::LL.lines(self.round.size),
        };
        (lanes.clamp(1, max) as u32).div_ceil(32) * 32
    }

    /// Blocks of the LL wait kernel: one, but for an LL128 bandwidth round
    /// on a GPU of the target's own, one per 4 MiB of payload, at most 16
    /// and never more than the GPU's SMs (the grid must be resident at
    /// once: its warm-up acknowledgement waits for every block).
    /// A round's end is the last line of its last iteration seen, and one
    /// block polling (and copying) 1 GiB of lines behind the link ended
    /// it late: on two H200s LL128 read 0.72× the copy engine at 1 GiB and
    /// 0.83× at 256 MiB with one block, 0.87× and 0.88× with the grid.
    /// Under MPS the initiator's grid holds the SMs, so the target keeps to
    /// one block there.
    fn ll_blocks(&self) -> u32 {
        match (self.round.path, self.round.pingpong, self.held.own_gpu) {
            (WritePath::Data(Path::Ll128), false, true) => {
                let most = self.held.gpu.sm_count.clamp(1, 16);
                (self.round.size.div_ceil(4 << 20) as u32).clamp(1, most)
            }
            _ => 1,
        }
    }

    /// Stream mode: stream waits on the signal, each followed by `nixl_ack`.
    ///
    /// # Safety
    /// As for [`crate::simple_write::kernels::Kernels::launch_ack`].
    unsafe fn queue_host_sequenced(&self, s: &CudaStream, params: &WaitParams) -> Result<()> {
        let (k, r) = (&self.held.kernels, self.round);
        let (sig, rep, step) = (
            self.held.signal.addr(),
            self.held.report.addr(),
            params.step,
        );
        let total = r.warmup + r.iters;
        unsafe {
            if r.pingpong {
                for i in 0..total {
                    wait_value_geq(s, sig, self.base + step * (i as u64 + 1))?;
                    let which = if i + 1 == total { 1 } else { 2 };
                    k.launch_ack(s, &params.ack, rep, sig, which)?;
                }
            } else {
                if r.warmup > 0 {
                    wait_value_geq(s, sig, self.base + step * r.warmup as u64)?;
                    k.launch_ack(s, &params.ack, rep, sig, 0)?;
                }
                wait_value_geq(s, sig, self.end())?;
                k.launch_ack(s, &params.ack, rep, sig, 1)?;
            }
        }
        Ok(())
    }

    fn check(&self, r: &KernelReport) -> Result<()> {
        let (i, fin) = (self.index, self.end());
        if r.timed_out != 0 {
            bail!("{}", self.silent(Some(r.observed)));
        }
        if r.errors > 0 {
            bail!(
                "round {i}: acknowledging failed ({} NIXL device call(s), first status {})",
                r.errors,
                r.first_status
            );
        }
        if self.polls_lines() {
            let last = self.last_seq() as u64;
            if r.observed != last {
                bail!(
                    "round {i}: the {} wait ended on seq {} instead of {last}",
                    self.round.path,
                    r.observed
                );
            }
            return Ok(());
        }
        if r.observed != fin {
            bail!(
                "round {i}: the signal reads {} but exactly {fin} signals were sent: a signal was duplicated or lost",
                r.observed
            );
        }
        Ok(())
    }

    fn silent(&self, observed: Option<u64>) -> String {
        let seen = observed.map_or(String::new(), |o| format!(" (it reached {o})"));
        // Line paths have no signal: their lines carry the iteration's seq.
        let what = match self.polls_lines() {
            true => format!(
                "the {} lines did not all carry seq {}",
                self.round.path,
                self.last_seq()
            ),
            false => format!("the signal did not reach {}", self.end()),
        };
        format!(
            "round {}: {what} within {:?}{seen}: the initiator stopped sending (died or froze); raise --timeout if \
             it is just slow",
            self.index,
            self.held.plan.timeout()
        )
    }
}

/// Per-iteration intervals between the moments the target's GPU saw each
/// timed iteration complete (the first measured from the end of warm-up), ns.
fn arrival_intervals(
    held: &Held,
    stamps: &DeviceBuffer,
    iters: usize,
    start_ns: u64,
) -> Result<Summary> {
    let stamps = stamps.read_u64s(&held.gpu.stream)?;
    let mut prev = start_ns;
    let v: Vec<f64> = stamps[..iters.min(stamps.len())]
        .iter()
        .map(|&t| {
            let d = t.saturating_sub(prev) as f64;
            prev = t;
            d
        })
        .collect();
    Ok(Summary::of(&v))
}
