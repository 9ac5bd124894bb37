//! One rank's session with its peers, written as its phases:
//!
//! 1. **meet** — every rank runs one configuration (the first to get there
//!    stores it, the others must match it), introduces itself, and follows
//!    one setup, which every member of the first phase makes alike from
//!    the introductions (the first to get there stores it): no rank is
//!    special, so any may die;
//! 2. **open** — this rank's device memory ([`Rig`]), its NIXL agent, the
//!    registered window and the local memory view ([`Net`], the NIXL side);
//! 3. for each phase of the plan this process lives ([`Membership::life`]):
//!    - **connect** — drop the peers that departed, connect to the phase's
//!      newcomers (every member, in this process's first phase), prepare the
//!      remote view anew (no kernel runs), set the mask to the phase's
//!      members and bring the newcomers' words in our window to the step
//!      they start at; the round that opens the phase ([`Membership::opened`]),
//!      whose decision masks those that died meanwhile;
//!    - **steps** — every data path's warm-up and timed steps
//!      ([`super::steps`]); in an elastic run each is followed by the
//!      agreement on who is gone ([`Membership::agree`]), whose decision goes
//!      into the mask before the next step;
//!    - **end** — publish what the phase measured, and the round that ends
//!      the phase with the other survivors ([`Membership::end_phase`]);
//! 4. **leave** — drop the views and the window: after the last phase's
//!    end no rank writes into it any more;
//! 5. **report** — the lowest survivor of the last phase gathers every
//!    rank's results and prints them (per phase in an elastic run).
//!
//! A run without `--plan` or `--elastic` is the plan of one phase of every
//! rank, with masking off ([`crate::ranks::membership::OnDeath::Fail`]): a rank that
//! stops is named by the waits, as always.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use anyhow::Result;

use super::config::{Grid, Path, RunConfig};
use super::kernels::EpKernels;
use super::keys::EpKeys;
use super::mask::Mask;
use super::model::Model;
use super::nccl::{self, NcclStatus};
use super::phase_report::{self, Detection, PhaseMembers, PhaseResult, PhaseSteps};
use super::report::{self, PathTimes, RankInfo, RankResult};
use super::rig::Rig;
use super::setup::{Corrupt, RunOptions, Setup, make_setup};
use super::steps::{Outcome, Stepper};
use crate::gpu::Gpu;
use crate::nixl::net::{Net, PeerCard};
use crate::ranks::driver::decision_line;
use crate::ranks::group::Group;
use crate::ranks::membership::{Decision, END, Membership, Peer, RESYNC, lowest, unix_ns};
use crate::say;

/// What this rank brings: its GPU, the kernels loaded there, the CPU model
/// of the run, and its introduction.
pub struct Local<'a> {
    pub gpu: &'a Gpu,
    pub kernels: &'a EpKernels,
    pub model: &'a Model,
    pub info: &'a RankInfo,
}

/// Runs the session over the plan `el` follows. In an elastic run
/// ([`Membership::survives`]) the kernels mask ranks whose waits pass the
/// fault timeout and the survivors agree on who is gone after every step;
/// otherwise every wait is fatal. The lowest survivor prints the report.
pub fn run(
    g: &Group,
    el: &Membership,
    cfg: &RunConfig,
    opts: &RunOptions,
    local: &Local,
) -> Result<()> {
    let setup = meet(g, el, cfg, local.info)?;
    let steps_per_phase = cfg.total_iterations() as u32;
    let rig = Rig::new(
        local.gpu,
        local.model,
        u64::from(steps_per_phase) * el.plan().len() as u64,
    )?;
    let agent = g.agent_name(g.rank, el.incarnation());
    let (mut net, card) = Net::open(&agent, &rig.window, rig.window_desc(), g.world)?;
    let elastic = el.survives();
    let st = Stepper {
        gpu: local.gpu,
        kernels: local.kernels,
        model: local.model,
        cfg,
        rig: &rig,
        grid: grid(cfg, local, &setup, g.rank == lowest(&el.plan().members(0))),
        fault_timeout_ns: if elastic { cfg.fault_timeout_ns } else { 0 },
    };
    let mut last = None;
    let mut ahead = Ahead::new(el.life().start);
    for i in el.life() {
        let (connect_ms, ahead_ms, opened) = connect(el, &st, &mut net, &card, i, &mut ahead)?;
        let phase = steps(g, el, &st, &mut net, (i, &opened), opts, &mut ahead)?;
        if elastic {
            let result = phase.result(i, g.rank, connect_ms, ahead_ms);
            g.put_final(&g.keys.phase_result(i, g.rank), &result)?;
        } else {
            let mut w = baseline(g, local, &setup, cfg, st.grid, phase.times.clone())?;
            if cfg.graph {
                w.launch_cost = launch_costs(g, &st, &net, el.plan().len())?;
            }
            g.put_final(&g.keys.result(g.rank), &w)?;
        }
        let end = el.end_phase(i)?;
        if !end.new.is_empty() {
            say!("{}", decision_line(g.rank, i, &end));
        }
        last = Some(i);
    }
    // Every survivor passed the last phase's end: nobody writes into our window.
    net.close(|| Ok(()))?;
    let reports = last.is_some_and(|i| i + 1 == el.plan().len() && lowest(&el.active(i)) == g.rank);
    if !reports {
        return Ok(());
    }
    let window = rig.window.len() as u64;
    match elastic {
        true => report_phases(g, el, cfg, opts, setup.infos.clone(), window),
        false => {
            let ranks = el.active(0);
            let results: Vec<RankResult> = (ranks.iter())
                .map(|&r| g.get(&g.keys.result(r), r, "results"))
                .collect::<Result<_>>()?;
            // Their last messages: the reader deletes them.
            g.delete(ranks.iter().map(|&r| g.keys.result(r).key().to_string()));
            publish(cfg, opts, &setup, setup.infos.clone(), &results, window)
        }
    }
}

/// Meet: one configuration for all (the first rank to get there stores
/// it; every other must match it), every rank's introduction, and one
/// setup, which every member of the first phase makes alike from the
/// first phase's introductions (one is stored; joiners read it). Both
/// keys are shared: they outlive any one rank.
fn meet(g: &Group, el: &Membership, cfg: &RunConfig, info: &RankInfo) -> Result<Setup> {
    g.same_config(&g.keys.config(), cfg)?;
    g.put(&g.keys.info(g.rank), info)?;
    let entry = g.keys.setup();
    let setup = match el.incarnation() {
        0 => {
            let infos = gather_infos(g, el)?;
            let mine = make_setup(cfg, &infos)?;
            g.claim(&entry, &mine)?.unwrap_or(mine)
        }
        _ => g.get(&entry, lowest(&el.plan().members(0)), "run setup")?,
    };
    g.share(entry.key());
    Ok(setup)
}

/// The introductions of the first phase's ranks, in rank order, without
/// those proven dead before they introduced themselves.
fn gather_infos(g: &Group, el: &Membership) -> Result<Vec<RankInfo>> {
    let mut infos = Vec::new();
    for r in el.plan().members(0) {
        if let Some(i) = el.await_entry(&g.keys.info(r), r, 0, "GPU and NCCL info")? {
            infos.push(i);
        }
    }
    Ok(infos)
}

/// The launch grid of every phase kernel, from the setup.
fn grid(cfg: &RunConfig, local: &Local, setup: &Setup, log: bool) -> Grid {
    let grid = Grid::new(
        &cfg.shape,
        local.gpu.sm_count,
        local.info.ranks_on_gpu,
        Some(setup.blocks),
        local.model.send.entries.len() as u64,
    );
    if log {
        tracing::info!(
            "grid {}×{} per phase kernel, tokens in {} piece(s) of {} B",
            grid.blocks,
            grid.threads,
            grid.chunks,
            grid.chunk_bytes
        );
    }
    grid
}

/// Connect, phase `i`: drop the departed, connect the newcomers (those not
/// connected ahead), put the phase's remote view in place, set the mask
/// and the newcomers' words, then the round that opens the phase, whose
/// decision masks those that died meanwhile. Returns the host time it took
/// (a joiner's wait for the phase before to end left out), the time spent
/// connecting ahead to this phase's peers, ms, and that decision.
fn connect(
    el: &Membership,
    st: &Stepper,
    net: &mut Net,
    card: &PeerCard,
    i: usize,
    ahead: &mut Ahead,
) -> Result<(f64, f64, Decision)> {
    let t0 = Instant::now();
    let timeout = Duration::from_nanos(st.cfg.timeout_ns);
    let new = el.begin_phase(i, card, || ahead.look(el, net, timeout))?;
    let ahead_ms = std::mem::replace(ahead, Ahead::new(i + 1)).ms;
    let departed = net.retain(&el.agents(i));
    let mut unreachable = new.gone.clone();
    let mut peers = Vec::new();
    for p in new.peers {
        if net.has(p.rank, &p.payload.agent) {
            peers.push(p);
            continue;
        }
        match net.connect(p.rank, &p.payload, timeout) {
            Ok(()) => peers.push(p),
            // Died while we connected: the opening round agrees on it.
            Err(_) if el.survives() && el.is_dead(p.rank, p.incarnation)? => {
                unreachable.insert(p.rank);
            }
            Err(e) => return Err(el.blame(p.rank, p.incarnation, e)),
        }
    }
    // SAFETY: no kernel of ours runs between steps; the phase's members keep
    // their windows registered until they pass the phase's end.
    unsafe { net.rebuild(&departed)? };
    let opened = enter(el, st, i, &peers, &unreachable)?;
    let connect_ms = (t0.elapsed() - new.waited).as_secs_f64() * 1e3;
    Ok((connect_ms, ahead_ms, opened))
}

/// The rest of phase `i`'s begin, once its view is in place: the mask over
/// the members reached, the newcomers' words in our window at the step
/// they start at, then the opening round, whose decision it returns.
fn enter(
    el: &Membership,
    st: &Stepper,
    i: usize,
    peers: &[Peer<PeerCard>],
    unreachable: &BTreeSet<u32>,
) -> Result<Decision> {
    let (stream, shape, blocks) = (&st.gpu.stream, &st.cfg.shape, st.grid.blocks);
    let members = el.members(i);
    let reached = &members - unreachable;
    st.rig
        .set_mask(stream, Mask::all_but(shape.ranks, reached.iter().copied()))?;
    let start = first_step(st.cfg, i, 0);
    if i == el.life().start {
        st.rig.reset_all(stream, shape, blocks, start)?;
    } else {
        for p in peers {
            st.rig.reset_source(stream, shape, blocks, p.rank, start)?;
        }
    }
    if !peers.is_empty() {
        tracing::info!(
            "phase {i}: ranks {members:?}; connected to {} newcomer(s)",
            peers.len()
        );
    }
    let d = el.opened(i, unreachable)?;
    if !d.gone.is_empty() {
        say!("{}", decision_line(el.rank(), i, &d));
        st.rig
            .set_mask(stream, Mask::all_but(shape.ranks, el.active(i)))?;
    }
    Ok(d)
}

/// Connecting ahead to the peers phase `next` will bring, between the
/// steps of the phase before (a member) or while waiting for it to end (a
/// joiner): their cards are read as they appear, their metadata loaded,
/// and the phase's remote view prepared beside the one kernels use (the
/// newcomers stay masked until the phase begins), so that the phase's
/// begin only swaps views. Upstream NIXL EP likewise connects new ranks
/// while traffic flows.
struct Ahead {
    next: usize,
    last_look: Option<Instant>,
    done: bool,
    /// Peers connected ahead.
    peers: usize,
    /// Peers whose card was there but that could not be reached.
    failed: BTreeSet<u32>,
    /// Host time spent connecting ahead, ms.
    ms: f64,
}

impl Ahead {
    /// The store is read at most this often for cards.
    const EVERY: Duration = Duration::from_millis(10);

    fn new(next: usize) -> Self {
        Self {
            next,
            last_look: None,
            done: false,
            peers: 0,
            failed: BTreeSet::new(),
            ms: 0.0,
        }
    }

    /// One look (skipped when the last was under [`Ahead::EVERY`] ago):
    /// connects to the peers whose cards are there and prepares the view.
    fn look(&mut self, el: &Membership, net: &mut Net, timeout: Duration) -> Result<()> {
        if self.done || self.last_look.is_some_and(|t| t.elapsed() < Self::EVERY) {
            return Ok(());
        }
        if !el.life().contains(&self.next) {
            self.done = true;
            return Ok(());
        }
        let t0 = Instant::now();
        let first = self.last_look.replace(t0).is_none();
        let failed = &self.failed;
        let ready =
            el.ready_peers::<PeerCard>(self.next, |r, _| net.occupied(r) || failed.contains(&r))?;
        for p in &ready.peers {
            // One that cannot be reached now (dead, likely) is tried once
            // more when the phase begins, where a death is judged.
            if net.connect(p.rank, &p.payload, timeout).is_err() {
                self.failed.insert(p.rank);
            }
        }
        if first || !ready.peers.is_empty() {
            // SAFETY: the peers kept are the next phase's members, which keep
            // their windows registered until they pass its end; none of them
            // is written to before it begins (masked).
            unsafe { net.prepare(&el.agents(self.next))? };
        }
        self.done = ready.missing.is_empty();
        self.ms += t0.elapsed().as_secs_f64() * 1e3;
        self.peers += ready.peers.len()
            - (ready.peers.iter())
                .filter(|p| self.failed.contains(&p.rank))
                .count();
        if self.done && self.peers > 0 {
            tracing::info!(
                "connected ahead to phase {}'s {} new peer(s) ({:.1} ms between steps or waits)",
                self.next,
                self.peers,
                self.ms
            );
        }
        Ok(())
    }
}

/// The global number of the first step of phase `i`'s `n`th run of steps
/// (every rank computes it alike: phases, then runs, then steps).
fn first_step(cfg: &RunConfig, i: usize, n: usize) -> u32 {
    let total = cfg.warmup + cfg.iters;
    (i * cfg.runs().len() + n) as u32 * total
}

/// Timed steps launched back to back in one watched piece of work, with
/// `--graph` (stream launches and graph replays alike).
const BATCH: u32 = 10;

/// What one phase's steps measured on this rank.
#[derive(Default)]
struct PhaseRun {
    /// Every timed step's GPU times, per path (single-phase runs report these).
    times: Vec<PathTimes>,
    paths: Vec<PhaseSteps>,
    detected: Vec<Detection>,
    agree_ms: Vec<f64>,
    gone: BTreeSet<u32>,
    lost: u32,
    /// Every rank this rank's kernels masked in the phase.
    masked: BTreeSet<u32>,
    /// The last step's decision.
    last: Option<Decision>,
}

impl PhaseRun {
    fn result(self, i: usize, rank: u32, connect_ms: f64, ahead_ms: f64) -> PhaseResult {
        PhaseResult {
            phase: i,
            rank,
            connect_ms,
            ahead_ms,
            paths: self.paths,
            detected: self.detected,
            agree_ms: self.agree_ms,
            gone: self.gone.into_iter().collect(),
            lost_steps: self.lost,
        }
    }
}

/// Steps, phase `i` (opened by `opened`): every run of steps (each path, launched on the
/// stream and, with `--graph`, replayed from a graph); in an elastic run
/// each step is followed by the agreement on who is gone, and after the
/// first run's middle timed step comes the phase's halfway mark (the
/// launcher kills the plan's `-r` ranks then).
fn steps(
    g: &Group,
    el: &Membership,
    st: &Stepper,
    net: &mut Net,
    (i, opened): (usize, &Decision),
    opts: &RunOptions,
    ahead: &mut Ahead,
) -> Result<PhaseRun> {
    // The opening round's decision is the phase's first.
    let mut run = PhaseRun {
        gone: opened.gone.clone(),
        ..PhaseRun::default()
    };
    if !opened.new.is_empty() {
        run.agree_ms.push(opened.waited_us as f64 / 1e3);
    }
    let mut phase = Phase {
        g,
        el,
        st,
        net,
        ahead,
        i,
        run,
        epoch: 0,
        die_mid_dispatch: opts
            .die_mid_dispatch
            .filter(|&r| r == g.rank && i == el.life().start),
    };
    for (n, (path, graph)) in st.cfg.runs().into_iter().enumerate() {
        phase.run_of_steps(n, path, graph, opts.corrupt)?;
    }
    Ok(phase.run)
}

/// What the steps of one phase use, and what they gathered so far.
struct Phase<'a> {
    g: &'a Group<'a>,
    el: &'a Membership<'a>,
    st: &'a Stepper<'a>,
    net: &'a mut Net,
    /// Connecting to the next phase's newcomers between steps.
    ahead: &'a mut Ahead,
    i: usize,
    run: PhaseRun,
    /// Agreements that removed ranks so far in the phase.
    epoch: u32,
    /// `--inject die-mid-dispatch=R` ([`RunOptions::die_mid_dispatch`]),
    /// on rank R in its first phase.
    die_mid_dispatch: Option<u32>,
}

impl Phase<'_> {
    /// The `n`th run of steps: `path`, from a graph or not.
    fn run_of_steps(
        &mut self,
        n: usize,
        path: Path,
        graph: bool,
        corrupt: Option<Corrupt>,
    ) -> Result<()> {
        let (cfg, st, g) = (self.st.cfg, self.st, self.g);
        let (total, first) = (cfg.warmup + cfg.iters, first_step(cfg, self.i, n));
        let replay = graph
            .then(|| st.capture(self.net.views(), path))
            .transpose()?;
        st.rig.set_step(&st.gpu.stream, first)?;
        let mut kept = PhaseSteps {
            path,
            graph,
            steps: Vec::new(),
            dispatch_ns: Vec::new(),
            combine_ns: Vec::new(),
            epoch: Vec::new(),
        };
        let mut wall_ns = Vec::new();
        let mut k = 0;
        while k < total {
            // With --graph both launch kinds run their timed steps in
            // batches, back to back: the host's wall time per step then
            // shows the launch cost, not our per-step wait and checks.
            let count = match cfg.graph && k >= cfg.warmup {
                true => BATCH.min(total - k),
                false => 1,
            };
            // The injected fault: the last rank, first timed step.
            let wrong = corrupt.filter(|_| k == cfg.warmup && g.rank + 1 == g.world && !graph);
            // A run that survives deaths agrees after every step.
            if self.el.survives() {
                self.el.steps_begin(self.i)?;
            }
            let t0 = Instant::now();
            let views = self.net.views();
            let out = st.steps(
                views,
                path,
                (first + k, count),
                replay.as_ref(),
                wrong,
                || g.probe(),
            )?;
            let wall = t0.elapsed().as_nanos() as f64 / f64::from(count);
            let die = self.die_mid_dispatch.map(|_| path);
            self.after_steps(n, (k, count), first + k + count - 1, &out, die)?;
            let timeout = Duration::from_nanos(cfg.timeout_ns);
            self.ahead.look(self.el, self.net, timeout)?;
            // Steps in which a rank was masked waited out the fault timeout:
            // neither before nor after; lost steps are not timed either.
            if k >= cfg.warmup && out.masked == Mask::default() && !out.lost {
                kept.steps.extend(first + k..first + k + count);
                kept.epoch
                    .extend(std::iter::repeat_n(self.epoch, count as usize));
                wall_ns.push(wall);
            }
            self.progress(path, (k, count), total);
            k += count;
        }
        let mut times = st.times(path, first + cfg.warmup, cfg.iters)?;
        for &s in &kept.steps {
            let at = (s - first - cfg.warmup) as usize;
            kept.dispatch_ns.push(times.dispatch_ns[at]);
            kept.combine_ns.push(times.combine_ns[at]);
        }
        (times.graph, times.wall_ns) = (graph, wall_ns);
        self.run.times.push(times);
        self.run.paths.push(kept);
        Ok(())
    }

    /// After steps `k..k + count` of the `n`th run (the last one's global
    /// number `step`): the agreement, and after the first run's middle
    /// timed step, the injected death mid-dispatch if asked for.
    fn after_steps(
        &mut self,
        n: usize,
        (k, count): (u32, u32),
        step: u32,
        out: &Outcome,
        die_mid_dispatch: Option<Path>,
    ) -> Result<()> {
        if !self.el.survives() {
            return Ok(());
        }
        let changed = agree(self.g, self.el, self.st, self.i, step, out, &mut self.run)?;
        self.epoch += u32::from(changed);
        let cfg = self.st.cfg;
        if n == 0 && (k..k + count).contains(&(cfg.warmup + cfg.iters / 2)) {
            if let Some(path) = die_mid_dispatch {
                self.dispatch_to_all_but_the_last(path)?;
            }
        }
        Ok(())
    }

    /// The injected death mid-dispatch ([`RunOptions::die_mid_dispatch`]):
    /// this rank queues the next step's dispatch with the highest other
    /// active rank masked, so that only that one misses its data, lets it
    /// run, and kills itself (SIGKILL: nothing is cleaned up).
    fn dispatch_to_all_but_the_last(&self, path: Path) -> Result<()> {
        let me = self.g.rank;
        let active = self.el.active(self.i);
        let Some(&last) = active.iter().rfind(|&&r| r != me) else {
            return Ok(());
        };
        let sent_to: Vec<u32> = active.into_iter().filter(|&r| r != last).collect();
        say!(
            "[rank {me}] dying mid-dispatch (injected fault): sending to ranks {sent_to:?}, not to rank {last}"
        );
        let capacity = self.st.cfg.shape.ranks;
        self.st
            .dispatch_only(self.net.views(), path, Mask::all_but(capacity, sent_to))?;
        // SAFETY: kill(2) on our own pid.
        unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        Ok(())
    }

    fn progress(&self, path: Path, (k, count): (u32, u32), total: u32) {
        let every = (total / 5).max(1);
        let done = k + count;
        if self.g.rank == lowest(&self.el.active(self.i))
            && (done / every > k / every || done == total)
        {
            tracing::info!(
                "phase {}, {} path: {done}/{total} steps verified",
                self.i,
                path.name()
            );
        }
    }
}

/// After a step of an elastic run: what this rank's kernels masked (with
/// when, for the report) goes to the agreement, and the decision into the
/// mask before the next step. Returns whether the decision removed ranks.
fn agree(
    g: &Group,
    el: &Membership,
    st: &Stepper,
    i: usize,
    step: u32,
    out: &Outcome,
    run: &mut PhaseRun,
) -> Result<bool> {
    let now = unix_ns();
    for r in out.masked.ranks() {
        run.masked.insert(r);
        let after_kill_ms = el
            .died_at(i, r)?
            .map(|k| now.saturating_sub(k) as f64 / 1e6);
        run.detected.push(Detection {
            rank: r,
            after_kill_ms,
            wait_ms: out.waited_ns.unwrap_or(0) as f64 / 1e6,
        });
    }
    run.lost += u32::from(out.lost);
    let mut d = el.agree(i, u64::from(step), &run.masked)?;
    if !d.forgiven.is_empty() {
        run.masked.retain(|r| d.gone.contains(r));
        run.detected.retain(|x| !d.forgiven.contains(&x.rank));
        // A rank lost during the resynchronisation is gone from here on.
        let again = resync(el, st, i, step, &d)?;
        d.new.extend(again.new);
        (d.gone, d.survivors) = (again.gone, again.survivors);
    }
    let changed = !d.new.is_empty();
    if changed {
        say!("{}", decision_line(g.rank, i, &d));
        run.agree_ms.push(d.waited_us as f64 / 1e3);
        run.gone.clone_from(&d.gone);
        let capacity = st.cfg.shape.ranks;
        st.rig
            .set_mask(&st.gpu.stream, Mask::all_but(capacity, el.active(i)))?;
    } else if !d.forgiven.is_empty() {
        say!("{}", decision_line(g.rank, i, &d));
    }
    run.last = Some(d);
    Ok(changed)
}

/// After a decision that forgave ranks (some survivor masked them in step
/// `step`, but they reported: alive, only late): its sends to them stopped
/// at the mask, so the words they count in its window and it in theirs no
/// longer match the step. Every survivor puts every source's words in its
/// window back to their baseline before the next step and its mask to the
/// decision's, then waits until all have (a second round of agreement,
/// over nothing) before any writes again. Returns that round's decision.
fn resync(el: &Membership, st: &Stepper, i: usize, step: u32, d: &Decision) -> Result<Decision> {
    let (stream, shape, blocks) = (&st.gpu.stream, &st.cfg.shape, st.grid.blocks);
    st.rig.reset_all(stream, shape, blocks, step + 1)?;
    st.rig
        .set_mask(stream, Mask::all_but(shape.ranks, el.active(i)))?;
    stream.synchronize()?;
    tracing::info!(
        "phase {i}: resynchronised with rank(s) {:?} after step {step}",
        d.forgiven
    );
    el.agree(i, RESYNC | u64::from(step), &BTreeSet::new())
}

/// Steps of dispatch + combine per launch-cost measurement (`--graph`).
const LAUNCH_COST_STEPS: u32 = 200;

/// `--graph`, single-phase runs: per path, the host's wall time per step of
/// dispatch + combine back to back, launched and replayed (steps numbered
/// after every phase's).
fn launch_costs(
    g: &Group,
    st: &Stepper,
    net: &Net,
    phases: usize,
) -> Result<Vec<(Path, f64, f64)>> {
    let mut first = first_step(st.cfg, phases, 0);
    let mut out = Vec::new();
    for &path in &st.cfg.paths {
        let (stream, graph) =
            st.launch_cost(net.views(), path, (first, LAUNCH_COST_STEPS), || g.probe())?;
        out.push((path, stream, graph));
        first += 2 * LAUNCH_COST_STEPS;
    }
    Ok(out)
}

/// The same-run NCCL all-to-all baseline, when the setup allows it; this
/// rank's whole result (single-phase runs).
fn baseline(
    g: &Group,
    local: &Local,
    setup: &Setup,
    cfg: &RunConfig,
    grid: Grid,
    paths: Vec<PathTimes>,
) -> Result<RankResult> {
    let nccl = match (&setup.baseline_skip, &local.info.nccl) {
        (None, NcclStatus::Ready(v)) => {
            tracing::info!("NCCL all-to-all baseline (NCCL {v})");
            let pairs = &local.model.pairs;
            Some(nccl::baseline(
                g,
                local.gpu,
                v.clone(),
                pairs,
                cfg.warmup,
                cfg.iters,
            )?)
        }
        _ => None,
    };
    Ok(RankResult {
        rank: g.rank,
        grid,
        dispatch_bytes: local.model.dispatch_bytes,
        combine_bytes: local.model.combine_bytes,
        paths,
        nccl,
        launch_cost: Vec::new(),
    })
}

/// The first rank, elastic runs: every process's per-phase results, the
/// table, JSON and CSV.
fn report_phases(
    g: &Group,
    el: &Membership,
    cfg: &RunConfig,
    opts: &RunOptions,
    infos: Vec<RankInfo>,
    window_bytes: u64,
) -> Result<()> {
    let plan = el.plan();
    let mut results = Vec::new();
    let mut members = Vec::new();
    let mut dead_before = BTreeSet::new();
    for i in 0..plan.len() {
        // Who finished phase i: the decision that ended it says.
        let ended = g.get(
            &g.keys.decision(i, END),
            lowest(&plan.members(i)),
            "end of a phase",
        )?;
        let alive = |r: &u32, dead: &BTreeSet<(u32, usize)>| {
            plan.incarnation(*r, i)
                .is_some_and(|inc| !dead.contains(&(*r, inc)))
        };
        let ranks: Vec<u32> = plan
            .members(i)
            .into_iter()
            .filter(|r| alive(r, &dead_before))
            .collect();
        for r in ranks.iter().filter(|r| alive(r, &ended.dead)) {
            let entry = g.keys.phase_result(i, *r);
            results.push(g.get(&entry, *r, "phase results")?);
            g.delete([entry.key()]);
        }
        members.push(PhaseMembers {
            joined: match i {
                0 => Vec::new(),
                _ => (plan.joiners(i).into_iter())
                    .filter(|r| ranks.contains(r))
                    .collect(),
            },
            ranks,
            killed: ended.gone.iter().copied().collect(),
        });
        dead_before = ended.dead;
    }
    let rows = phase_report::rows(&members, &cfg.paths, &results);
    say!(
        "[ep] {} mode, elastic plan {} (capacity {}), {} tokens × hidden {} per rank, top-{} of {} experts, fault timeout \
         {} ms, {} timed steps per path and phase; every step verified against the mask",
        cfg.mode.name(),
        plan.to_json(),
        cfg.shape.ranks,
        cfg.shape.tokens,
        cfg.shape.hidden,
        cfg.shape.topk,
        cfg.shape.experts,
        cfg.fault_timeout_ns / 1_000_000,
        cfg.iters
    );
    say!("\n{}", phase_report::table(&rows));
    let info = report::RunInfo::collect(cfg, infos, window_bytes);
    if let Some(p) = &opts.json {
        let doc = serde_json::json!({ "run": info, "plan": plan.to_json(), "phases": rows, "ranks": results });
        std::fs::write(p, serde_json::to_string_pretty(&doc)? + "\n")?;
    }
    if let Some(p) = &opts.csv {
        crate::results::write_csv(p, &info, &rows)?;
    }
    Ok(())
}

/// Single-phase runs, the first rank: prints the run (one line on its shape, a line per row, the table) and
/// writes the JSON and CSV asked for, from every rank's `results`.
fn publish(
    cfg: &RunConfig,
    opts: &RunOptions,
    setup: &Setup,
    infos: Vec<RankInfo>,
    results: &[RankResult],
    window_bytes: u64,
) -> Result<()> {
    let mut rows = report::rows(cfg, results);
    report::set_vs_put(&mut rows, opts.ref_put_gbps);
    let s = &cfg.shape;
    let gpus: std::collections::BTreeSet<(&str, &str)> = infos
        .iter()
        .map(|i| (i.host.as_str(), i.gpu_uuid.as_str()))
        .collect();
    say!(
        "[ep] {} mode: {} ranks on {} GPU(s) ({}, MPS {}), {} tokens × hidden {} per rank, top-{} of {} experts, {} \
         routing, grid {}×{}, {} timed iterations per path",
        cfg.mode.name(),
        s.ranks,
        gpus.len(),
        infos[0].gpu_name,
        if infos[0].mps { "on" } else { "off" },
        s.tokens,
        s.hidden,
        s.topk,
        s.experts,
        cfg.routing.name(),
        results[0].grid.blocks,
        results[0].grid.threads,
        cfg.iters
    );
    for r in &rows {
        say!("{}", report::line(r, results.len()));
    }
    if let Some(why) = &setup.baseline_skip {
        say!("[ep] NCCL baseline skipped: {why}");
    }
    say!("\n{}", report::table(&rows));
    for line in report::wall_lines(results) {
        say!("{line}");
    }
    let info = report::RunInfo::collect(cfg, infos, window_bytes);
    if let Some(p) = &opts.json {
        report::write_json(p, &info, &rows, results)?;
    }
    if let Some(p) = &opts.csv {
        report::write_csv(p, &info, &rows)?;
    }
    Ok(())
}
