//! The target of `simple_write`: exposes a data buffer and an 8-byte
//! signal, waits on the GPU until the initiator's puts and signals arrive,
//! acknowledges them, and verifies every byte.
//!
//! Four phases: `set_up` (the plan, GPU, memory, agent, and publishing
//! them), `connect` (the initiator's metadata and acknowledgement word),
//! the rounds (`receive`), and `tear_down` (after the initiator
//! released its views of our memory).
//!
//! Mirrors upstream's `simple_write --mode target` (NIXL PR #1259) on the
//! 1.x device API; the data check, the acknowledgement and the teardown
//! handshake are ours.

mod held;
mod receive;

use std::time::Duration;

use anyhow::{Context, Result, bail};

use tracing::info;

use self::held::Held;
use super::kernels::{Kernels, WaitMode, WritePath};
use super::plan::RunPlan;
use super::protocol::{self as p, AgentMetadata, Claim, Marker};
use crate::cli::DataMismatch;
use crate::gpu::kernels::check_view;
use crate::gpu::{DeviceBuffer, Gpu};
use crate::group::Member;
use crate::nixl::agent::create_ucx_agent;
use crate::nixl::serdes::{Desc, DescList, MemType};
use crate::nixl::view::{load_peer, prep_remote};
use crate::say;

/// What the target needs; everything else comes from the initiator's plan.
pub struct TargetConfig {
    /// GPU ordinal.
    pub gpu: usize,
    /// `--size` as given on the target's command line, if it was: it must
    /// match the initiator's.
    pub expected_size: Option<u64>,
    /// Used until the plan (which carries the initiator's timeout) arrives.
    pub timeout: Duration,
    /// How this side waits for the signal.
    pub wait: WaitMode,
}

/// Runs the target as `member` ([`p::TARGET`] of [`p::roster`]). A data
/// mismatch is an error ([`DataMismatch`]) after the verdict has been
/// published.
pub fn run(cfg: &TargetConfig, member: &Member) -> Result<()> {
    claim_pair(member, false)?;
    member.run(|| {
        let plan = member.get(&p::run_plan(), p::INITIATOR, "run plan")?;
        member.set_timeout(plan.timeout());
        let mut held = set_up(cfg, plan, member)?;
        connect(&mut held, member)?;
        say!("[target] Waiting for data...");
        // Only wrong data (judged, verdict published) goes on to the
        // handshake; any other failure returns now and aborts the pair.
        let rounds = receive::run_all(&held, member);
        if let Err(e) = &rounds {
            if e.downcast_ref::<DataMismatch>().is_none() {
                return rounds;
            }
        }
        tear_down(&mut held, member)?;
        rounds?;
        say!("[target] Complete!");
        Ok(())
    })
}

/// One target per initiator: a second one must leave without touching
/// the first pair's keys (no abort, no heartbeat, no cleanup).
pub(super) fn claim_pair(member: &Member, check_only: bool) -> Result<()> {
    let me = Claim {
        pid: std::process::id(),
        host: crate::results::hostname(),
        check_only,
    };
    if let Some(holder) = member.claim(&p::target_claim(), &me)? {
        bail!(
            "another target (pid {} on {}) already joined this initiator's store: one target per initiator; \
             start another initiator on another --port for a second pair",
            holder.pid,
            holder.host
        );
    }
    Ok(())
}

fn set_up(cfg: &TargetConfig, plan: RunPlan, member: &Member) -> Result<Held> {
    if let Some(want) = cfg.expected_size {
        // The floor round (a bare flag) carries no data and no size.
        let data = || plan.rounds.iter().filter(|r| r.path != WritePath::Flag);
        if data().any(|r| r.size != want) {
            let sizes: Vec<String> = data().map(|r| r.size.to_string()).collect();
            bail!(
                "--size {want} on the target differs from the initiator's ({}): give --size to the initiator only, \
                 or the same to both",
                sizes.join(", ")
            );
        }
    }
    let gpu = Gpu::open(cfg.gpu)?;
    let kernels = Kernels::load(&gpu.ctx)?;
    let me = gpu.info()?;
    // LL rounds need twice their payload: half of every line is its flag.
    let size = plan.max_wire_size();
    gpu.ensure_free(
        size + (1 << 20),
        "the target's data buffer",
        "use a smaller --size on the initiator",
    )?;
    let data = DeviceBuffer::zeroed(&gpu.ctx, size as usize)?;
    let signal = DeviceBuffer::zeroed(&gpu.ctx, 8)?;
    let report = DeviceBuffer::zeroed(&gpu.ctx, 40)?;
    let nixl = create_ucx_agent(p::TARGET_NAME)?;
    let registrations = [&data, &signal]
        .into_iter()
        .map(|b| nixl.agent.register_memory(b, None))
        .collect::<Result<Vec<_>, _>>()
        .context("registering the data buffer and the signal (VRAM)")?;
    // Upstream's keys in upstream's order, then ours.
    member.put(
        &p::target_meta(),
        &AgentMetadata(nixl.agent.get_local_md()?),
    )?;
    member.put(
        &p::target_data_descs(),
        &DescList::new(MemType::Vram, vec![Desc::of(&data)]),
    )?;
    member.put(
        &p::target_signal_descs(),
        &DescList::new(MemType::Vram, vec![Desc::of(&signal)]),
    )?;
    member.put(&p::target_gpu(), &me)?;
    say!("[target] Published metadata and descriptors");
    let own_gpu = me.uuid != plan.initiator_gpu.uuid;
    let wait = cfg.wait.resolve(!own_gpu, gpu.mps);
    let done = DeviceBuffer::zeroed(&gpu.ctx, 8)?;
    Ok(Held {
        own_gpu,
        done,
        ack_view: None,
        _registrations: registrations,
        data,
        signal,
        report,
        nixl,
        kernels,
        gpu,
        plan,
        wait,
    })
}

/// Loads the initiator's metadata and prepares the view of its
/// acknowledgement word.
fn connect(held: &mut Held, member: &Member) -> Result<()> {
    let agent = &held.nixl.agent;
    let md = member.get(&p::initiator_meta(), p::INITIATOR, "agent metadata")?;
    load_peer(agent, &md.0, p::INITIATOR_NAME, held.plan.timeout())
        .map_err(|e| member.blame_member(p::INITIATOR, e))?;
    let ack = member.get(
        &p::initiator_ack_descs(),
        p::INITIATOR,
        "acknowledgement descriptors",
    )?;
    say!("[target] Connected to initiator");
    // SAFETY: the initiator keeps its ack word until we set `target_done`,
    // which `tear_down` does after dropping this view.
    let view = unsafe { prep_remote(agent, &held.nixl.backend, &ack, p::INITIATOR_NAME)? };
    check_view(&view, 1, "the initiator's acknowledgement word")?;
    held.ack_view = Some(view);
    info!("waiting for signals with a {}", held.wait.describe());
    Ok(())
}

/// Waits until the initiator has released its views of our memory, then
/// releases ours of its ack word, deletes our keys and says done as our
/// last message (the initiator deletes it). Deregistration follows when
/// `held` drops.
fn tear_down(held: &mut Held, member: &Member) -> Result<()> {
    let released = member.get(
        &p::initiator_done(),
        p::INITIATOR,
        "release of its memory views",
    );
    drop(held.ack_view.take());
    let _ = held.nixl.agent.invalidate_remote_md(p::INITIATOR_NAME);
    member.delete_written();
    released?;
    member.put_final(&p::target_done(), &Marker)
}
