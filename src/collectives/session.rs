//! One rank's session with its peers: the NIXL agent and its window (one
//! registration for the whole run), the memory views, every case of the
//! sweep with its checks, NCCL's same calls, and a teardown in which nobody
//! frees memory a peer still maps.
//!
//! A case is `warmup` checked calls (`fill → run → check`, run: the
//! operation's kernel entry for the case's algorithm) then `iters` timed
//! ones back to back (`event → run → event`), queued on
//! the rank's stream and watched as one by
//! [`crate::gpu::run::run_watched`] (the host polls, asks the store whether
//! a rank gave up, and cancels the kernels if one did). The run-wide call
//! number gives every call its epoch (number + 1) and its buffer parity.

use std::cell::Cell;
use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use cudarc::driver::{CudaEvent, CudaGraph, CudaStream, result, sys};

use super::case::Case;
use super::kernels::{
    CollData, CollKernels, CollParams, CollReport, CollTiming, CollVerify, calibrate, last_block,
    phases,
};
use super::layout::{MAX_BLOCKS, MAX_RANKS, WindowLayout, piece_elems};
use super::member::Group;
use super::nccl::{Comm, NcclCall};
use super::plan::{DataMode, Launch, Plan, RunConfig, SyncDomain};
use super::report::{FloorTimes, RankTimes};
use crate::cli::DataMismatch;
use crate::gpu::kernels::wait_value_geq;
use crate::gpu::launch::LaunchAs;
use crate::gpu::run::run_watched;
use crate::gpu::{DeviceBuffer, Gpu};
use crate::nixl::net::{Net, PeerCard};
use crate::nixl::serdes::Desc;
use crate::ranks::info::RankInfo;
use crate::ranks::nccl::NcclStatus;
use crate::ranks::sm_share::{RankGpu, sm_share};

crate::json_value!(
    super::plan::RunConfig => "run configuration",
    super::report::RankTimes => "rank result",
);

/// The members a call runs over and the elastic step it belongs to: what
/// the kernels index chunks, slices and output slots by (a fixed run's is
/// every rank, step 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct View {
    /// `members[..ranks]`: the members' ranks, ascending.
    pub members: [u8; MAX_RANKS as usize],
    pub ranks: u32,
    /// This rank's index among them.
    pub me: u32,
    /// The elastic step, from 1; 0 in a fixed run.
    pub step: u64,
    /// Elastic runs: a wait on a rank masks it after this long, ns.
    pub fault_timeout_ns: u64,
    /// The grid limit of these members' calls: their share of their GPUs'
    /// SMs ([`block_plan`]), so survivors of a shrink get the blocks a
    /// fresh run of as many ranks gets; `None`: the session's plan.
    pub max_blocks: Option<u32>,
    /// Every member runs on this GPU: GPU-scope fences and signals suffice
    /// (`CollParams::same_gpu`); otherwise system scope.
    pub same_gpu: bool,
}

impl View {
    /// Every rank of `world`, a fixed run's (`same_gpu`: all on one GPU).
    pub fn all(world: u32, rank: u32, same_gpu: bool) -> Self {
        Self {
            same_gpu,
            ..Self::of(&(0..world).collect(), rank, 0, 0)
        }
    }

    /// `members` (at most [`MAX_RANKS`], `rank` among them).
    pub fn of(
        members: &std::collections::BTreeSet<u32>,
        rank: u32,
        step: u64,
        fault_timeout_ns: u64,
    ) -> Self {
        let mut m = [0u8; MAX_RANKS as usize];
        for (i, &r) in members.iter().enumerate() {
            m[i] = r as u8;
        }
        let me = members.iter().position(|&r| r == rank).expect("a member") as u32;
        Self {
            members: m,
            ranks: members.len() as u32,
            me,
            step,
            fault_timeout_ns,
            max_blocks: None,
            same_gpu: false,
        }
    }
}

/// The block limit of the calls of `infos`' ranks: each rank's share of
/// its GPU's SMs (one block per SM per rank leaves room for the other
/// ranks' blocks and their fill and check kernels under MPS), the smallest
/// share wins; `--blocks` overrides.
pub fn block_plan<'a>(cfg: &RunConfig, infos: impl IntoIterator<Item = &'a RankInfo>) -> Plan {
    let gpus: Vec<RankGpu> = infos
        .into_iter()
        .map(|i| (i.host.as_str(), i.gpu_uuid.as_str(), i.sm_count))
        .collect();
    let (max_ranks_on_gpu, share) = sm_share(&gpus);
    Plan {
        max_blocks: cfg.blocks.unwrap_or(share).clamp(1, MAX_BLOCKS),
        max_ranks_on_gpu,
    }
}

impl Context<'_> {
    /// The view of `members` at `step`, with their block limit (survivors
    /// of a shrink share the GPUs' SMs among fewer ranks).
    pub fn view_of(&self, members: &std::collections::BTreeSet<u32>, step: u64) -> View {
        let mut v = View::of(members, self.group.rank, step, self.cfg.fault_timeout_ns());
        let infos: Vec<&RankInfo> = (self.infos.iter())
            .filter(|i| members.contains(&i.rank))
            .collect();
        let plan = block_plan(self.cfg, infos.iter().copied());
        v.max_blocks = Some(plan.max_blocks);
        v.same_gpu = plan.max_ranks_on_gpu as usize == infos.len();
        v
    }
}

/// What a session works with.
#[derive(Clone, Copy)]
pub struct Context<'a> {
    pub group: &'a Group<'a>,
    pub cfg: &'a RunConfig,
    pub plan: &'a Plan,
    /// The introductions of every rank this one knows, in rank order (a
    /// fixed run: every rank; an elastic run: the members met so far).
    pub infos: &'a [RankInfo],
    pub gpu: &'a Gpu,
    pub kernels: &'a CollKernels,
}

impl Context<'_> {
    /// Whether our calls go by programmatic dependent launch: with
    /// `--pdl`, where every rank has its GPU to itself. Ranks sharing a
    /// GPU each keep to their share of its SMs so that all their blocks are
    /// resident at once; a call waiting resident behind a running one would
    /// take SMs a peer's call needs.
    pub fn pdl(&self) -> bool {
        self.cfg.pdl && self.plan.max_ranks_on_gpu == 1
    }

    /// How our calls are launched, in words: "stream", "graph, PDL",
    /// "stream, remote sync domain" ...
    pub fn launch_words(&self) -> String {
        let how = self.launch_as();
        let mut w = vec![self.cfg.launch.name()];
        w.extend(how.pdl.then_some("PDL"));
        w.extend(how.remote_domain.then_some("remote sync domain"));
        w.join(", ")
    }

    /// How our calls are launched: [`Self::pdl`] and `--sync-domain`.
    pub fn launch_as(&self) -> LaunchAs {
        LaunchAs {
            pdl: self.pdl(),
            remote_domain: self.cfg.sync_domain == SyncDomain::Remote,
        }
    }
}

/// The session's resources. Fields drop in declaration order: the NIXL
/// side (views, registration, agent), then the memory.
pub struct Session {
    net: Net,
    pub layout: WindowLayout,
    window: DeviceBuffer,
    report: DeviceBuffer,
    verify: DeviceBuffer,
    sent: DeviceBuffer,
    abort_sent: DeviceBuffer,
    /// The calls' members and step ([`View::all`] unless an elastic run
    /// shrinks it).
    pub view: Cell<View>,
    /// A case's calls' [`CollTiming`] stamps.
    timing: DeviceBuffer,
    /// The gate the timed calls wait behind (see `run_case`).
    gate: DeviceBuffer,
    side: std::sync::Arc<CudaStream>,
    /// The gate's last value (it only grows).
    gates: Cell<u64>,
    /// Every peer's window as `nixlGetPtr` gives it (store path), looked
    /// up by [`Session::check_pointers`] (an elastic run: again whenever
    /// its members change, [`Session::probe_members`]), by rank.
    ptrs: Option<Vec<u64>>,
    corrupted: Cell<bool>,
}

impl Session {
    /// A fixed run's session: [`Session::create`], then every other rank's
    /// card and the remote view over all ranks (element `r`: rank `r`'s
    /// window).
    pub fn open(ctx: &Context) -> Result<Self> {
        let (mut s, card) = Self::create(ctx, 0)?;
        s.connect_all(ctx, &card)?;
        Ok(s)
    }

    /// Window (zeroed: the flags start at epoch 0), agent (that of this
    /// rank's process of phase `incarnation`), registration and local view
    /// ([`Net::open`]) and the session's buffers; returns it with this
    /// rank's card. No peer is connected yet.
    pub fn create(ctx: &Context, incarnation: usize) -> Result<(Self, PeerCard)> {
        let g = ctx.group;
        let layout = WindowLayout::new(ctx.cfg.max_bytes(), ctx.cfg.ll128_bytes(), g.world);
        let alloc = |len: u64, what: &str| {
            DeviceBuffer::zeroed(&ctx.gpu.ctx, len as usize).with_context(|| {
                format!("allocating {what} ({len} bytes) on GPU {}", ctx.gpu.ordinal)
            })
        };
        let window = alloc(layout.bytes, "the window")?;
        let desc = Desc {
            addr: window.addr(),
            len: layout.bytes,
            dev_id: window.ordinal() as u64,
        };
        let agent = g.agent_name(g.rank, incarnation);
        let (net, card) = Net::open(&agent, &window, desc, g.world)?;
        let same_gpu = ctx.plan.max_ranks_on_gpu == g.world;
        let s = Self {
            net,
            layout,
            report: alloc(size_of::<CollReport>() as u64, "the report")?,
            verify: alloc(size_of::<CollVerify>() as u64, "the check report")?,
            sent: alloc(
                2 * u64::from(MAX_BLOCKS) * u64::from(MAX_RANKS) * 8,
                "the epochs sent",
            )?,
            abort_sent: alloc(u64::from(MAX_RANKS) * 8, "the aborts sent")?,
            view: Cell::new(View::all(g.world, g.rank, same_gpu)),
            gate: alloc(8, "the gate")?,
            timing: alloc(
                (size_of::<CollTiming>() as u32 * ctx.cfg.calls()).into(),
                "the timing stamps",
            )?,
            side: ctx.gpu.ctx.new_stream()?,
            gates: Cell::new(0),
            ptrs: None,
            window,
            corrupted: Cell::new(false),
        };
        Ok((s, card))
    }

    /// A fixed run: publishes `card`, connects to every other rank's and
    /// puts the remote view over all ranks in place.
    fn connect_all(&mut self, ctx: &Context, card: &PeerCard) -> Result<()> {
        let g = ctx.group;
        g.put(&g.rank_entry(g.rank, "card"), card)?;
        for r in (0..g.world).filter(|&r| r != g.rank) {
            let card = g.peer_card(r)?;
            (self.net.connect(r, &card, g.timeout())).map_err(|e| g.blame_member(r as usize, e))?;
        }
        // SAFETY: no kernel runs yet; peers keep their windows until every
        // rank passed "released" (close).
        unsafe { self.net.rebuild(&[]) }
    }

    /// An elastic run, when a phase begins (no kernel runs): drops the
    /// elements of ranks not in `keep`'s (rank, agent) pairs, connects the
    /// `new` peers, and puts the remote view over them in place. Returns the
    /// new peers that could not be connected, with why (their element
    /// stays empty; the caller judges whether they died).
    pub fn reconnect(
        &mut self,
        keep: &[(u32, String)],
        new: &[(u32, &PeerCard)],
        timeout: Duration,
    ) -> Result<Vec<(u32, anyhow::Error)>> {
        let departed = self.net.retain(keep);
        let mut failed = Vec::new();
        for &(r, card) in new {
            if let Err(e) = self.net.connect(r, card, timeout) {
                failed.push((r, e));
            }
        }
        // SAFETY: no kernel of ours runs between steps; the phase's members
        // keep their windows registered until they pass the run's end.
        unsafe { self.net.rebuild(&departed)? };
        Ok(failed)
    }

    /// `nixlGetPtr` of the window of every rank in `ranks` (connected), 1
    /// for this rank, 0 for the others: returns the pointers (by rank) and
    /// the ranks of `ranks` it gave none for.
    fn probe(&self, ctx: &Context, ranks: &BTreeSet<u32>) -> Result<(Vec<u64>, Vec<u32>)> {
        let (g, remote) = (ctx.group, self.net.views().remote);
        if remote == 0 {
            return Ok((
                vec![0; g.world as usize],
                ranks.iter().copied().filter(|&r| r != g.rank).collect(),
            ));
        }
        let probe = DeviceBuffer::zeroed(&ctx.gpu.ctx, 8 * g.world as usize)?;
        let wanted = ranks.iter().fold(0u64, |m, &r| m | 1u64 << r);
        // SAFETY: the view is live, its elements of `ranks` are connected;
        // the probe buffer holds `world` u64.
        unsafe {
            let which = (g.world, g.rank, wanted);
            (ctx.kernels).launch_probe(&ctx.gpu.stream, remote, which, probe.addr())?
        };
        let mut raw = vec![0u64; g.world as usize];
        probe.download(&ctx.gpu.stream, bytemuck::cast_slice_mut(&mut raw))?;
        let none = ranks
            .iter()
            .copied()
            .filter(|&r| raw[r as usize] == 0)
            .collect();
        Ok((raw, none))
    }

    /// The store path needs every peer's window mapped into ours; every rank
    /// learns whether all can, so all stop together with the same message.
    /// The pointers are kept for the kernels (`CollParams::peer_ptr`).
    pub fn check_pointers(&mut self, ctx: &Context) -> Result<()> {
        let g = ctx.group;
        let (ptrs, unreachable) = self.probe(ctx, &(0..g.world).collect())?;
        if unreachable.is_empty() {
            self.ptrs = Some(ptrs);
        }
        let unreachable: Vec<usize> = unreachable.iter().map(|&r| r as usize).collect();
        g.put(&g.rank_entry(g.rank, "store"), &unreachable)?;
        for r in 0..g.world {
            let theirs: Vec<usize> = g.get(&g.rank_entry(r, "store"), r, "pointer check")?;
            if let Some(&p) = theirs.first() {
                bail!("{}", unmapped(r, p as u32));
            }
        }
        Ok(())
    }

    /// An elastic run's store path, once a phase's remote view is in place:
    /// the pointers to `members`' windows. Errors: a member this rank
    /// cannot map (every member finds the same at once; a transport
    /// without mapped peer memory fails the run in its first phase).
    pub fn probe_members(&mut self, ctx: &Context, members: &BTreeSet<u32>) -> Result<()> {
        let (ptrs, unreachable) = self.probe(ctx, members)?;
        if let Some(&p) = unreachable.first() {
            bail!("{}", unmapped(ctx.group.rank, p));
        }
        self.ptrs = Some(ptrs);
        Ok(())
    }

    /// Drops the views, waits until every rank has, then deregisters.
    pub fn close(self, ctx: &Context) -> Result<()> {
        self.net.close(|| ctx.group.barrier("released"))
    }
}

/// Rank `r` got no pointer to rank `p`'s window, in words.
fn unmapped(r: u32, p: u32) -> String {
    format!(
        "the store path needs peer memory mapped into each rank (NVLink through cuda_ipc), but rank {r} got no \
         pointer to rank {p}'s window from nixlGetPtr (an RDMA-only transport?): use --path put"
    )
}

/// A case in words, for messages.
pub fn describe(case: &Case, ranks: u32) -> String {
    format!(
        "{} {} {} path, {}, {}-place, {} B (count {})",
        case.op.name(),
        case.algo.name(),
        case.path.name(),
        case.dtype.name(),
        if case.in_place { "in" } else { "out-of" },
        case.bytes(ranks),
        case.count
    )
}

impl Session {
    /// Every case and, where NCCL runs, its calls; returns this rank's times.
    pub fn measure(&self, ctx: &Context, comm: Option<&Comm>) -> Result<RankTimes> {
        let g = ctx.group;
        let mut times = RankTimes {
            rank: g.rank,
            ..Default::default()
        };
        let nccl_bufs = match comm {
            Some(_) => {
                let b = ctx.cfg.max_bytes() as usize;
                Some((
                    DeviceBuffer::zeroed(&ctx.gpu.ctx, b)?,
                    DeviceBuffer::zeroed(&ctx.gpu.ctx, b)?,
                ))
            }
            None => None,
        };
        let mut call = 0u64;
        let groups = ctx.cfg.groups();
        for (n, grp) in groups.iter().enumerate() {
            for case in &grp.cases {
                crate::stall::waiting_on(describe(case, g.world));
                let t = self.run_case(ctx, case, call)?;
                times.cases.push(t.events);
                times.kernel.push(t.kernel);
                times.kernel_last.push(t.kernel_last);
                times.phases.push(t.phases);
                times.batch.push(t.batch);
                call += u64::from(ctx.cfg.calls());
            }
            let case = &grp.cases[0];
            crate::stall::waiting_on(format!(
                "NCCL's calls (the baseline) beside {}",
                describe(case, g.world)
            ));
            let nccl = match (comm, &nccl_bufs) {
                (Some(c), Some(b)) => Some(self.run_nccl(ctx, c, case, b)?),
                _ => None,
            };
            times.nccl_batch.push(nccl.as_ref().map(|n| n.1));
            times.nccl.push(nccl.map(|n| n.0));
            crate::stall::progressed();
            if g.rank == 0 && (n + 1) % 8 == 0 {
                tracing::info!("{}/{} sizes verified", n + 1, groups.len());
            }
        }
        // Last, on a GPU the cases have warmed, once every rank is done
        // with them (ranks sharing a GPU would otherwise time it beside
        // another's calls).
        g.barrier("floor")?;
        crate::stall::waiting_on("the launch floor (an empty kernel)");
        times.floor = Some(self.measure_floor(ctx)?);
        Ok(times)
    }

    /// The call's kernel parameters.
    fn params(&self, ctx: &Context, case: &Case, call: u64) -> CollParams {
        let views = self.net.views();
        let v = self.view.get();
        let (off_in, off_out) = case.in_out(&self.layout, v.me, call);
        let (off_recv, recv_stride) = self.layout.recv_area(case.algo, call);
        CollParams {
            local_mvh: views.local,
            remote_mvh: views.remote,
            window: self.window.addr(),
            report: self.report.addr(),
            sent: self.sent.addr(),
            timing: self.timing.addr()
                + (call % u64::from(ctx.cfg.calls())) * size_of::<CollTiming>() as u64,
            off_flags: self.layout.flags,
            off_in,
            off_out,
            off_recv,
            recv_stride,
            count: case.count,
            epoch: call + 1,
            timeout_ns: ctx.cfg.timeout_ns,
            rank: v.me,
            ranks: v.ranks,
            op: case.op.spec().code(),
            algo: case.algo.code(),
            path: case.path.code(),
            dtype: case.dtype.code(),
            same_gpu: u32::from(v.same_gpu),
            has_peer_ptr: u32::from(self.ptrs.is_some()),
            off_abort: self.layout.abort,
            step: v.step,
            fault_timeout_ns: v.fault_timeout_ns,
            abort_sent: self.abort_sent.addr(),
            members: v.members,
            peer_ptr: self.peer_ptr(v.members, v.ranks),
            piece_elems: piece_elems(ctx.cfg.piece_bytes, case.dtype.bytes()),
        }
    }

    /// `CollParams::peer_ptr`: the window of each of the call's members
    /// (index order), or zeros where the session has no pointers.
    fn peer_ptr(&self, members: [u8; MAX_RANKS as usize], ranks: u32) -> [u64; MAX_RANKS as usize] {
        let mut out = [0u64; MAX_RANKS as usize];
        if let Some(ptrs) = &self.ptrs {
            for (o, &r) in out.iter_mut().zip(&members).take(ranks as usize) {
                *o = ptrs.get(usize::from(r)).copied().unwrap_or(0);
            }
        }
        out
    }

    fn data(&self, ctx: &Context, case: &Case, input: u64, output: u64, call: u64) -> CollData {
        let v = self.view.get();
        CollData {
            input,
            output,
            verify: self.verify.addr(),
            count: case.count,
            rank: v.me,
            ranks: v.ranks,
            report: match v.step {
                0 => 0,
                _ => self.report.addr(),
            },
            members: v.members,
            op: case.op.spec().code(),
            dtype: case.dtype.code(),
            call: call as u32,
            random: u32::from(ctx.cfg.data == DataMode::Random),
        }
    }
}

/// A case's timed calls, ns.
struct CaseTimes {
    /// Each call's GPU time (an event before and after it).
    events: Vec<f64>,
    /// Block 0's time inside the kernel.
    kernel: Vec<f64>,
    /// Block 0's start to the end of the call's last block.
    kernel_last: Vec<f64>,
    /// Where block 0's phase 0 went (setup, push, signal, wait).
    phases: Vec<[f64; 4]>,
    /// The batch's mean time per call.
    batch: f64,
}

impl Session {
    /// One case: its calls queued and watched, then the report and the
    /// checks read; returns the timed calls' GPU times, their in-kernel
    /// times and where block 0's phase 0 spent them, ns.
    ///
    /// The warm-up calls are the checked ones: each gets fresh inputs and
    /// every output element is compared. The timed calls then run back to
    /// back, as nccl-tests times them (a fill or check kernel between them
    /// would hold up the peers waiting on this rank and be counted in
    /// their time), on one fill of inputs; out of place, the last two
    /// outputs (both parities) are checked after them. They wait behind a
    /// gate (a stream wait on a word this rank's side stream writes once
    /// everything is queued), so the GPU runs them at its own pace, not at
    /// the rate the host launches them; two untimed calls after the gate
    /// absorb the ranks' different release times.
    fn run_case(&self, ctx: &Context, case: &Case, first: u64) -> Result<CaseTimes> {
        let (g, cfg) = (ctx.group, ctx.cfg);
        let blocks = case.blocks(g.world, ctx.plan.max_blocks, cfg.block_bytes);
        let (warm, iters) = (u64::from(cfg.warmup), u64::from(cfg.iters));
        let data = |c: u64, id: u64| {
            let p = self.params(ctx, case, c);
            (
                p,
                self.data(ctx, case, p.window + p.off_in, p.window + p.off_out, id),
            )
        };
        let mut checks = 0u64;
        self.verify.zero(&ctx.gpu.stream)?;
        let id = first + warm;
        // SAFETY: every address belongs to this session, which outlives the
        // work (run_watched waits for it).
        let timed = Timed::new(ctx, iters + 2, iters, &|s: &CudaStream, k: u64| unsafe {
            Ok(ctx
                .kernels
                .launch_run(s, case, blocks, &data(id + k, id).0, ctx.launch_as())?)
        })?;
        let queue = |s: &CudaStream| -> Result<()> {
            // SAFETY: as above.
            unsafe {
                for c in first..id {
                    let (p, d) = data(c, c);
                    ctx.kernels.launch_data(s, false, &d)?;
                    ctx.kernels
                        .launch_run(s, case, blocks, &p, ctx.launch_as())?;
                    self.maybe_corrupt(ctx, s, d.output, c - first)?;
                    ctx.kernels.launch_data(s, true, &d)?;
                    checks += 1;
                }
                ctx.kernels.launch_data(s, false, &data(id, id).1)?;
                let gate = self.close_gate(s)?;
                timed.queue(s, &|s: &CudaStream, k: u64| {
                    Ok(ctx.kernels.launch_run(
                        s,
                        case,
                        blocks,
                        &data(id + k, id).0,
                        ctx.launch_as(),
                    )?)
                })?;
                // Every timed call computes the same output from one fill:
                // the last two (both parities) stand for all.
                let end = id + 2 + 2 * iters;
                for c in end - 2..end {
                    if !case.in_place {
                        ctx.kernels.launch_data(s, true, &data(c, id).1)?;
                        checks += 1;
                    }
                }
                self.open_gate(gate)?;
            }
            Ok(())
        };
        let what = describe(case, g.world);
        self.watch_gated(ctx, &what, queue)?;
        self.check_report(ctx, &what)?;
        self.check_verify(ctx, &what, case.elems(g.world).1 * checks)?;
        let mut raw = vec![CollTiming::default(); cfg.calls() as usize];
        self.timing
            .download(&ctx.gpu.stream, bytemuck::cast_slice_mut(&mut raw))?;
        let stamps = &raw[(warm + 2) as usize..(warm + 2 + iters) as usize];
        let batch = timed.batch_mean()?;
        let kernel = calibrate(stamps)?;
        Ok(CaseTimes {
            events: timed.times(2)?,
            kernel_last: last_block(stamps, &kernel),
            kernel,
            phases: phases(stamps)?,
            batch,
        })
    }

    /// The launch floor: `coll_empty`, which only starts and ends as a call
    /// does, queued and timed as [`Self::run_case`] times a case's calls
    /// (behind the gate; each between its events, then a batch back to
    /// back; stream or graph, with the calls' launch attributes:
    /// [`Context::launch_as`]), ns.
    fn measure_floor(&self, ctx: &Context) -> Result<FloorTimes> {
        let iters = u64::from(ctx.cfg.iters);
        let call = |s: &CudaStream, _: u64| -> Result<()> {
            Ok(ctx.kernels.launch_empty(s, ctx.launch_as())?)
        };
        let timed = Timed::new(ctx, iters + 2, iters, &call)?;
        let queue = |s: &CudaStream| -> Result<()> {
            let gate = self.close_gate(s)?;
            timed.queue(s, &call)?;
            self.open_gate(gate)
        };
        self.watch_gated(ctx, "the launch floor (an empty kernel)", queue)?;
        Ok(FloorTimes {
            per_call: timed.times(2)?,
            batch: timed.batch_mean()?,
        })
    }

    /// Runs `queue`'s work, whose timed calls wait behind a gate, watched
    /// ([`run_watched`]); errors name this rank and `what`, and work the
    /// run's timeout had to release (ours or NCCL's: its times would be the
    /// timeout's) is one.
    fn watch_gated(
        &self,
        ctx: &Context,
        what: &str,
        queue: impl FnOnce(&CudaStream) -> Result<()>,
    ) -> Result<()> {
        let (g, timeout) = (ctx.group, Duration::from_nanos(ctx.cfg.timeout_ns));
        let gate = Some(self.gate.addr());
        let done = run_watched(ctx.gpu, &self.report, timeout, gate, queue, || g.probe())
            .with_context(|| format!("rank {}: {what}", g.rank))?;
        match done.released {
            true => bail!(
                "rank {}: {what}: not done within the timeout (gate released)",
                g.rank
            ),
            false => Ok(()),
        }
    }

    /// Queues a wait behind the next gate; returns its value.
    fn close_gate(&self, s: &CudaStream) -> Result<u64> {
        let v = self.gates.get() + 1;
        self.gates.set(v);
        // SAFETY: the gate lives as long as the session.
        unsafe { wait_value_geq(s, self.gate.addr(), v)? };
        Ok(v)
    }

    /// Everything is queued: opens gate `v` from the side stream.
    fn open_gate(&self, v: u64) -> Result<()> {
        // SAFETY: an 8-byte write into the live gate.
        unsafe {
            sys::cuStreamWriteValue64_v2(self.side.cu_stream(), self.gate.addr(), v, 0).result()?
        };
        Ok(())
    }

    /// The test hook: garbles output element 0 of the first checked call.
    fn maybe_corrupt(&self, ctx: &Context, s: &CudaStream, out: u64, k: u64) -> Result<()> {
        if ctx.cfg.corrupt_rank == Some(ctx.group.rank) && k == 0 && !self.corrupted.get() {
            self.corrupted.set(true);
            tracing::warn!("injected fault: corrupting output element 0");
            // SAFETY: two bytes inside the live output.
            unsafe { sys::cuMemsetD8Async(out, 0x7f, 2, s.cu_stream()).result()? };
        }
        Ok(())
    }

    /// NCCL's call of the same size, queued, timed and checked as ours.
    ///
    /// The checked warm-up calls (`--warmup`, at least 1) run first and
    /// finish before the timed calls are captured (nccl-tests' order): NCCL
    /// connects an algorithm's channels at its first call, so the capture
    /// finds them connected. Captured calls run only with NCCL's
    /// graph-mixing support off ([`crate::ranks::nccl::GRAPH_MIXING`]).
    fn run_nccl(
        &self,
        ctx: &Context,
        comm: &Comm,
        case: &Case,
        bufs: &(DeviceBuffer, DeviceBuffer),
    ) -> Result<(Vec<f64>, f64)> {
        let (g, cfg) = (ctx.group, ctx.cfg);
        let (warm, iters) = (u64::from(cfg.warmup), u64::from(cfg.iters));
        self.verify.zero(&ctx.gpu.stream)?;
        let d = self.data(ctx, case, bufs.0.addr(), bufs.1.addr(), warm);
        // SAFETY: both buffers hold the largest call; they outlive the work.
        let call = |s: &CudaStream, d: &CollData| unsafe {
            let c = NcclCall::new(comm, s, (case.dtype, case.count), (d.input, d.output));
            case.op.spec().nccl(&c)
        };
        let what = format!("NCCL {} {} B", case.op.name(), case.bytes(g.world));
        let warm_up = |s: &CudaStream| -> Result<()> {
            // SAFETY: as in run_case.
            unsafe {
                for c in 0..warm {
                    let d = self.data(ctx, case, bufs.0.addr(), bufs.1.addr(), c);
                    ctx.kernels.launch_data(s, false, &d)?;
                    call(s, &d)?;
                    ctx.kernels.launch_data(s, true, &d)?;
                }
            }
            Ok(())
        };
        crate::stall::waiting_on(format!("{what}: the checked warm-up calls"));
        self.watch_gated(ctx, &format!("{what} (warm-up)"), warm_up)?;
        crate::stall::waiting_on(format!(
            "{what}: capturing the timed calls ({})",
            cfg.launch.name()
        ));
        let timed = Timed::new(ctx, iters + 2, iters, &|s: &CudaStream, _| call(s, &d))?;
        crate::stall::waiting_on(format!("{what}: the timed calls ({})", cfg.launch.name()));
        let queue = |s: &CudaStream| -> Result<()> {
            // SAFETY: as in run_case.
            unsafe {
                ctx.kernels.launch_data(s, false, &d)?;
                let gate = self.close_gate(s)?;
                timed.queue(s, &|s: &CudaStream, _| call(s, &d))?;
                ctx.kernels.launch_data(s, true, &d)?;
                self.open_gate(gate)?;
            }
            Ok(())
        };
        self.watch_gated(ctx, &what, queue)?;
        self.check_verify(ctx, &what, case.elems(g.world).1 * (warm + 1))?;
        Ok((timed.times(2)?, timed.batch_mean()?))
    }

    /// A wait that gave up, a failed NIXL call or an unmapped peer, named.
    fn check_report(&self, ctx: &Context, what: &str) -> Result<()> {
        let mut r = CollReport::default();
        self.report
            .download(&ctx.gpu.stream, bytemuck::bytes_of_mut(&mut r))?;
        let me = ctx.group.rank;
        if r.null_ptr_rank != 0 {
            bail!(
                "rank {me}, {what}: nixlGetPtr returned no pointer to rank {}'s window: use --path put",
                r.null_ptr_rank - 1
            );
        }
        if r.base.timed_out != 0 {
            bail!(
                "rank {me}, {what}: phase {} of block {} waited {} s for rank {}'s signal (epoch {}, saw {}): rank {} \
                 stopped, is stuck, or runs other arguments",
                r.wait_phase,
                r.wait_block,
                ctx.cfg.timeout_ns as f64 / 1e9,
                r.wait_rank,
                r.wait_target,
                r.base.observed,
                r.wait_rank
            );
        }
        if r.base.errors != 0 {
            bail!(
                "rank {me}, {what}: {} NIXL device call(s) failed, the first with status {}",
                r.base.errors,
                r.base.first_status
            );
        }
        Ok(())
    }

    /// Exit 3 naming rank, call, element, expected and got; also fails when
    /// not every output element was compared.
    fn check_verify(&self, ctx: &Context, what: &str, want_checked: u64) -> Result<()> {
        let mut v = CollVerify::default();
        self.verify
            .download(&ctx.gpu.stream, bytemuck::bytes_of_mut(&mut v))?;
        let me = ctx.group.rank;
        if v.mismatches != 0 {
            return Err(DataMismatch(format!(
                "rank {me}, {what}, call {}: output element {} is {}, expected {} ({} wrong element(s) in this case)",
                v.call, v.element, v.got, v.expected, v.mismatches
            ))
            .into());
        }
        if v.checked != want_checked {
            bail!(
                "rank {me}, {what}: the check compared {} elements, expected {want_checked}",
                v.checked
            );
        }
        Ok(())
    }
}

/// A case's timed calls, each between two events, then a batch of calls
/// between two events only (nccl-tests' time: the mean of back-to-back
/// calls, no event record between them): queued straight on the rank's
/// stream (`--launch stream`), or captured once into a CUDA graph and that
/// graph launched (`--launch graph`, nccl-tests' `-G`), which spares every
/// call its own launch. The calls' epochs are fixed when captured, so a
/// graph runs once; the events are event-record nodes in it
/// (`CU_EVENT_RECORD_EXTERNAL`), so every call keeps its own time.
struct Timed {
    events: Vec<(CudaEvent, CudaEvent)>,
    batch: (u64, CudaEvent, CudaEvent),
    graph: Option<CudaGraph>,
}

/// Queues timed call `k` of a case on a stream.
type Call<'a> = dyn Fn(&CudaStream, u64) -> Result<()> + 'a;

impl Timed {
    /// `n` pairs of events and a batch of `batch` calls; with `--launch
    /// graph` all `n + batch` calls of `call` captured now (on a stream of
    /// their own, relaxed capture mode: the NCCL baseline is captured the
    /// same way).
    fn new(ctx: &Context, n: u64, batch: u64, call: &Call) -> Result<Self> {
        let (a, b) = event_pairs(ctx, 1)?.remove(0);
        let mut t = Timed {
            events: event_pairs(ctx, n)?,
            batch: (batch, a, b),
            graph: None,
        };
        if ctx.cfg.launch == Launch::Graph {
            let cap = ctx.gpu.ctx.new_stream()?;
            cap.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)?;
            let queued = t.record(&cap, true, call);
            // The capture ends whatever happened inside it.
            let graph = cap.end_capture(sys::CUgraphInstantiate_flags(0));
            queued.context("capturing the timed calls into a CUDA graph")?;
            let graph = graph
                .context("instantiating the CUDA graph of the timed calls")?
                .context("the CUDA graph of the timed calls is empty")?;
            graph.upload()?;
            t.graph = Some(graph);
        }
        Ok(t)
    }

    /// Records every call between its events on `s` (`external`: as
    /// event-record nodes of the capture in progress).
    fn record(&self, s: &CudaStream, external: bool, call: &Call) -> Result<()> {
        let mark = |e: &CudaEvent| -> Result<()> {
            let flags = if external { 1 } else { 0 }; // CU_EVENT_RECORD_EXTERNAL
            // SAFETY: a live event and stream of this context.
            unsafe { sys::cuEventRecordWithFlags(e.cu_event(), s.cu_stream(), flags).result()? };
            Ok(())
        };
        for (k, (a, b)) in self.events.iter().enumerate() {
            mark(a)?;
            call(s, k as u64)?;
            mark(b)?;
        }
        let (n, (batch, a, b)) = (self.events.len() as u64, &self.batch);
        mark(a)?;
        for k in n..n + batch {
            call(s, k)?;
        }
        mark(b)
    }

    /// Queues the calls on `s`: the graph's launch, or the calls themselves.
    fn queue(&self, s: &CudaStream, call: &Call) -> Result<()> {
        match &self.graph {
            // SAFETY: the graph's nodes use this session's memory, which
            // outlives the work.
            Some(g) => unsafe { result::graph::launch(g.cu_graph_exec(), s.cu_stream())? },
            None => self.record(s, false, call)?,
        }
        Ok(())
    }

    /// GPU time of each call after the first `skip`, ns.
    fn times(&self, skip: usize) -> Result<Vec<f64>> {
        elapsed_ns(&self.events[skip..])
    }

    /// The batch's GPU time over its calls, ns (0 without a batch).
    fn batch_mean(&self) -> Result<f64> {
        let (n, a, b) = &self.batch;
        Ok(if *n == 0 {
            0.0
        } else {
            f64::from(a.elapsed_ms(b)?) * 1e6 / *n as f64
        })
    }
}

/// `n` pairs of events to time `n` calls between.
fn event_pairs(ctx: &Context, n: u64) -> Result<Vec<(CudaEvent, CudaEvent)>> {
    let ev = || {
        ctx.gpu
            .ctx
            .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
    };
    (0..n).map(|_| Ok((ev()?, ev()?))).collect()
}

/// The GPU time between each pair of `events`, ns.
fn elapsed_ns(events: &[(CudaEvent, CudaEvent)]) -> Result<Vec<f64>> {
    (events.iter())
        .map(|(a, b)| Ok(f64::from(a.elapsed_ms(b)?) * 1e6))
        .collect()
}

/// Connects NCCL when every rank has it; otherwise, or when NCCL refuses,
/// returns why (every rank learns every rank's outcome, so all agree).
pub fn connect_nccl(ctx: &Context, infos: &[RankInfo]) -> Result<Result<Comm, String>> {
    if !ctx.cfg.baseline {
        return Ok(Err("--no-baseline".into()));
    }
    let statuses: Vec<&NcclStatus> = infos.iter().map(|i| &i.nccl).collect();
    let (g, gpu) = (ctx.group, ctx.gpu);
    crate::ranks::nccl::connect_all(g, gpu, &statuses, ctx.plan.max_ranks_on_gpu)
}

/// What one elastic step left behind ([`Session::run_step`]).
#[derive(Clone, Debug, Default)]
pub struct StepOutcome {
    /// GPU time of each call that completed and was checked, ns.
    pub times_ns: Vec<f64>,
    /// Calls of the step that were abandoned (not checked).
    pub lost: u32,
    /// Ranks this rank's waits masked (past the fault timeout).
    pub masked: std::collections::BTreeSet<u32>,
    /// GPU time the wait that masked first had waited, ns.
    pub waited_ns: Option<u64>,
}

impl Session {
    /// One step of an elastic run over [`Session::view`]: `calls` calls of
    /// `case` from call number `first`, each `fill → run → check` with
    /// its own inputs and every output element compared, timed by events
    /// around the run. A wait past the fault timeout abandons the step
    /// on every member (the calls left return at once, their checks count
    /// them lost); that is not an error. Errors: a wait past `--timeout`,
    /// a failed NIXL call, an unmapped peer, a wrong element (exit 3).
    pub fn run_step(
        &self,
        ctx: &Context,
        case: &Case,
        first: u64,
        calls: u64,
    ) -> Result<StepOutcome> {
        let (g, v) = (ctx.group, self.view.get());
        let blocks = case.blocks(
            v.ranks,
            v.max_blocks.unwrap_or(ctx.plan.max_blocks),
            ctx.cfg.block_bytes,
        );
        let events = event_pairs(ctx, calls)?;
        self.verify.zero(&ctx.gpu.stream)?;
        let queue = |s: &CudaStream| -> Result<()> {
            for (k, (a, b)) in events.iter().enumerate() {
                let c = first + k as u64;
                let p = self.params(ctx, case, c);
                let d = self.data(ctx, case, p.window + p.off_in, p.window + p.off_out, c);
                // SAFETY: every address belongs to this session, which
                // outlives the work (run_watched waits for it).
                unsafe {
                    ctx.kernels.launch_data(s, false, &d)?;
                    a.record(s)?;
                    ctx.kernels
                        .launch_run(s, case, blocks, &p, ctx.launch_as())?;
                    b.record(s)?;
                    ctx.kernels.launch_data(s, true, &d)?;
                }
            }
            Ok(())
        };
        let what = describe(case, v.ranks);
        let timeout = Duration::from_nanos(ctx.cfg.timeout_ns);
        run_watched(ctx.gpu, &self.report, timeout, None, queue, || g.probe())
            .with_context(|| format!("rank {}: {what}", g.rank))?;
        self.check_report(ctx, &what)?;
        let mut r = CollReport::default();
        self.report
            .download(&ctx.gpu.stream, bytemuck::bytes_of_mut(&mut r))?;
        let mut vf = CollVerify::default();
        self.verify
            .download(&ctx.gpu.stream, bytemuck::bytes_of_mut(&mut vf))?;
        let done = calls - u64::from(vf.lost);
        self.check_verify(ctx, &what, case.elems(v.ranks).1 * done)?;
        let times_ns = elapsed_ns(&events[..done as usize])?;
        Ok(StepOutcome {
            times_ns,
            lost: vf.lost,
            masked: (0..64).filter(|b| r.masked_bits >> b & 1 == 1).collect(),
            waited_ns: (r.raised != 0).then(|| r.first_mask_ns.saturating_sub(r.first_wait_ns)),
        })
    }

    /// Closes an elastic run's session: every survivor passed the phase's
    /// end (none writes into our window any more; the dead never will), so
    /// the views and the registration go without the all-ranks barrier of
    /// [`Session::close`].
    pub fn close_survived(self) -> Result<()> {
        self.net.close(|| Ok(()))
    }
}
