//! The initiator's rounds: for each size and level of the plan, the
//! baselines (once per size), the go-ahead, the write + signal kernels, and
//! the target's verdict.

use anyhow::{Context as _, Result, bail};
use cudarc::driver::CudaStream;
use serde::Serialize;
use tracing::info;

use super::held::Held;
use crate::cli::fmt_bytes;
use crate::gpu::DeviceBuffer;
use crate::gpu::clock::{Span, ns_per_cycle};
use crate::gpu::kernels::{KernelReport, wait_value_geq};
use crate::gpu::run::{Finished, run_watched};
use crate::group::Member;
use crate::nixl::view::MemViewElem;
use crate::simple_write::baseline::Baselines;
use crate::simple_write::kernels::{
    FenceScope, WRITE_GPU_SCOPE, WRITE_HOST_SEQUENCED, WRITE_PINGPONG, WRITE_STAMP, WaitMode,
    WriteParams,
};
use crate::simple_write::plan::Round;
use crate::simple_write::protocol::{self as p, Verdict};
use crate::stats::Summary;

/// One round as measured by the initiator and judged by the target.
#[derive(Clone, Debug)]
pub struct RoundResult {
    /// Position in the plan.
    pub index: usize,
    pub round: Round,
    /// Bandwidth: GPU time (`%globaltimer`) from the first timed put to the
    /// initiator's GPU seeing the target's final acknowledgement, ns.
    /// Ping-pong: the span of the timed round trips.
    pub gpu_ns: u64,
    /// CUDA-event time of everything queued for the round, µs.
    pub event_us: f64,
    /// Ping-pong: each round trip, ns.
    pub rtt: Option<Summary>,
    /// Ping-pong with `--breakdown`: where the round trips' time went.
    pub breakdown: Option<Breakdown>,
    pub verdict: Verdict,
    /// The same size's baselines, when measured.
    pub baselines: Option<Baselines>,
}

/// Where the initiator's time goes within a ping-pong round trip
/// (`--breakdown`): p50 over the timed round trips, ns, on the initiator's
/// SM clock, each phase from the end of the one before. The same two clock
/// reads as the round trip bound it, so the four add up to about its p50.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Breakdown {
    /// From the message's first instruction to its data issued: nixlPut's
    /// return on the put path, the stores or LL lines issued on the others
    /// (a source load included).
    pub data_ns: f64,
    /// The release before the signal: put path, the group's barrier and the
    /// fence; the other paths have none of their own (0).
    pub fence_ns: f64,
    /// Issuing the signal: put path, nixlAtomicAdd (NIXL's, which waits for
    /// its result); store path, the group's barrier and one release add;
    /// LL and flag: nothing (the lines and the flag are the signal).
    pub signal_ns: f64,
    /// From then until the acknowledgement is seen: the flight to the
    /// target, its reply and the flight back.
    pub ack_ns: f64,
}

impl Breakdown {
    /// From `4 × n` phase stamps (`clock64` at each iteration's start, data,
    /// fence and signal) and the `n` round trips (cycles), at `ns_per_cycle`.
    fn of(phases: &[u64], rtt_cycles: &[u64], ns_per_cycle: f64) -> Self {
        let p50 = |f: &dyn Fn(usize) -> u64| {
            let v: Vec<f64> = (0..rtt_cycles.len())
                .map(|i| f(i) as f64 * ns_per_cycle)
                .collect();
            Summary::of(&v).p50_ns
        };
        // Cycles from iteration i's start to its stamp k (1 data, 2 fence, 3 signal).
        let at = |i: usize, k: usize| phases[4 * i + k].wrapping_sub(phases[4 * i]);
        Self {
            data_ns: p50(&|i| at(i, 1)),
            fence_ns: p50(&|i| at(i, 2).saturating_sub(at(i, 1))),
            signal_ns: p50(&|i| at(i, 3).saturating_sub(at(i, 2))),
            ack_ns: p50(&|i| rtt_cycles[i].saturating_sub(at(i, 3))),
        }
    }
}

impl RoundResult {
    /// The verdict in words.
    pub fn verdict_text(&self) -> String {
        match &self.verdict {
            Verdict::Ok { checksum, .. } => format!("ok (checksum {checksum})"),
            Verdict::Mismatch {
                checksum,
                expected_checksum,
                first,
            } => format!("checksum {checksum}, expected {expected_checksum}; {first}"),
        }
    }
}

/// Runs every round of the plan; stops after the first round whose data
/// did not verify (the caller turns that into a mismatch error).
pub(super) fn run_all(
    held: &Held,
    member: &Member,
    on_round: &mut dyn FnMut(&RoundResult),
) -> Result<Vec<RoundResult>> {
    let mut out: Vec<RoundResult> = Vec::new();
    let (mut ack_base, mut first_iter, mut signal_base) = (0u64, 0u32, 0u64);
    for (index, round) in held.plan.rounds.iter().enumerate() {
        // Once per size, between rounds: the target's buffer is idle (its
        // verdict on the last round is in) and zeroed.
        let baselines = match out.last().filter(|r| r.round.size == round.size) {
            Some(prev) => prev.baselines,
            None => measure_baselines(held, round.size)?,
        };
        check_grid(held, round)?;
        member.mark(&p::go(index))?;
        let launch = Launch {
            held,
            round,
            ack_base,
            first_iter,
            signal_base,
        };
        let m = launch.run(member)?;
        ack_base += round.acks();
        first_iter += round.warmup + round.iters;
        signal_base += round.signals_per_iter() * (round.warmup + round.iters) as u64;
        let verdict = member.get(&p::verdict(index), p::TARGET, "verdict on the data")?;
        let result = RoundResult {
            index,
            round: round.clone(),
            gpu_ns: m.report.t_end_ns.saturating_sub(m.report.t_start_ns),
            event_us: m.event_us,
            rtt: m.rtt,
            breakdown: m.breakdown,
            verdict,
            baselines,
        };
        on_round(&result);
        let ok = result.verdict.ok();
        out.push(result);
        if !ok {
            break;
        }
    }
    Ok(out)
}

fn measure_baselines(held: &Held, size: u64) -> Result<Option<Baselines>> {
    let Some(rig) = &held.baseline else {
        return Ok(None);
    };
    let b = rig.measure(
        &held.gpu,
        &held.mem.sources[0],
        &held.nixl.agent,
        (&held.target_data, p::TARGET_NAME),
        size,
        held.timeout,
    )?;
    info!(
        "baselines for {}: copy engine {:.1} GB/s, NIXL WRITE {:.1} GB/s",
        fmt_bytes(size),
        b.copy_engine_gbps.unwrap_or(0.0),
        b.nixl_write_gbps.unwrap_or(0.0)
    );
    Ok(Some(b))
}

/// The write kernel's blocks wait on each other (through the target's
/// acknowledgement), so they must all be resident at once.
fn check_grid(held: &Held, round: &Round) -> Result<()> {
    let max = held
        .kernels
        .grid_limit(&held.gpu, round.path, round.level, round.threads)?;
    if round.blocks > max {
        bail!(
            "{} blocks of {} threads cannot all be resident on GPU {} (at most {max}{}); the blocks wait on each \
             other, so use --blocks {max} or fewer",
            round.blocks,
            round.threads,
            held.gpu.ordinal,
            if held.gpu.mps {
                ", one SM left for the peer under MPS"
            } else {
                ""
            }
        );
    }
    Ok(())
}

/// One round on the initiator's GPU, in either wait mode.
struct Launch<'a> {
    held: &'a Held,
    round: &'a Round,
    /// The ack word's value before this round.
    ack_base: u64,
    /// Global index of the round's first iteration (its parity picks the source).
    first_iter: u32,
    /// The target's signal word before this round (the flag path stores
    /// absolute values into it).
    signal_base: u64,
}

/// What one launch measured.
struct Measured {
    report: KernelReport,
    /// CUDA-event time of the round, µs.
    event_us: f64,
    rtt: Option<Summary>,
    breakdown: Option<Breakdown>,
}

impl Launch<'_> {
    /// Launches the round and waits for it.
    fn run(&self, member: &Member) -> Result<Measured> {
        let (held, round) = (self.held, self.round);
        let stream_mode = held.wait == WaitMode::Stream;
        let stamps = match self.stamp_slots(stream_mode) {
            0 => None,
            n => Some(DeviceBuffer::zeroed(&held.gpu.ctx, n * 8)?),
        };
        let phases = match held.breakdown && round.pingpong && !stream_mode {
            true => Some(DeviceBuffer::zeroed(
                &held.gpu.ctx,
                round.iters as usize * 4 * 8,
            )?),
            false => None,
        };
        let mut params = self.params(stamps.as_ref());
        params.phase_cycles = phases.as_ref().map_or(0, DeviceBuffer::addr);
        let finished = run_watched(
            &held.gpu,
            &held.mem.report,
            held.timeout,
            stream_mode.then_some(held.mem.ack.addr()),
            // SAFETY: views, ack, stamps and report outlive the work
            // (run_watched waits for it).
            |s| unsafe {
                if stream_mode {
                    self.queue_host_sequenced(s, params)
                } else {
                    Ok(held.kernels.launch_write(
                        s,
                        (round.path, round.level),
                        round.blocks,
                        round.threads,
                        &params,
                    )?)
                }
            },
            || member.probe(),
        )?;
        let mut report = self.check(&finished)?;
        let (rtt, breakdown) = match &stamps {
            None => (None, None),
            Some(st) => {
                let (rtt, b) = self.round_trips(st, phases.as_ref(), stream_mode, &mut report)?;
                (Some(rtt), b)
            }
        };
        Ok(Measured {
            report,
            event_us: finished.event_us,
            rtt,
            breakdown,
        })
    }

    /// Ping-pong slots: kernel mode keeps cycles per round trip (+2 for
    /// calibration); stream mode keeps each launch's start time.
    fn stamp_slots(&self, stream_mode: bool) -> usize {
        let r = self.round;
        match (r.pingpong, stream_mode) {
            (false, _) => 0,
            (true, true) => (r.warmup + r.iters) as usize,
            (true, false) => r.iters as usize + 2,
        }
    }

    fn params(&self, stamps: Option<&DeviceBuffer>) -> WriteParams {
        let (held, round) = (self.held, self.round);
        let views = held.views.as_ref().expect("views live until tear-down");
        WriteParams {
            src: MemViewElem::new(&views.src, 0),
            dst: MemViewElem::new(&views.dst, 0),
            signal: MemViewElem::new(&views.signal, 0),
            ack: held.mem.ack.addr(),
            report: held.mem.report.addr(),
            iter_cycles: stamps.map_or(0, DeviceBuffer::addr),
            size: round.size,
            slice: round.slice(),
            ack_base: self.ack_base,
            timeout_ns: held.timeout.as_nanos() as u64,
            warmup: round.warmup,
            iters: round.iters,
            first_iter: self.first_iter,
            flags: if round.pingpong { WRITE_PINGPONG } else { 0 }
                | if held.fence == FenceScope::Gpu {
                    WRITE_GPU_SCOPE
                } else {
                    0
                },
            src_addr: [held.mem.sources[0].addr(), held.mem.sources[1].addr()],
            chunk: round.chunk,
            // Iteration i (global) stores signal_base + i + 1, which is
            // the round's signal base plus the iterations so far.
            signal_base: self.signal_base.wrapping_sub(self.first_iter as u64),
            slots: round.slots,
            slot_bytes: round.slot_bytes(),
            ..Default::default()
        }
    }

    /// Stream mode: no kernel spins. Each launch is followed by a stream
    /// wait on the ack word, and `nixl_stamp` records when it was satisfied.
    ///
    /// # Safety
    /// As for [`crate::simple_write::kernels::Kernels::launch_write`].
    unsafe fn queue_host_sequenced(&self, s: &CudaStream, mut p: WriteParams) -> Result<()> {
        let (k, r, ack) = (&self.held.kernels, self.round, self.held.mem.ack.addr());
        let write = |p: &WriteParams| unsafe {
            k.launch_write(s, (r.path, r.level), r.blocks, r.threads, p)
        };
        p.flags |= WRITE_HOST_SEQUENCED;
        if r.pingpong {
            p.flags |= WRITE_STAMP;
            for i in 0..r.warmup + r.iters {
                write(&WriteParams {
                    warmup: 0,
                    iters: 1,
                    first_iter: self.first_iter + i,
                    stamp_index: i,
                    ..p
                })?;
                unsafe { wait_value_geq(s, ack, self.ack_base + i as u64 + 1)? };
            }
        } else {
            if r.warmup > 0 {
                write(&WriteParams { iters: 0, ..p })?;
                unsafe { wait_value_geq(s, ack, self.ack_base + 1)? };
            }
            write(&WriteParams {
                warmup: 0,
                first_iter: self.first_iter + r.warmup,
                ..p
            })?;
            unsafe { wait_value_geq(s, ack, self.ack_base + r.acks())? };
        }
        unsafe { k.launch_stamp(s, self.held.mem.report.addr(), ack, 1)? };
        Ok(())
    }

    fn check(&self, f: &Finished) -> Result<KernelReport> {
        let r = f.report;
        if r.errors > 0 {
            bail!(
                "{} NIXL device call(s) failed (first status {}: NIXL_ERR_BACKEND = -3)",
                r.errors,
                r.first_status
            );
        }
        if f.released || r.timed_out != 0 || r.t_end_ns == 0 {
            bail!(
                "the target's acknowledgement never came (ack {} of {} after {:?}): the target stopped, or its \
                 signal never arrived",
                r.observed.min(u64::MAX / 4),
                self.ack_base + self.round.acks(),
                self.held.timeout
            );
        }
        Ok(r)
    }

    /// Ping-pong round trips, ns, and with `phases` their breakdown.
    /// Stream mode: each launch starts when the previous acknowledgement
    /// arrived. Kernel mode: SM cycle counts, calibrated by the globaltimer
    /// span of the same iterations (SM clocks move with boost).
    fn round_trips(
        &self,
        stamps: &DeviceBuffer,
        phases: Option<&DeviceBuffer>,
        stream_mode: bool,
        r: &mut KernelReport,
    ) -> Result<(Summary, Option<Breakdown>)> {
        let w = stamps.read_u64s(&self.held.gpu.stream)?;
        if stream_mode {
            let first = self.round.warmup as usize;
            r.t_start_ns = w[first];
            let rtts: Vec<f64> = (first..w.len())
                .map(|i| {
                    w.get(i + 1)
                        .copied()
                        .unwrap_or(r.t_end_ns)
                        .saturating_sub(w[i]) as f64
                })
                .collect();
            return Ok((Summary::of(&rtts), None));
        }
        let n = self.round.iters as usize;
        let k = ns_per_cycle([Span {
            clock_start: w[n],
            clock_end: w[n + 1],
            gt_start: r.t_start_ns,
            gt_end: r.t_end_ns,
        }])
        .context("the ping-pong kernel's timing")?;
        let rtts: Vec<f64> = w[..n].iter().map(|&c| c as f64 * k).collect();
        let breakdown = match phases {
            Some(ph) => Some(Breakdown::of(
                &ph.read_u64s(&self.held.gpu.stream)?,
                &w[..n],
                k,
            )),
            None => None,
        };
        Ok((Summary::of(&rtts), breakdown))
    }
}

#[cfg(test)]
mod tests {
    use super::Breakdown;

    #[test]
    fn a_breakdown_splits_each_round_trip_into_phases_that_add_up() {
        // Three round trips at 2 ns a cycle; the middle one is each p50.
        // Each iteration's stamps start from its own clock (1000, 2000, 3000).
        let phases = [
            1000, 1010, 1015, 1040, 2000, 2012, 2016, 2050, 3000, 3014, 3017, 3060,
        ];
        let b = Breakdown::of(&phases, &[100, 110, 120], 2.0);
        let want = Breakdown {
            data_ns: 24.0,
            fence_ns: 8.0,
            signal_ns: 68.0,
            ack_ns: 120.0,
        };
        assert_eq!(b, want);
        let sum = b.data_ns + b.fence_ns + b.signal_ns + b.ack_ns;
        assert_eq!(sum, 220.0, "the middle round trip, 110 cycles");
    }
}
