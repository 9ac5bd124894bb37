//! EP's work in each phase, as the phase driver ([`crate::ranks::driver`])
//! runs it:
//!
//! - **connect** — drop the peers that departed, connect to the phase's
//!   newcomers (every member, in this process's first phase) unless they
//!   were connected ahead;
//! - **enter** — prepare the remote view anew (no kernel runs), set the
//!   mask to the members reached and bring the newcomers' words in our
//!   window to the step they start at;
//! - **steps** — every data path's warm-up and timed steps
//!   ([`super::steps`]), a unit being one step (or, with `--graph`, a batch
//!   of timed steps launched back to back); each is followed by the
//!   driver's agreement, whose decision goes into the mask
//!   ([`PhaseWork::apply`]) before the next unit;
//! - **end** — publish what the phase measured.
//!
//! Between steps (and while a joiner waits) the next phase's newcomers are
//! connected ahead and their view prepared beside the one kernels use
//! ([`PhaseWork::ahead`]), as upstream NIXL EP connects new ranks while
//! traffic flows.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use anyhow::Result;
use cudarc::driver::CudaGraph;

use super::config::{Path, RunConfig};
use super::keys::EpKeys;
use super::mask::Mask;
use super::phase_report::{Detection, PhaseResult, PhaseSteps};
use super::report::PathTimes;
use super::setup::RunOptions;
use super::steps::Stepper;
use crate::nixl::net::{Net, PeerCard};
use crate::ranks::driver::{Ahead, Change, Peer, PhaseRecord, PhaseView, PhaseWork, StepOutcome};
use crate::ranks::group::Group;
use crate::say;

/// A single-phase run's end: publishes this rank's times of every path,
/// given the views (for the launch costs).
pub type PublishTimes<'a> = dyn FnMut(&Net, Vec<PathTimes>) -> Result<()> + 'a;

/// Timed steps launched back to back in one watched piece of work, with
/// `--graph` (stream launches and graph replays alike).
const BATCH: u32 = 10;

/// One unit of a phase: run of steps `run` (a path, launched or replayed),
/// its steps `k..k + count` of `warmup + iters`.
#[derive(Clone, Copy, Debug)]
struct Unit {
    run: usize,
    k: u32,
    count: u32,
}

/// A run of steps under way: its graph, the steps kept for timing.
struct Run {
    path: Path,
    graph: bool,
    replay: Option<CudaGraph>,
    kept: PhaseSteps,
    wall_ns: Vec<f64>,
}

/// EP's side of each phase (see the module docs).
pub struct Phases<'a> {
    pub g: &'a Group<'a>,
    pub st: &'a Stepper<'a>,
    pub net: &'a mut Net,
    pub opts: &'a RunOptions,
    /// Every run's GPU times of the current phase, per path (single-phase
    /// runs report these).
    times: Vec<PathTimes>,
    units: Vec<Unit>,
    run: Option<Run>,
    paths: Vec<PhaseSteps>,
    /// Peers reached by connect, to bring their words to the phase's start.
    reached: Vec<u32>,
    departed: Vec<String>,
    /// Agreements that removed ranks so far in the phase.
    epoch: u32,
    /// `--inject die-mid-dispatch`: this rank dies before the next unit.
    die_next: bool,
    /// Next phase's peers connected ahead.
    ahead_peers: usize,
    /// A single-phase run: what publishes its times at the phase's end
    /// (after the NCCL baseline, [`super::session`]'s); none in an elastic run.
    single: Option<Box<PublishTimes<'a>>>,
}

impl<'a> Phases<'a> {
    pub fn new(
        g: &'a Group<'a>,
        st: &'a Stepper<'a>,
        net: &'a mut Net,
        opts: &'a RunOptions,
        single: Option<Box<PublishTimes<'a>>>,
    ) -> Self {
        Self {
            g,
            st,
            net,
            opts,
            times: Vec::new(),
            units: units(st.cfg),
            run: None,
            paths: Vec::new(),
            reached: Vec::new(),
            departed: Vec::new(),
            epoch: 0,
            die_next: false,
            ahead_peers: 0,
            single,
        }
    }

    /// What phase `i` measured on this rank (elastic runs).
    pub fn result(&mut self, i: usize, rec: &PhaseRecord) -> PhaseResult {
        PhaseResult {
            phase: i,
            rank: self.g.rank,
            connect_ms: rec.connect_ms,
            ahead_ms: rec.ahead_ms,
            paths: std::mem::take(&mut self.paths),
            detected: (rec.detections.iter())
                .filter_map(|d| {
                    Some(Detection {
                        rank: d.rank,
                        after_kill_ms: d.after_kill_ms,
                        wait_ms: d.wait_ms?,
                    })
                })
                .collect(),
            agree_ms: rec.agree_ms.clone(),
            gone: rec.gone.iter().copied().collect(),
            lost_steps: rec.lost,
            waits_on_gone: rec.waits_on_gone,
        }
    }

    /// Starts run of steps `n` of phase `i`: its graph, its first step.
    fn start_run(&mut self, i: usize, n: usize) -> Result<()> {
        let (path, graph) = self.st.cfg.runs()[n];
        let replay = graph
            .then(|| self.st.capture(self.net.views(), path))
            .transpose()?;
        self.st
            .rig
            .set_step(&self.st.gpu.stream, first_step(self.st.cfg, i, n))?;
        self.run = Some(Run {
            path,
            graph,
            replay,
            kept: PhaseSteps {
                path,
                graph,
                steps: Vec::new(),
                dispatch_ns: Vec::new(),
                combine_ns: Vec::new(),
                epoch: Vec::new(),
            },
            wall_ns: Vec::new(),
        });
        Ok(())
    }

    /// Ends run of steps `n` of phase `i`: the kept steps' GPU times.
    fn finish_run(&mut self, i: usize, n: usize) -> Result<()> {
        let Some(mut run) = self.run.take() else {
            return Ok(());
        };
        let cfg = self.st.cfg;
        let first = first_step(cfg, i, n);
        let mut times = self.st.times(run.path, first + cfg.warmup, cfg.iters)?;
        for &s in &run.kept.steps {
            let at = (s - first - cfg.warmup) as usize;
            run.kept.dispatch_ns.push(times.dispatch_ns[at]);
            run.kept.combine_ns.push(times.combine_ns[at]);
        }
        (times.graph, times.wall_ns) = (run.graph, run.wall_ns);
        self.times.push(times);
        self.paths.push(run.kept);
        Ok(())
    }

    /// The injected death mid-dispatch ([`RunOptions::die_mid_dispatch`]):
    /// this rank queues the next step's dispatch with the highest other
    /// active rank masked, so that only that one misses its data, lets it
    /// run, and kills itself (SIGKILL: nothing is cleaned up).
    fn dispatch_to_all_but_the_last(&self, view: &PhaseView, path: Path) -> Result<()> {
        let me = self.g.rank;
        let Some(&last) = view.active.iter().rfind(|&&r| r != me) else {
            return Ok(());
        };
        let sent_to: Vec<u32> = view.active.iter().copied().filter(|&r| r != last).collect();
        say!(
            "[rank {me}] dying mid-dispatch (injected fault): sending to ranks {sent_to:?}, not to rank {last}"
        );
        let capacity = self.st.cfg.shape.ranks;
        (self.st).dispatch_only(self.net.views(), path, Mask::all_but(capacity, sent_to))?;
        // SAFETY: kill(2) on our own pid.
        unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        Ok(())
    }

    fn progress(&self, view: &PhaseView, path: Path, (k, count): (u32, u32)) {
        let total = self.st.cfg.warmup + self.st.cfg.iters;
        let every = (total / 5).max(1);
        let done = k + count;
        if view.reporter() && (done / every > k / every || done == total) {
            tracing::info!(
                "phase {}, {} path: {done}/{total} steps verified",
                view.phase,
                path.name()
            );
        }
    }

    /// The mask over `view.active`, queued on the rank's stream.
    fn set_mask(&self, ranks: impl IntoIterator<Item = u32>) -> Result<()> {
        let st = self.st;
        st.rig
            .set_mask(&st.gpu.stream, Mask::all_but(st.cfg.shape.ranks, ranks))
    }
}

impl PhaseWork for Phases<'_> {
    type Card = PeerCard;

    fn connect(
        &mut self,
        view: &PhaseView,
        peers: &[Peer<PeerCard>],
    ) -> Result<Vec<(u32, anyhow::Error)>> {
        self.departed = self.net.retain(&view.agents);
        let timeout = Duration::from_nanos(self.st.cfg.timeout_ns);
        let (mut failed, mut reached) = (Vec::new(), Vec::new());
        for p in peers {
            if self.net.has(p.rank, &p.payload.agent) {
                reached.push(p.rank);
                continue;
            }
            match self.net.connect(p.rank, &p.payload, timeout) {
                Ok(()) => reached.push(p.rank),
                Err(e) => failed.push((p.rank, e)),
            }
            crate::stall::progressed();
        }
        self.reached = reached;
        Ok(failed)
    }

    /// The phase's remote view, the mask over the members reached, the
    /// newcomers' words at the step they start at.
    fn enter(&mut self, view: &PhaseView, unreachable: &BTreeSet<u32>) -> Result<()> {
        // SAFETY: no kernel of ours runs between steps; the phase's members keep
        // their windows registered until they pass the phase's end.
        unsafe { self.net.rebuild(&self.departed)? };
        let (st, i) = (self.st, view.phase);
        let (stream, shape, blocks) = (&st.gpu.stream, &st.cfg.shape, st.grid.blocks);
        self.set_mask(&view.members - unreachable)?;
        let start = first_step(st.cfg, i, 0);
        if view.first {
            st.rig.reset_all(stream, shape, blocks, start)?;
        } else {
            for &r in &self.reached {
                st.rig.reset_source(stream, shape, blocks, r, start)?;
            }
        }
        if !self.reached.is_empty() {
            tracing::info!(
                "phase {i}: ranks {:?}; connected to {} newcomer(s)",
                view.members,
                self.reached.len()
            );
        }
        self.epoch = 0;
        Ok(())
    }

    fn steps(&self, _: &PhaseView) -> u64 {
        self.units.len() as u64
    }

    fn step(&mut self, view: &PhaseView, unit: u64) -> Result<StepOutcome> {
        let Unit { run: n, k, count } = self.units[unit as usize];
        let (i, cfg) = (view.phase, self.st.cfg);
        if self.die_next {
            let path = self.run.as_ref().map_or(cfg.runs()[0].0, |r| r.path);
            self.dispatch_to_all_but_the_last(view, path)?;
        }
        if k == 0 {
            self.start_run(i, n)?;
        }
        let first = first_step(cfg, i, n);
        // The injected fault: the last rank, first timed step.
        let run = self.run.as_ref().expect("a run of steps under way");
        let (path, graph) = (run.path, run.graph);
        let wrong = (self.opts.corrupt)
            .filter(|_| k == cfg.warmup && self.g.rank + 1 == self.g.world && !graph);
        let t0 = Instant::now();
        let g = self.g;
        let out = (self.st).steps(
            self.net.views(),
            path,
            (first + k, count),
            run.replay.as_ref(),
            wrong,
            || g.probe(),
        )?;
        let wall = t0.elapsed().as_nanos() as f64 / f64::from(count);
        let run = self.run.as_mut().expect("a run of steps under way");
        // Steps in which a rank was masked waited out the fault timeout:
        // neither before nor after; lost steps are not timed either.
        if k >= cfg.warmup && out.masked == Mask::default() && !out.lost {
            run.kept.steps.extend(first + k..first + k + count);
            run.kept
                .epoch
                .extend(std::iter::repeat_n(self.epoch, count as usize));
            run.wall_ns.push(wall);
        }
        self.progress(view, path, (k, count));
        if k + count == cfg.warmup + cfg.iters {
            self.finish_run(i, n)?;
        }
        let mid = cfg.warmup + cfg.iters / 2;
        self.die_next = self.opts.die_mid_dispatch == Some(g.rank)
            && view.first
            && n == 0
            && (k..k + count).contains(&mid);
        Ok(StepOutcome {
            masked: out.masked.ranks().collect(),
            waited_ns: out.waited_ns,
            lost: u32::from(out.lost),
        })
    }

    /// The decision into the mask before the next unit.
    fn apply(&mut self, view: &PhaseView, change: &Change) -> Result<()> {
        self.epoch += u32::from(change.after.is_some());
        self.set_mask(view.active.iter().copied())
    }

    /// After a decision that forgave ranks (some survivor masked them in
    /// unit `k`, but they reported: alive, only late): its sends to them
    /// stopped at the mask, so the words they count in its window and it in
    /// theirs no longer match the step. Every survivor puts every source's
    /// words in its window back to their baseline before the next step and
    /// its mask to the decision's; the driver's next round is the barrier
    /// after which any writes again.
    fn resync(&mut self, view: &PhaseView, unit: u64, forgiven: &BTreeSet<u32>) -> Result<bool> {
        let Unit { run: n, k, count } = self.units[unit as usize];
        let next = first_step(self.st.cfg, view.phase, n) + k + count;
        let st = self.st;
        let (stream, shape, blocks) = (&st.gpu.stream, &st.cfg.shape, st.grid.blocks);
        st.rig.reset_all(stream, shape, blocks, next)?;
        self.set_mask(view.active.iter().copied())?;
        stream.synchronize()?;
        tracing::debug!(
            "phase {}: words reset after step {} for {forgiven:?}",
            view.phase,
            next - 1
        );
        Ok(true)
    }

    /// Connects to the next phase's peers whose cards are there and
    /// prepares its view beside the one kernels use (the newcomers stay
    /// masked until the phase begins).
    fn ahead(&mut self, next: &Ahead<PeerCard>) -> Result<()> {
        let timeout = Duration::from_nanos(self.st.cfg.timeout_ns);
        for p in &next.ready {
            // An id still held by its old process is connected when the
            // phase begins; one that cannot be reached now (dead, likely)
            // is tried once more then, where a death is judged.
            if self.net.occupied(p.rank) {
                continue;
            }
            if self.net.connect(p.rank, &p.payload, timeout).is_ok() {
                self.ahead_peers += 1;
            }
        }
        // SAFETY: the peers kept are the next phase's members, which keep
        // their windows registered until they pass its end; none of them
        // is written to before it begins (masked).
        unsafe { self.net.prepare(&next.agents)? };
        if next.complete && self.ahead_peers > 0 {
            tracing::info!(
                "connected ahead to phase {}'s {} new peer(s)",
                next.phase,
                self.ahead_peers
            );
            self.ahead_peers = 0;
        }
        Ok(())
    }

    /// Publishes what the phase measured: an elastic run's per-phase
    /// result, or a single-phase run's times after the NCCL baseline.
    fn end(&mut self, view: &PhaseView, rec: &PhaseRecord) -> Result<()> {
        let g = self.g;
        match &mut self.single {
            Some(publish) => publish(self.net, std::mem::take(&mut self.times)),
            None => {
                let result = self.result(view.phase, rec);
                g.put_final(&g.keys.phase_result(view.phase, g.rank), &result)
            }
        }
    }
}

/// Every phase's units: per run of steps, its warm-up steps one by one,
/// then its timed steps (in batches of [`BATCH`] with `--graph`).
fn units(cfg: &RunConfig) -> Vec<Unit> {
    let total = cfg.warmup + cfg.iters;
    let mut out = Vec::new();
    for run in 0..cfg.runs().len() {
        let mut k = 0;
        while k < total {
            let count = match cfg.graph && k >= cfg.warmup {
                true => BATCH.min(total - k),
                false => 1,
            };
            out.push(Unit { run, k, count });
            k += count;
        }
    }
    out
}

/// The global number of the first step of phase `i`'s `n`th run of steps
/// (every rank computes it alike: phases, then runs, then steps).
pub fn first_step(cfg: &RunConfig, i: usize, n: usize) -> u32 {
    let total = cfg.warmup + cfg.iters;
    (i * cfg.runs().len() + n) as u32 * total
}
