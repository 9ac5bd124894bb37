//! The initiator of `simple_write`: hosts the store, owns the source data,
//! and launches the kernels that put it into the target's GPU memory and
//! raise the target's signal.
//!
//! Mirrors upstream's `simple_write --mode initiator` (NIXL PR #1259) on the
//! 1.x device API, with its defects fixed: a fence between put and signal,
//! collective calls made by every lane, per-position data, timing that stops
//! at the receiver, and a teardown that cannot race the target.

use anyhow::{Context, Result, bail};

use super::baseline::{self, BaselineRig, Baselines};
use super::keys;
use super::peer::Peer;
use super::plan::{Round, RoundSpec, RunPlan};
use crate::cli::fmt_bytes;
use crate::gpu::kernels::{
    KernelReport, Kernels, MemViewElem, WRITE_HOST_SEQUENCED, WRITE_PINGPONG, WRITE_STAMP,
    WaitMode, WriteParams, wait_value_geq,
};
use crate::gpu::run::run_watched;
use crate::gpu::{DeviceBuffer, Gpu};
use crate::nixl::agent::create_ucx_agent;
use crate::nixl::serdes::{Desc, DescList, MemType};
use crate::nixl::view::{load_peer, prep_local, prep_remote};
use crate::pattern;
use crate::report::{DataMismatch, GpuInfo, Row, RunInfo};
use crate::say;
use crate::stats::Summary;
use crate::store::Store;

/// What the initiator needs beyond the plan.
pub struct InitiatorConfig {
    /// GPU ordinal.
    pub gpu: usize,
    /// The rounds as asked for; resolved on our GPU into the published plan.
    pub rounds: Vec<RoundSpec>,
    /// Pattern seed (fresh per run).
    pub seed: u64,
    /// Timeout of every wait.
    pub timeout: std::time::Duration,
    /// Measure the copy-engine and NIXL host-API baselines for each size.
    pub baselines: bool,
    /// How this side waits for the target's acknowledgements.
    pub wait: WaitMode,
    /// Fault injection for testing the verification path: flip one byte of
    /// the source data, so the target must report a mismatch.
    pub corrupt: bool,
}

/// What a run produced: a row per round, and the configuration.
pub struct InitiatorOutput {
    pub rows: Vec<Row>,
    pub info: RunInfo,
}

/// Runs the initiator against an open store (whose server this process
/// normally hosts). A data mismatch reported by the target is an error
/// ([`DataMismatch`]), raised after the teardown handshake.
pub fn run(cfg: &InitiatorConfig, store: &dyn Store) -> Result<InitiatorOutput> {
    let peer = Peer::new(store, "initiator", "target", cfg.timeout);
    let result = peer.with_heartbeat(|| run_inner(cfg, &peer));
    if let Err(e) = &result {
        if e.downcast_ref::<DataMismatch>().is_none() {
            peer.abort(&format!("{e:#}"));
        }
    }
    result
}

fn run_inner(cfg: &InitiatorConfig, peer: &Peer) -> Result<InitiatorOutput> {
    let timeout = cfg.timeout;
    // CUDA first: the agent's UCX backend must find a live context; and the
    // plan's defaults depend on this GPU.
    let gpu = Gpu::open(cfg.gpu)?;
    let kernels = Kernels::load(&gpu.ctx)?;
    let me = gpu.info()?;
    let plan = &RunPlan {
        seed: cfg.seed,
        timeout,
        initiator_gpu: me.uuid.clone(),
        rounds: cfg
            .rounds
            .iter()
            .map(|spec| {
                spec.resolve(|level, threads| {
                    kernels
                        .max_resident_blocks(level, threads, gpu.sm_count)
                        .unwrap_or(1)
                })
            })
            .collect(),
    };
    peer.set(keys::RUN_PLAN, &plan.encode())?;
    let mut info = RunInfo::collect(plan.seed);
    info.initiator_gpu = Some(me.clone());
    let size = plan.max_size() as usize;
    let free = gpu.free_memory()?;
    let need = memory_needed(size as u64, cfg.baselines) as usize;
    if need > free {
        bail!(
            "GPU {} has {} MiB free; the initiator needs {} MiB (two sources{}): use a smaller --size / --max-size",
            gpu.ordinal,
            free >> 20,
            need >> 20,
            if cfg.baselines {
                " and a baseline scratch buffer"
            } else {
                ""
            }
        );
    }
    let sources = [
        DeviceBuffer::zeroed(&gpu.ctx, size)?,
        DeviceBuffer::zeroed(&gpu.ctx, size)?,
    ];
    let ack = DeviceBuffer::zeroed(&gpu.ctx, 8)?;
    let report_buf = DeviceBuffer::zeroed(&gpu.ctx, 40)?;
    let mut host = vec![0u8; size];
    for (variant, src) in sources.iter().enumerate() {
        pattern::fill(&mut host, plan.seed, variant as u64);
        if cfg.corrupt {
            host[size / 2] ^= 0x40;
        }
        src.upload(&gpu.stream, &host)?;
    }
    let first = &plan.rounds[0];
    pattern::fill(
        &mut host[..first.size as usize],
        plan.seed,
        first.final_variant(0),
    );
    say!(
        "[initiator] Data checksum: {}",
        pattern::byte_sum(&host[..first.size as usize])
    );
    drop(host);

    let nixl = create_ucx_agent(keys::INITIATOR_NAME)?;
    let agent = &nixl.agent;
    let _reg_src0 = agent
        .register_memory(&sources[0], None)
        .context("registering source buffer 0 (VRAM)")?;
    let _reg_src1 = agent
        .register_memory(&sources[1], None)
        .context("registering source buffer 1 (VRAM)")?;
    let _reg_ack = agent
        .register_memory(&ack, None)
        .context("registering the acknowledgement word (VRAM)")?;
    peer.set(keys::INITIATOR_META, &agent.get_local_md()?)?;
    let ack_descs = DescList::new(MemType::Vram, vec![vram_desc(&ack)]);
    peer.set(keys::INITIATOR_ACK_DESCS, &ack_descs.encode())?;
    say!("[initiator] Published metadata, waiting for target...");

    let target_md = peer.get(keys::TARGET_META, "agent metadata")?;
    load_peer(agent, &target_md, keys::TARGET_NAME, timeout)?;
    let data_descs = DescList::decode(&peer.get(keys::TARGET_DATA_DESCS, "data descriptors")?)
        .context("decoding the target's data descriptors")?;
    let signal_descs =
        DescList::decode(&peer.get(keys::TARGET_SIGNAL_DESCS, "signal descriptors")?)
            .context("decoding the target's signal descriptors")?;
    check_remote(&data_descs, plan.max_size(), "data")?;
    check_remote(&signal_descs, 8, "signal")?;
    let target_gpu =
        String::from_utf8_lossy(&peer.get(keys::TARGET_GPU, "GPU identity")?).into_owned();
    info.target_gpu = parse_gpu(&target_gpu);
    say!("[initiator] Connected to target");

    // Baselines need the target's GPU among ours (the same numbering), and
    // our zeroed scratch buffer registered for the NIXL WRITE.
    let rig = if cfg.baselines {
        match info
            .target_gpu
            .as_ref()
            .and_then(|g| baseline::find_gpu(&g.uuid))
        {
            Some(t) => Some(BaselineRig::new(&gpu, t, size)?),
            None => {
                eprintln!(
                    "[initiator] note: the target's GPU is not visible to this process; copy-engine and NIXL baselines skipped"
                );
                None
            }
        }
    } else {
        None
    };
    gpu.bind()?;
    let _reg_scratch = match &rig {
        Some(r) => Some(
            agent
                .register_memory(r.scratch(), None)
                .context("registering the baseline scratch buffer")?,
        ),
        None => None,
    };
    info.same_gpu = info.target_gpu.as_ref().is_some_and(|t| t.uuid == me.uuid);
    let wait = cfg.wait.resolve(info.same_gpu);
    info.initiator_wait = Some(wait.name());
    eprintln!(
        "[initiator] waiting for acknowledgements with a {} ({})",
        match wait {
            WaitMode::Stream => "stream wait (cuStreamWaitValue64)",
            _ => "spinning kernel",
        },
        if info.same_gpu {
            "both processes share the GPU"
        } else {
            "the processes use different GPUs"
        }
    );

    let local = DescList::new(
        MemType::Vram,
        vec![vram_desc(&sources[0]), vram_desc(&sources[1])],
    );
    // SAFETY: the sources stay registered and allocated until after the views drop (explicit drop below).
    let src_view = unsafe { prep_local(agent, &nixl.backend, &local)? };
    // SAFETY: the target keeps its buffers until we set INITIATOR_DONE, after these views drop.
    let dst_view = unsafe { prep_remote(agent, &nixl.backend, &data_descs, keys::TARGET_NAME)? };
    let sig_view = unsafe { prep_remote(agent, &nixl.backend, &signal_descs, keys::TARGET_NAME)? };

    say!("[initiator] Transferring data via GPU kernel...");
    let mut rows = Vec::new();
    let mut ack_base = 0u64;
    let mut first_iter = 0u32;
    let mut failure = None;
    let mut baselines_of: Option<(u64, Baselines)> = None;
    for (i, round) in plan.rounds.iter().enumerate() {
        // Baselines once per size, between rounds: the target's buffer is
        // idle (its verdict on the last round is in) and zeroed.
        if let Some(rig) = &rig {
            if baselines_of.map(|(s, _)| s) != Some(round.size) {
                let n = round.size as usize;
                let b = Baselines {
                    copy_engine_gbps: Some(rig.copy_engine(
                        &gpu,
                        &sources[0],
                        n,
                        baseline::ce_iters(round.size),
                    )?),
                    nixl_write_gbps: Some(rig.nixl_write(
                        agent,
                        &data_descs,
                        keys::TARGET_NAME,
                        n,
                        baseline::nixl_iters(round.size),
                        timeout,
                    )?),
                };
                eprintln!(
                    "[initiator] baselines for {}: copy engine {:.1} GB/s, NIXL WRITE {:.1} GB/s",
                    fmt_bytes(round.size),
                    b.copy_engine_gbps.unwrap_or(0.0),
                    b.nixl_write_gbps.unwrap_or(0.0)
                );
                baselines_of = Some((round.size, b));
            }
        }
        let max_blocks = kernels.max_resident_blocks(round.level, round.threads, gpu.sm_count)?;
        if round.blocks > max_blocks {
            bail!(
                "{} blocks of {} threads cannot all be resident on GPU {} (at most {max_blocks}); the blocks wait \
                 on each other, so use --blocks {max_blocks} or fewer",
                round.blocks,
                round.threads,
                gpu.ordinal
            );
        }
        let run = RoundRun {
            gpu: &gpu,
            kernels: &kernels,
            round,
            wait,
            report: &report_buf,
            ack: &ack,
            ack_base,
            first_iter,
            timeout,
        };
        let base = WriteParams {
            src: MemViewElem::new(&src_view, 0),
            dst: MemViewElem::new(&dst_view, 0),
            signal: MemViewElem::new(&sig_view, 0),
            ..Default::default()
        };
        peer.set(&keys::go(i), b"")?;
        let (r, event_us, rtt) = run.execute(base, peer)?;
        ack_base += round.acks();
        first_iter += round.warmup + round.iters;

        let verdict = peer.get(&keys::verdict(i), "verdict on the data")?;
        let verdict = String::from_utf8_lossy(&verdict).into_owned();
        let mut row = Row::new(
            i,
            round,
            r.t_end_ns.saturating_sub(r.t_start_ns),
            event_us,
            &verdict,
            rtt,
        );
        if let Some((_, b)) = baselines_of {
            row = row.with_baselines(b);
        }
        eprintln!("[initiator] round {i}: {}", row.line());
        let ok = row.verified;
        rows.push(row);
        if !ok {
            failure = Some(format!("round {i}: the target found wrong data: {verdict}"));
            break;
        }
    }
    say!("[initiator] Transfer complete!");

    // Teardown, ordered so neither side frees memory the other still maps:
    // our views of the target go first, then the target may deregister.
    drop((src_view, dst_view, sig_view));
    let _ = agent.invalidate_remote_md(keys::TARGET_NAME);
    peer.set(keys::INITIATOR_DONE, b"")?;
    let done = peer.get(keys::TARGET_DONE, "completion");
    let mut own: Vec<String> = vec![
        keys::INITIATOR_META.into(),
        keys::INITIATOR_ACK_DESCS.into(),
        keys::RUN_PLAN.into(),
        keys::INITIATOR_DONE.into(),
        keys::TARGET_DONE.into(),
        keys::TARGET_GPU.into(),
    ];
    own.extend((0..plan.rounds.len()).map(keys::verdict));
    own.extend((0..plan.rounds.len()).map(keys::go));
    peer.delete(&own.iter().map(String::as_str).collect::<Vec<_>>());
    done?;
    if let Some(f) = failure {
        return Err(anyhow::Error::new(DataMismatch(f)));
    }
    say!("[initiator] Complete!");
    Ok(InitiatorOutput { rows, info })
}

/// Bytes the initiator allocates on its GPU for rounds of up to `max_size`
/// bytes: two source buffers, with baselines a scratch buffer and a copy
/// destination, plus 64 MiB of headroom for the driver and UCX.
pub fn memory_needed(max_size: u64, baselines: bool) -> u64 {
    max_size
        .saturating_mul(2 + 2 * baselines as u64)
        .saturating_add(64 << 20)
}

/// One round on the initiator's GPU, in either wait mode.
struct RoundRun<'a> {
    gpu: &'a Gpu,
    kernels: &'a Kernels,
    round: &'a Round,
    wait: WaitMode,
    report: &'a DeviceBuffer,
    ack: &'a DeviceBuffer,
    ack_base: u64,
    first_iter: u32,
    timeout: std::time::Duration,
}

impl RoundRun<'_> {
    /// Launches the round and waits for it; returns the report, the event
    /// time (µs) and, for ping-pong, the round trips.
    fn execute(
        &self,
        views: WriteParams,
        peer: &Peer,
    ) -> Result<(KernelReport, f64, Option<Summary>)> {
        let (round, k) = (self.round, self.kernels);
        let stream_mode = self.wait == WaitMode::Stream;
        // Ping-pong slots: kernel mode keeps cycles per round trip (+2 for
        // calibration); stream mode keeps each launch's start time.
        let slots = if !round.pingpong {
            0
        } else if stream_mode {
            (round.warmup + round.iters) as usize
        } else {
            round.iters as usize + 2
        };
        let stamps = if slots > 0 {
            Some(DeviceBuffer::zeroed(&self.gpu.ctx, slots * 8)?)
        } else {
            None
        };
        let mut p = WriteParams {
            ack: self.ack.addr(),
            report: self.report.addr(),
            iter_cycles: stamps.as_ref().map_or(0, |c| c.addr()),
            size: round.size,
            slice: round.slice(),
            ack_base: self.ack_base,
            timeout_ns: self.timeout.as_nanos() as u64,
            warmup: round.warmup,
            iters: round.iters,
            first_iter: self.first_iter,
            flags: if round.pingpong { WRITE_PINGPONG } else { 0 },
            ..views
        };
        let (lv, blocks, threads) = (round.level, round.blocks, round.threads);
        let ack_addr = self.ack.addr();
        let finished = run_watched(
            self.gpu,
            self.report,
            self.timeout,
            stream_mode.then_some(ack_addr),
            // SAFETY: views, ack, stamps and report outlive the work (run_watched waits for it).
            |s| unsafe {
                if !stream_mode {
                    return Ok(k.launch_write(s, lv, blocks, threads, &p)?);
                }
                p.flags |= WRITE_HOST_SEQUENCED;
                if round.pingpong {
                    p.flags |= WRITE_STAMP;
                    for i in 0..round.warmup + round.iters {
                        let one = WriteParams {
                            warmup: 0,
                            iters: 1,
                            first_iter: self.first_iter + i,
                            stamp_index: i,
                            ..p
                        };
                        k.launch_write(s, lv, blocks, threads, &one)?;
                        wait_value_geq(s, ack_addr, self.ack_base + i as u64 + 1)?;
                    }
                } else {
                    if round.warmup > 0 {
                        k.launch_write(s, lv, blocks, threads, &WriteParams { iters: 0, ..p })?;
                        wait_value_geq(s, ack_addr, self.ack_base + 1)?;
                    }
                    let timed = WriteParams {
                        warmup: 0,
                        first_iter: self.first_iter + round.warmup,
                        ..p
                    };
                    k.launch_write(s, lv, blocks, threads, &timed)?;
                    wait_value_geq(s, ack_addr, self.ack_base + round.acks())?;
                }
                k.launch_stamp(s, self.report.addr(), ack_addr, 1)?;
                Ok(())
            },
            || peer.probe(),
        )?;
        let mut r = finished.report;
        if r.errors > 0 {
            bail!(
                "{} NIXL device call(s) failed (first status {}: NIXL_ERR_BACKEND = -3)",
                r.errors,
                r.first_status
            );
        }
        if finished.released || r.timed_out != 0 || r.t_end_ns == 0 {
            bail!(
                "the target's acknowledgement never came (ack {} of {} after {:?}): the target stopped, or its \
                 signal never arrived",
                r.observed.min(u64::MAX / 4),
                self.ack_base + round.acks(),
                self.timeout
            );
        }
        let rtt = match &stamps {
            None => None,
            Some(st) => {
                let mut raw = vec![0u8; slots * 8];
                st.download(&self.gpu.stream, &mut raw)?;
                let w = |i: usize| u64::from_le_bytes(raw[i * 8..i * 8 + 8].try_into().unwrap());
                let rtts: Vec<f64> = if stream_mode {
                    // Each launch starts when the last acknowledgement arrived.
                    let first = round.warmup as usize;
                    r.t_start_ns = w(first);
                    (first..slots)
                        .map(|i| {
                            (if i + 1 < slots { w(i + 1) } else { r.t_end_ns }).saturating_sub(w(i))
                                as f64
                        })
                        .collect()
                } else {
                    // Cycle counts, calibrated by the globaltimer span of the
                    // same iterations (SM clocks vary with boost).
                    let n = round.iters as usize;
                    let cycles = w(n + 1).saturating_sub(w(n)).max(1);
                    let ns_per_cycle =
                        r.t_end_ns.saturating_sub(r.t_start_ns) as f64 / cycles as f64;
                    (0..n).map(|i| w(i) as f64 * ns_per_cycle).collect()
                };
                Some(Summary::of(&rtts))
            }
        };
        Ok((r, finished.event_us, rtt))
    }
}

fn parse_gpu(text: &str) -> Option<GpuInfo> {
    let mut w = text.splitn(3, ' ');
    let uuid = w.next()?.to_string();
    let ordinal = w.next()?.parse().ok()?;
    Some(GpuInfo {
        ordinal,
        uuid,
        name: w.next().unwrap_or("").to_string(),
    })
}

fn vram_desc(buf: &DeviceBuffer) -> Desc {
    Desc {
        addr: buf.addr(),
        len: buf.len() as u64,
        dev_id: buf.ordinal() as u64,
    }
}

fn check_remote(list: &DescList, min_len: u64, what: &str) -> Result<()> {
    match list.descs.as_slice() {
        [d] if list.mem_type == MemType::Vram && d.len >= min_len => Ok(()),
        _ => bail!(
            "the target's {what} descriptors are not one VRAM buffer of at least {min_len} bytes: {list:?}"
        ),
    }
}
