//! The target of `simple_write`: exposes a data buffer and an 8-byte
//! signal, waits on the GPU until the initiator's puts and signals arrive,
//! acknowledges them, and verifies every byte.
//!
//! Mirrors upstream's `simple_write --mode target` (NIXL PR #1259) on the
//! 1.x device API; the data check, the acknowledgement and the teardown
//! handshake are ours.

use anyhow::{Context, Result, bail};

use super::keys;
use super::peer::Peer;
use super::plan::RunPlan;
use crate::gpu::kernels::{Kernels, MemViewElem, WaitMode, WaitParams, wait_value_geq};
use crate::gpu::run::run_watched;
use crate::gpu::{DeviceBuffer, Gpu};
use crate::nixl::agent::create_ucx_agent;
use crate::nixl::serdes::{Desc, DescList, MemType};
use crate::nixl::view::{load_peer, prep_remote};
use crate::pattern;
use crate::report::DataMismatch;
use crate::say;
use crate::stats::Summary;
use crate::store::Store;

/// What the target needs; everything else comes from the initiator's plan.
pub struct TargetConfig {
    /// GPU ordinal.
    pub gpu: usize,
    /// `--size` as given on the target's command line, if it was: it must
    /// match the initiator's.
    pub expected_size: Option<u64>,
    /// Used until the plan (which carries the initiator's timeout) arrives.
    pub timeout: std::time::Duration,
    /// How this side waits for the signal.
    pub wait: WaitMode,
}

/// Per-round outcome on the target.
#[derive(Clone, Debug)]
pub struct TargetRound {
    /// Byte sum of the received data (upstream's checksum).
    pub checksum: u64,
    /// GPU time from the end of warm-up to the last signal, ns.
    pub wait_ns: u64,
}

/// Runs the target against an open store. A data mismatch is an error
/// ([`DataMismatch`]) after the verdict has been published.
pub fn run(cfg: &TargetConfig, store: &dyn Store) -> Result<Vec<TargetRound>> {
    let peer = Peer::new(store, "target", "initiator", cfg.timeout);
    // One target per initiator: a second one must leave without touching
    // the first pair's keys (no abort, no heartbeat, no cleanup).
    let token = format!("pid {} on {}", std::process::id(), hostname());
    let holder = store.compare_set(keys::TARGET_CLAIM, b"", token.as_bytes())?;
    if holder != token.as_bytes() {
        bail!(
            "another target ({}) already joined this initiator's store: one target per initiator; \
             start another initiator on another --port for a second pair",
            String::from_utf8_lossy(&holder)
        );
    }
    let result = peer.with_heartbeat(|| run_inner(cfg, &peer));
    if let Err(e) = &result {
        if e.downcast_ref::<DataMismatch>().is_none() {
            peer.abort(&format!("{e:#}"));
        }
        // Our keys go with us, on every path.
        peer.delete(&[
            keys::TARGET_META,
            keys::TARGET_DATA_DESCS,
            keys::TARGET_SIGNAL_DESCS,
            keys::TARGET_GPU,
        ]);
    }
    result
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

fn run_inner(cfg: &TargetConfig, peer: &Peer) -> Result<Vec<TargetRound>> {
    let plan = RunPlan::decode(&peer.get(keys::RUN_PLAN, "run plan")?)?;
    let timeout = plan.timeout;
    if let Some(want) = cfg.expected_size {
        if plan.rounds.iter().any(|r| r.size != want) {
            bail!(
                "--size {want} on the target differs from the initiator's ({}): give --size to the initiator only, or the same to both",
                plan.rounds
                    .iter()
                    .map(|r| r.size.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
    }

    let gpu = Gpu::open(cfg.gpu)?;
    let kernels = Kernels::load(&gpu.ctx)?;
    let me = gpu.info()?;
    let size = plan.max_size() as usize;
    let free = gpu.free_memory()?;
    if size + (1 << 20) > free {
        bail!(
            "GPU {} has {} MiB free, the target needs {size} bytes: use a smaller --size",
            gpu.ordinal,
            free >> 20
        );
    }
    let data = DeviceBuffer::zeroed(&gpu.ctx, size)?;
    let signal = DeviceBuffer::zeroed(&gpu.ctx, 8)?;
    let report_buf = DeviceBuffer::zeroed(&gpu.ctx, 40)?;

    let nixl = create_ucx_agent(keys::TARGET_NAME)?;
    let agent = &nixl.agent;
    let _reg_data = agent
        .register_memory(&data, None)
        .context("registering the data buffer (VRAM)")?;
    let _reg_signal = agent
        .register_memory(&signal, None)
        .context("registering the signal (VRAM)")?;
    peer.set(keys::TARGET_META, &agent.get_local_md()?)?;
    peer.set(
        keys::TARGET_DATA_DESCS,
        &DescList::new(MemType::Vram, vec![vram_desc(&data)]).encode(),
    )?;
    peer.set(
        keys::TARGET_SIGNAL_DESCS,
        &DescList::new(MemType::Vram, vec![vram_desc(&signal)]).encode(),
    )?;
    peer.set(
        keys::TARGET_GPU,
        format!("{} {} {}", me.uuid, me.ordinal, me.name).as_bytes(),
    )?;
    say!("[target] Published metadata and descriptors");

    let initiator_md = peer.get(keys::INITIATOR_META, "agent metadata")?;
    load_peer(agent, &initiator_md, keys::INITIATOR_NAME, timeout)?;
    let ack_descs =
        DescList::decode(&peer.get(keys::INITIATOR_ACK_DESCS, "acknowledgement descriptors")?)
            .context("decoding the initiator's acknowledgement descriptors")?;
    say!("[target] Connected to initiator");
    // SAFETY: the initiator keeps its ack word until we set TARGET_DONE, after this view drops.
    let ack_view = unsafe { prep_remote(agent, &nixl.backend, &ack_descs, keys::INITIATOR_NAME)? };
    let wait = cfg.wait.resolve(me.uuid == plan.initiator_gpu);
    eprintln!(
        "[target] waiting for signals with a {}",
        if wait == WaitMode::Stream {
            "stream wait (cuStreamWaitValue64): both processes share the GPU"
        } else {
            "spinning kernel"
        }
    );

    let mut host = vec![0u8; size];
    let mut out = Vec::new();
    let mut signal_base = 0u64;
    let mut first_iter = 0u32;
    let mut mismatch = None;
    say!("[target] Waiting for data...");
    for (i, round) in plan.rounds.iter().enumerate() {
        let step = round.signals_per_iter();
        let fin = signal_base + step * (round.warmup + round.iters) as u64;
        let stamps = DeviceBuffer::zeroed(&gpu.ctx, round.iters.max(1) as usize * 8)?;
        let params = WaitParams {
            ack: MemViewElem::new(&ack_view, 0),
            signal: signal.addr(),
            report: report_buf.addr(),
            iter_ns: stamps.addr(),
            base: signal_base,
            step,
            timeout_ns: timeout.as_nanos() as u64,
            warmup: round.warmup,
            iters: round.iters,
            pong: round.pingpong as u32,
            reserved: 0,
        };
        // Not before the initiator says so: its baselines must run alone.
        peer.get(&keys::go(i), "start of the round")?;
        let stream_mode = wait == WaitMode::Stream;
        let finished = run_watched(
            &gpu,
            &report_buf,
            timeout,
            stream_mode.then_some(signal.addr()),
            // SAFETY: the view, signal, stamps and report outlive the work.
            |s| unsafe {
                if !stream_mode {
                    return Ok(kernels.launch_wait(s, &params)?);
                }
                let (sig, rep) = (signal.addr(), report_buf.addr());
                let total = round.warmup + round.iters;
                if round.pingpong {
                    for i in 0..total {
                        wait_value_geq(s, sig, signal_base + step * (i as u64 + 1))?;
                        kernels.launch_ack(
                            s,
                            &params.ack,
                            rep,
                            sig,
                            if i + 1 == total { 1 } else { 2 },
                        )?;
                    }
                } else {
                    if round.warmup > 0 {
                        wait_value_geq(s, sig, signal_base + step * round.warmup as u64)?;
                        kernels.launch_ack(s, &params.ack, rep, sig, 0)?;
                    }
                    wait_value_geq(s, sig, fin)?;
                    kernels.launch_ack(s, &params.ack, rep, sig, 1)?;
                }
                Ok(())
            },
            || peer.probe(),
        )?;
        if finished.released {
            bail!(
                "round {i}: the signal did not reach {fin} within {timeout:?}: the initiator stopped sending (or died); \
                 raise --timeout if it is just slow"
            );
        }
        let r = finished.report;
        if r.timed_out != 0 {
            bail!(
                "round {i}: the signal reached {} of the {fin} expected within {timeout:?} on the GPU: the initiator \
                 stopped sending (or died); raise --timeout if it is just slow",
                r.observed
            );
        }
        if r.errors > 0 {
            bail!(
                "round {i}: acknowledging failed ({} NIXL device call(s), first status {})",
                r.errors,
                r.first_status
            );
        }
        if r.observed != fin {
            bail!(
                "round {i}: the signal reads {} but exactly {fin} signals were sent: a signal was duplicated or lost",
                r.observed
            );
        }
        if i == 0 {
            say!("[target] Signal received!");
        }

        let n = round.size as usize;
        data.download(&gpu.stream, &mut host[..n])?;
        let variant = round.final_variant(first_iter);
        let checksum = pattern::byte_sum(&host[..n]);
        // Per-iteration arrival times exist only where a kernel followed the
        // signal iteration by iteration.
        let intervals = if stream_mode {
            String::new()
        } else {
            arrival_intervals(&gpu, &stamps, round.iters as usize, r.t_start_ns)?.encode("recv_")
        };
        let verdict = match pattern::verify(&host[..n], plan.seed, variant) {
            None => {
                say!("[target] ✓ Checksum OK: {checksum}");
                format!("ok {checksum} {intervals}")
            }
            Some(m) => {
                let expected: u64 = {
                    let mut e = vec![0u8; n];
                    pattern::fill(&mut e, plan.seed, variant);
                    pattern::byte_sum(&e)
                };
                eprintln!("[target] ✗ Checksum MISMATCH: got={checksum} expected={expected}");
                eprintln!(
                    "[target]   round {i} ({} B, {}): {m}",
                    round.size, round.level
                );
                format!("mismatch {m}")
            }
        };
        // Clear the buffer before the initiator may start the next round, so
        // a put that silently wrote nothing can never pass on stale data.
        data.zero(&gpu.stream)?;
        out.push(TargetRound {
            checksum,
            wait_ns: r.t_end_ns.saturating_sub(r.t_start_ns),
        });
        let failed = !verdict.starts_with("ok");
        peer.set(&keys::verdict(i), verdict.as_bytes())?;
        if failed {
            mismatch = Some(format!("round {i}: {}", &verdict["mismatch ".len()..]));
            break;
        }
        signal_base = fin;
        first_iter += round.warmup + round.iters;
    }

    // Teardown: wait until the initiator has released its views of our
    // memory, then release ours of its ack word, deregister, and say done
    // as the very last store operation (the initiator hosts the store and
    // exits once it sees it).
    let released = peer.get(keys::INITIATOR_DONE, "release of its memory views");
    drop(ack_view);
    let _ = agent.invalidate_remote_md(keys::INITIATOR_NAME);
    peer.delete(&[
        keys::TARGET_META,
        keys::TARGET_DATA_DESCS,
        keys::TARGET_SIGNAL_DESCS,
        keys::TARGET_GPU,
    ]);
    released?;
    peer.set(keys::TARGET_DONE, b"")?;
    if let Some(m) = mismatch {
        return Err(anyhow::Error::new(DataMismatch(m)));
    }
    say!("[target] Complete!");
    Ok(out)
}

/// Per-iteration intervals between the moments the target's GPU saw each
/// timed iteration complete (the first measured from the end of warm-up), ns.
fn arrival_intervals(
    gpu: &Gpu,
    stamps: &DeviceBuffer,
    iters: usize,
    start_ns: u64,
) -> Result<Summary> {
    let mut raw = vec![0u8; iters * 8];
    stamps.download(&gpu.stream, &mut raw)?;
    let mut prev = start_ns;
    let mut v = Vec::with_capacity(iters);
    for c in raw.chunks_exact(8) {
        let t = u64::from_le_bytes(c.try_into().unwrap());
        v.push(t.saturating_sub(prev) as f64);
        prev = t;
    }
    Ok(Summary::of(&v))
}

fn vram_desc(buf: &DeviceBuffer) -> Desc {
    Desc {
        addr: buf.addr(),
        len: buf.len() as u64,
        dev_id: buf.ordinal() as u64,
    }
}
