//! The initiator of `simple_write`: owns the source data and launches the
//! kernels that put it into the target's GPU memory and raise the target's
//! signal. (It also hosts the store; the binary opens it.)
//!
//! Four phases: `set_up` (GPU, plan, memory, agent), `connect`
//! (metadata and descriptors through the store, memory views), the rounds
//! (`rounds`), and `tear_down` (views first, then a handshake so
//! the target frees nothing the initiator still maps).
//!
//! Mirrors upstream's `simple_write --mode initiator` (NIXL PR #1259) on the
//! 1.x device API, with its defects fixed: a fence between put and signal,
//! collective calls made by every lane, per-position data, timing that stops
//! at the receiver, and a teardown that cannot race the target.

mod held;
pub mod rounds;

use std::time::Duration;

use anyhow::{Context, Result, bail};
use nixl_sys::RegistrationHandle;
use tracing::info;

use self::held::{Held, Memory, Views};
use self::rounds::RoundResult;
use super::baseline::BaselineRig;
use super::kernels::{FenceScope, Kernels, WaitMode};
use super::plan::{RoundSpec, RunPlan};
use super::protocol::{self as p, AgentMetadata, GpuInfo};
use crate::cli::{DataMismatch, fmt_bytes};
use crate::gpu::context::find_gpu;
use crate::gpu::kernels::check_view;
use crate::gpu::{DeviceBuffer, Gpu, GpuError};
use crate::group::Member;
use crate::nixl::agent::{UcxAgent, create_ucx_agent};
use crate::nixl::serdes::{Desc, DescList, MemType};
use crate::nixl::view::{load_peer, prep_local, prep_remote};
use crate::{pattern, say};

/// What the initiator needs beyond the store.
pub struct InitiatorConfig {
    /// GPU ordinal.
    pub gpu: usize,
    /// The rounds as asked for; resolved on our GPU into the published plan.
    pub rounds: Vec<RoundSpec>,
    /// Pattern seed (fresh per run).
    pub seed: u64,
    /// Timeout of every wait.
    pub timeout: Duration,
    /// Measure the copy-engine and NIXL host-API baselines for each size.
    pub baselines: bool,
    /// How this side waits for the target's acknowledgements.
    pub wait: WaitMode,
    /// Fault injection for testing the verification path: flip one byte of
    /// the source data, so the target must report a mismatch.
    pub corrupt: bool,
    /// Scope of the release between data and signal (put and store paths).
    pub fence: FenceScope,
    /// Ping-pong: also record where each round trip's time goes on the
    /// initiator ([`rounds::Breakdown`]).
    pub breakdown: bool,
}

/// What a run measured, for the report.
pub struct RunResult {
    pub plan: RunPlan,
    pub rounds: Vec<RoundResult>,
    pub initiator_gpu: GpuInfo,
    pub target_gpu: GpuInfo,
    /// Whether both processes use one GPU.
    pub same_gpu: bool,
    /// How the initiator waited for acknowledgements.
    pub wait: WaitMode,
    /// The release's scope on the put and store paths, resolved.
    pub fence: FenceScope,
}

/// The initiator's one memory check, made by the program before any network
/// wait: fails unless `gpu` has free what rounds of up to `max_size` bytes
/// allocate (two source buffers, with `baselines` a scratch buffer and a
/// copy destination, plus 64 MiB of headroom for the driver and UCX). The
/// error names the size, the MiB needed and free, and the flags that fix it.
pub fn check_fits(gpu: &Gpu, max_size: u64, baselines: bool) -> Result<(), GpuError> {
    let need = max_size
        .saturating_mul(2 + 2 * baselines as u64)
        .saturating_add(64 << 20);
    let fix = match baselines {
        true => "use a smaller --size/--max-size (or --no-baseline, which halves it)",
        false => "use a smaller --size/--max-size",
    };
    gpu.ensure_free(need, &format!("size {}", fmt_bytes(max_size)), fix)
}

/// Runs the initiator as `member` ([`p::INITIATOR`] of [`p::roster`]).
/// `on_round` sees each round as it finishes. A data mismatch reported by
/// the target is an error ([`DataMismatch`]), raised after the teardown
/// handshake; any other error is published to the target first (the
/// group's abort). Allocates without asking: [`check_fits`] came first.
pub fn run(
    cfg: &InitiatorConfig,
    member: &Member,
    on_round: &mut dyn FnMut(&RoundResult),
) -> Result<RunResult> {
    member.run(|| {
        let local = set_up(cfg, member)?;
        let mut held = connect(local, cfg, member)?;
        say!("[initiator] Transferring data via GPU kernel...");
        // A failed round skips the handshake: the abort goes out at once,
        // and the target, which may still be waiting on its GPU, stops on
        // it rather than on its timeout. Wrong data is not a failed round:
        // the target judged it, and both sides tear down.
        let rounds = rounds::run_all(&held, member, on_round)?;
        say!("[initiator] Transfer complete!");
        tear_down(&mut held, member)?;
        check_verdicts(&rounds)?;
        say!("[initiator] Complete!");
        Ok(held.result(rounds))
    })
}

/// Set-up, before the peer is involved: the GPU (before the agent: UCX
/// looks for CUDA when its backend starts), the plan, the memory, the agent.
struct Local {
    gpu: Gpu,
    kernels: Kernels,
    plan: RunPlan,
    me: GpuInfo,
    mem: Memory,
    nixl: UcxAgent,
    registrations: Vec<RegistrationHandle>,
}

fn set_up(cfg: &InitiatorConfig, member: &Member) -> Result<Local> {
    let gpu = Gpu::open(cfg.gpu)?;
    let kernels = Kernels::load(&gpu.ctx)?;
    let me = gpu.info()?;
    let plan = RunPlan {
        seed: cfg.seed,
        timeout_ms: cfg.timeout.as_millis() as u64,
        initiator_gpu: me.clone(),
        rounds: cfg
            .rounds
            .iter()
            .map(|spec| {
                spec.resolve(me.l2_bytes, |path, level, threads| {
                    kernels.grid_limit(&gpu, path, level, threads).unwrap_or(1)
                })
            })
            .collect(),
    };
    member.put(&p::run_plan(), &plan)?;
    let mem = allocate(&gpu, &plan, cfg.corrupt)?;
    let nixl = create_ucx_agent(p::INITIATOR_NAME)?;
    let registrations = [&mem.sources[0], &mem.sources[1], &mem.ack]
        .into_iter()
        .map(|b| nixl.agent.register_memory(b, None))
        .collect::<Result<Vec<_>, _>>()
        .context("registering the sources and the acknowledgement word (VRAM)")?;
    Ok(Local {
        gpu,
        kernels,
        plan,
        me,
        mem,
        nixl,
        registrations,
    })
}

/// Allocates the device memory and fills the two sources with their
/// patterns (one byte flipped when `corrupt`). Prints upstream's checksum
/// line for what the target will hold after the first round.
fn allocate(gpu: &Gpu, plan: &RunPlan, corrupt: bool) -> Result<Memory> {
    let size = plan.max_size() as usize;
    let mem = Memory {
        sources: [
            DeviceBuffer::zeroed(&gpu.ctx, size)?,
            DeviceBuffer::zeroed(&gpu.ctx, size)?,
        ],
        ack: DeviceBuffer::zeroed(&gpu.ctx, 8)?,
        report: DeviceBuffer::zeroed(&gpu.ctx, 40)?,
    };
    let mut host = vec![0u8; size];
    for (variant, src) in mem.sources.iter().enumerate() {
        pattern::fill(&mut host, plan.seed, variant as u64);
        if corrupt {
            host[size / 2] ^= 0x40;
        }
        src.upload(&gpu.stream, &host)?;
    }
    // The first round that moves data (a floor round moves none).
    let (first, first_iter) = first_data_round(plan);
    let n = first.size as usize;
    pattern::fill(&mut host[..n], plan.seed, first.final_variant(first_iter));
    say!(
        "[initiator] Data checksum: {}",
        pattern::byte_sum(&host[..n])
    );
    Ok(mem)
}

/// The plan's first round with data, and its first global iteration.
fn first_data_round(plan: &RunPlan) -> (&super::plan::Round, u32) {
    let mut first_iter = 0;
    for r in &plan.rounds {
        if r.size > 0 {
            return (r, first_iter);
        }
        first_iter += r.warmup + r.iters;
    }
    (&plan.rounds[0], 0)
}

/// Publishes our metadata and acknowledgement word, takes the target's
/// metadata, descriptors and GPU, and prepares the three memory views.
fn connect(local: Local, cfg: &InitiatorConfig, member: &Member) -> Result<Held> {
    let agent = &local.nixl.agent;
    member.put(&p::initiator_meta(), &AgentMetadata(agent.get_local_md()?))?;
    let ack_descs = DescList::new(MemType::Vram, vec![Desc::of(&local.mem.ack)]);
    member.put(&p::initiator_ack_descs(), &ack_descs)?;
    say!("[initiator] Published metadata, waiting for target...");

    let target_md = member.get(&p::target_meta(), p::TARGET, "agent metadata")?;
    load_peer(agent, &target_md.0, p::TARGET_NAME, cfg.timeout)
        .map_err(|e| member.blame_member(p::TARGET, e))?;
    let data = member.get(&p::target_data_descs(), p::TARGET, "data descriptors")?;
    let signal = member.get(&p::target_signal_descs(), p::TARGET, "signal descriptors")?;
    check_remote(&data, local.plan.max_wire_size(), "data")?;
    check_remote(&signal, 8, "signal")?;
    let target = member.get(&p::target_gpu(), p::TARGET, "GPU identity")?;
    say!("[initiator] Connected to target");

    let same_gpu = target.uuid == local.me.uuid;
    let wait = cfg.wait.resolve(same_gpu, local.gpu.mps);
    info!(
        "waiting for acknowledgements with a {} ({}{})",
        wait.describe(),
        if same_gpu {
            "both processes share the GPU"
        } else {
            "the processes use different GPUs"
        },
        if local.gpu.mps { ", under MPS" } else { "" }
    );
    let fence = cfg.fence.resolve(same_gpu);
    if fence == FenceScope::Gpu && !same_gpu {
        bail!(
            "--fence-scope gpu with the target on another GPU: a GPU-scope release does not order our stores for \
             a peer on another GPU, so signals could overtake data; use --fence-scope system or auto"
        );
    }
    let baseline = baseline_rig(cfg, &local, &target)?;
    local.gpu.bind()?;
    let views = prepare_views(&local, &data, &signal)?;
    Ok(Held {
        views: Some(views),
        baseline,
        _registrations: local.registrations,
        mem: local.mem,
        nixl: local.nixl,
        kernels: local.kernels,
        gpu: local.gpu,
        plan: local.plan,
        me: local.me,
        target,
        target_data: data,
        wait,
        fence,
        breakdown: cfg.breakdown,
        timeout: cfg.timeout,
    })
}

/// The baselines need the target's GPU among ours (the same machine).
fn baseline_rig(
    cfg: &InitiatorConfig,
    local: &Local,
    target: &GpuInfo,
) -> Result<Option<BaselineRig>> {
    if !cfg.baselines {
        return Ok(None);
    }
    let Some(ordinal) = find_gpu(&target.uuid) else {
        info!(
            "note: the target's GPU is not visible to this process; copy-engine and NIXL baselines skipped"
        );
        return Ok(None);
    };
    let size = local.plan.max_size() as usize;
    Ok(Some(BaselineRig::new(
        &local.gpu,
        &local.nixl.agent,
        ordinal,
        size,
    )?))
}

fn prepare_views(local: &Local, data: &DescList, signal: &DescList) -> Result<Views> {
    let (agent, backend) = (&local.nixl.agent, &local.nixl.backend);
    let sources = DescList::new(
        MemType::Vram,
        local.mem.sources.iter().map(Desc::of).collect(),
    );
    // SAFETY: the sources stay registered and allocated until the views
    // drop (`Held`'s field order); the target keeps its buffers until we
    // set `initiator_done`, which `tear_down` does after dropping them.
    let views = unsafe {
        Views {
            src: prep_local(agent, backend, &sources)?,
            dst: prep_remote(agent, backend, data, p::TARGET_NAME)?,
            signal: prep_remote(agent, backend, signal, p::TARGET_NAME)?,
        }
    };
    check_view(&views.src, 2, "our sources")?;
    check_view(&views.dst, 1, "the target's data")?;
    check_view(&views.signal, 1, "the target's signal")?;
    Ok(views)
}

/// Ordered so neither side frees memory the other still maps: our views
/// of the target go first, then we say so and wait until the target is
/// done.
fn tear_down(held: &mut Held, member: &Member) -> Result<()> {
    drop(held.views.take());
    let _ = held.nixl.agent.invalidate_remote_md(p::TARGET_NAME);
    member.mark(&p::initiator_done())?;
    let done = member.get(&p::target_done(), p::TARGET, "completion");
    // The target's last message is ours to delete; our own keys go when
    // the run ends.
    member.delete([p::target_done().key()]);
    done.map(drop)
}

fn check_verdicts(rounds: &[RoundResult]) -> Result<()> {
    match rounds.iter().find(|r| !r.verdict.ok()) {
        None => Ok(()),
        Some(r) => Err(anyhow::Error::new(DataMismatch(format!(
            "round {}: the target found wrong data: {}",
            r.index,
            r.verdict_text()
        )))),
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

impl Held {
    fn result(self, rounds: Vec<RoundResult>) -> RunResult {
        RunResult {
            same_gpu: self.target.uuid == self.me.uuid,
            plan: self.plan.clone(),
            rounds,
            initiator_gpu: self.me.clone(),
            target_gpu: self.target.clone(),
            wait: self.wait,
            fence: self.fence,
        }
    }
}
