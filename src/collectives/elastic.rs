//! Collectives that survive a rank's death and take in new ranks
//! (`--elastic`, or `--plan FILE` in ep's format: `-r` ranks the launcher
//! kills, ranks of later phases that join), written as phases:
//!
//! 1. **meet** — one configuration for all (the first rank to get there
//!    stores it), then this rank's window, agent and registration
//!    ([`Session::create`]);
//! 2. every phase of the plan this process lives, on the phase driver
//!    ([`crate::ranks::driver`]), which calls the work of `Phases`:
//!    - **connect** — the driver hands over the [`Introduction`] (GPU and
//!      NIXL card) of every peer to connect to: every other member in this
//!      process's first phase, later the phase's joiners; the remote view
//!      is rebuilt over the phase's members (no kernel runs), the store
//!      path's pointers looked up again, and the opening round's decision
//!      masks those that died meanwhile. A joiner *grows* the members
//!      between two calls, as `ncclCommGrow` does: it takes a rank id no
//!      process had before (its signal words in every window are still
//!      zero) and the call numbering goes on where the phase before ended,
//!      so its first call's epoch is everyone's;
//!    - **steps** — rounds of the sweep, one step per case: `--iters`
//!      calls, each with fresh inputs and every output element checked
//!      against the sum of the call's members; after each step the
//!      survivors agree on who is gone. A wait on a dead or frozen rank
//!      masks it after `--fault-timeout` and abandons the step on every
//!      member (cuda/collectives.cu: the abort slots), so a death costs one
//!      step's calls, counted lost, never a wrong element;
//!    - **shrink** — a decision that removes ranks gives the next step fewer
//!      members ([`super::session::View`]): chunk ownership, slices and output slots are
//!      recomputed over the survivors' indices; the window, its
//!      registration and the views stay (nothing is re-registered, no kernel
//!      runs meanwhile);
//!    - **end** — this rank's detections and joins into its results;
//! 3. **report** — the session closed among the survivors, and the lowest
//!    survivor's report: per case and member count the time per call, calls
//!    checked and lost, each death's detection, agreement and shrink, and
//!    each join's connection time.
//!
//! A rank leaves a collectives run only by dying: a plan in which a rank
//! leaves, or an id comes back, is refused ([`check_plan`]).

use std::collections::{BTreeMap, BTreeSet};

use anyhow::Result;
use serde::{Deserialize, Serialize};

use super::case::Case;
use super::layout::Path;
use super::session::{Context, Session, block_plan, describe};
use crate::cli::UsageError;
use crate::group::entry::{Value, json_decode, json_encode};
use crate::nixl::net::PeerCard;
use crate::ranks::driver::{Change, Peer, PhaseRecord, PhaseView, PhaseWork, StepOutcome};
use crate::ranks::info::RankInfo;
use crate::ranks::plan::Plan;
use crate::ranks::rank::Rank;
use crate::say;

/// What a process publishes when its first phase begins (its card, in
/// the driver's words): who it is and how to reach it. On the
/// wire: the introduction's JSON length (u32 little-endian), that JSON, then
/// the card ([`PeerCard::encode`]).
#[derive(Clone, Debug, PartialEq)]
pub struct Introduction {
    pub info: RankInfo,
    pub card: PeerCard,
}

impl Value for Introduction {
    const WHAT: &'static str = "introduction and connection details";
    fn encode(&self) -> Vec<u8> {
        let info = json_encode(&self.info);
        let mut out = (info.len() as u32).to_le_bytes().to_vec();
        out.extend_from_slice(&info);
        out.extend_from_slice(&self.card.encode());
        out
    }
    fn decode(b: &[u8]) -> Result<Self, String> {
        let n = b.get(..4).ok_or("too short for an introduction")?;
        let n = u32::from_le_bytes(n.try_into().unwrap()) as usize;
        let info = b.get(4..4 + n).ok_or("the introduction is cut short")?;
        Ok(Self {
            info: json_decode(info)?,
            card: PeerCard::decode(&b[4 + n..])?,
        })
    }
}

/// Refuses a plan collectives cannot run: a rank leaves only by dying (a
/// rank of phase `i` that survives it is a member of phase `i+1`), and a
/// joiner takes an id no process had before (the put path's signals are
/// counters every sender keeps a running total of, per receiver: a new
/// process under an old id would start its totals at zero).
pub fn check_plan(plan: &Plan) -> Result<(), UsageError> {
    let refuse = |why: String| Err(UsageError(format!("--plan {}: {why}", plan.to_json())));
    let mut seen = plan.members(0);
    for i in 1..plan.len() {
        if let Some(r) = (plan.survivors(i - 1).difference(&plan.members(i))).next() {
            return refuse(format!(
                "rank {r} leaves at the end of phase {}: a collectives rank leaves only by dying (write -{r})",
                i - 1
            ));
        }
        if let Some(r) = plan.joiners(i).intersection(&seen).next() {
            return refuse(format!(
                "rank {r} joins phase {i} but was a member before: a joiner takes a new rank id"
            ));
        }
        seen.extend(plan.members(i));
    }
    Ok(())
}

/// One rank's steps of one case over one set of members.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StepRow {
    /// Index into the run's cases ([`cases`]).
    pub case: usize,
    /// The plan's phase the step ran in.
    #[serde(default)]
    pub phase: usize,
    /// Members of the step.
    pub ranks: u32,
    /// GPU time of every checked call, ns.
    pub times_ns: Vec<f64>,
    pub lost: u32,
    /// A step of the first round: checked, not timed (warm-up).
    #[serde(default)]
    pub warm: bool,
}

/// How the survivors found and dropped one rank.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Detection {
    pub rank: u32,
    /// The step whose agreement named it (from 1).
    pub step: u64,
    /// GPU time the first wait on it took before masking it, ms (none when
    /// this rank's kernels did not wait on it: the agreement named it).
    pub wait_ms: Option<f64>,
    /// From the launcher's kill or notice to this rank's decision, ms
    /// (host clocks of one machine; none without our launcher).
    pub after_kill_ms: Option<f64>,
    /// From this rank's report to its reading the decision, ms.
    pub agree_ms: f64,
    /// From the decision to the next step's members set, ms (host).
    pub shrink_ms: f64,
}

/// A newcomer as one process saw it join: a member connecting to it, or
/// the joiner itself connecting to every member.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Join {
    pub rank: u32,
    /// The phase it joined (its first).
    pub phase: usize,
    /// The first step it took part in (from 1).
    pub step: u64,
    /// Host time from the phase's begin to its opening round's decision
    /// (connecting, the view rebuilt, the pointers looked up), ms; a
    /// joiner's wait for the phase before to end left out.
    pub connect_ms: f64,
}

/// One rank's elastic run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ElasticTimes {
    pub rank: u32,
    pub steps: Vec<StepRow>,
    pub detections: Vec<Detection>,
    #[serde(default)]
    pub joins: Vec<Join>,
}

crate::json_value!(ElasticTimes => "elastic results");

/// The run's cases, in step order within a round.
pub fn cases(ctx: &Context) -> Vec<Case> {
    ctx.cfg.groups().into_iter().flat_map(|g| g.cases).collect()
}

/// The first step of phase `i` (from 1): every phase runs `rounds` rounds
/// of `cases` steps, and a joiner computes the same number.
fn first_step(i: usize, rounds: u32, cases: usize) -> u64 {
    (i * rounds as usize * cases) as u64 + 1
}

/// Every phase of this process's life on the driver (connect, steps,
/// end). `base`: the session's context (its introductions: this rank's
/// own); `me`: what this rank publishes. Before the plan's last phase ends,
/// this rank's results are published (`rank/<r>/elastic`) for the lowest
/// survivor's report. Returns them with every introduction met.
pub fn run(
    base: &Context,
    s: &mut Session,
    rank: &Rank,
    me: &Introduction,
    rounds: u32,
) -> Result<(ElasticTimes, Vec<RankInfo>)> {
    let mut work = Phases {
        base,
        s,
        rounds,
        cases: cases(base),
        known: base.infos.to_vec(),
        plan: base.plan.clone(),
        out: ElasticTimes {
            rank: base.group.rank,
            ..Default::default()
        },
        joined: Vec::new(),
        shrunk: BTreeMap::new(),
    };
    rank.drive(&mut work, me)?;
    Ok((work.out, work.known))
}

/// The collectives' side of each phase ([`PhaseWork`]): connecting,
/// `rounds` rounds of the cases as steps, shrinking the members after a
/// death, and this rank's results.
struct Phases<'a> {
    base: &'a Context<'a>,
    s: &'a mut Session,
    rounds: u32,
    cases: Vec<Case>,
    /// Every introduction met so far, in rank order.
    known: Vec<RankInfo>,
    /// The block plan of the phase's members.
    plan: super::plan::Plan,
    out: ElasticTimes,
    /// Ranks that joined in the current phase, as this process saw them.
    joined: Vec<u32>,
    /// How long each shrink took, by the rank it removed (ms, host).
    shrunk: BTreeMap<u32, f64>,
}

/// The session's context `base` over the block plan `plan` and the
/// introductions met so far.
fn ctx_of<'b>(
    base: &'b Context,
    plan: &'b super::plan::Plan,
    known: &'b [RankInfo],
) -> Context<'b> {
    Context {
        infos: known,
        plan,
        ..*base
    }
}

impl Phases<'_> {
    /// The global number (from 1) of unit `k` of phase `i`: phases, then
    /// rounds, then cases, so a joiner's first call has everyone's epoch.
    fn step_number(&self, i: usize, k: u64) -> u64 {
        first_step(i, self.rounds, self.cases.len()) + k
    }
}

impl PhaseWork for Phases<'_> {
    type Card = Introduction;

    /// The remote view over the phase's members, the newcomers connected.
    fn connect(
        &mut self,
        view: &PhaseView,
        peers: &[Peer<Introduction>],
    ) -> Result<Vec<(u32, anyhow::Error)>> {
        let cards: Vec<(u32, &PeerCard)> =
            peers.iter().map(|p| (p.rank, &p.payload.card)).collect();
        let timeout = self.base.group.timeout();
        let failed = self.s.reconnect(&view.agents, &cards, timeout)?;
        let met: BTreeSet<u32> = peers.iter().map(|p| p.rank).collect();
        self.known.retain(|k| !met.contains(&k.rank));
        (self.known).extend(peers.iter().map(|p| p.payload.info.clone()));
        self.known.sort_by_key(|k| k.rank);
        self.joined = match view.first {
            true if view.phase > 0 => vec![view.me],
            true => Vec::new(),
            false => peers.iter().map(|p| p.rank).collect(),
        };
        Ok(failed)
    }

    /// The block plan of the members, and the store path's pointers.
    fn enter(&mut self, view: &PhaseView, unreachable: &BTreeSet<u32>) -> Result<()> {
        self.plan = block_plan(
            self.base.cfg,
            (self.known.iter()).filter(|k| view.members.contains(&k.rank)),
        );
        if self.base.cfg.paths.contains(&Path::Store) {
            let ctx = ctx_of(self.base, &self.plan, &self.known);
            self.s.probe_members(&ctx, &(&view.members - unreachable))?;
        }
        if !self.joined.is_empty() && view.reporter() {
            tracing::info!(
                "phase {}: rank(s) {:?} join; members {:?}",
                view.phase,
                self.joined,
                view.members
            );
        }
        Ok(())
    }

    fn steps(&self, _: &PhaseView) -> u64 {
        u64::from(self.rounds) * self.cases.len() as u64
    }

    /// One case's `--iters` calls over the active members, each checked;
    /// the phase's first round is its warm-up (checked, not timed).
    fn step(&mut self, view: &PhaseView, k: u64) -> Result<StepOutcome> {
        let ctx = ctx_of(self.base, &self.plan, &self.known);
        let (i, calls) = (view.phase, u64::from(ctx.cfg.iters));
        let (round, ci) = (
            k / self.cases.len() as u64,
            (k % self.cases.len() as u64) as usize,
        );
        let step = self.step_number(i, k);
        self.s.view.set(ctx.view_of(&view.active, step));
        let o = self
            .s
            .run_step(&ctx, &self.cases[ci], (step - 1) * calls, calls)?;
        self.out.steps.push(StepRow {
            case: ci,
            phase: i,
            ranks: self.s.view.get().ranks,
            times_ns: o.times_ns,
            lost: o.lost,
            warm: round == 0,
        });
        if ci + 1 == self.cases.len() && view.reporter() {
            tracing::info!("phase {i}: round {}/{} verified", round + 1, self.rounds);
        }
        Ok(StepOutcome {
            masked: o.masked,
            waited_ns: o.waited_ns,
            lost: o.lost,
        })
    }

    /// Shrink: the next step's members are the survivors (chunk ownership,
    /// slices and output slots recomputed; nothing re-registered).
    fn apply(&mut self, view: &PhaseView, change: &Change) -> Result<()> {
        let next = match change.after {
            Some(k) => self.step_number(view.phase, k + 1),
            None => self.step_number(view.phase, 0),
        };
        let v = ctx_of(self.base, &self.plan, &self.known).view_of(&view.active, next);
        let ms = change.at.elapsed().as_secs_f64() * 1e3;
        self.shrunk.extend(change.new.iter().map(|&r| (r, ms)));
        tracing::info!(
            "step {next}: rank(s) {:?} gone; the next steps run over {} members (nothing re-registered)",
            change.new,
            v.ranks
        );
        Ok(())
    }

    /// The phase's detections and joins into this rank's results; after the
    /// plan's last phase they are published for the report.
    fn end(&mut self, view: &PhaseView, rec: &PhaseRecord) -> Result<()> {
        let i = view.phase;
        for d in &rec.detections {
            self.out.detections.push(Detection {
                rank: d.rank,
                step: self.step_number(i, d.step.unwrap_or(0)),
                wait_ms: d.wait_ms,
                after_kill_ms: d.after_kill_ms,
                agree_ms: d.agree_ms,
                shrink_ms: self.shrunk.get(&d.rank).copied().unwrap_or(0.0),
            });
        }
        let step = self.step_number(i, 0);
        (self.out.joins).extend(
            std::mem::take(&mut self.joined)
                .into_iter()
                .map(|rank| Join {
                    rank,
                    phase: i,
                    step,
                    connect_ms: rec.connect_ms,
                }),
        );
        if view.last {
            let g = self.base.group;
            g.put_final(&g.rank_entry(g.rank, "elastic"), &self.out)?;
        }
        Ok(())
    }
}

/// The rows of the lowest survivor's report: per case and member count,
/// the calls checked and lost and the slowest rank's p50 and p99.
pub fn report(cases: &[Case], all: &[ElasticTimes]) -> Vec<PhaseRow> {
    let mut rows: Vec<PhaseRow> = Vec::new();
    for (ci, case) in cases.iter().enumerate() {
        // Phase by phase; within one, before a shrink first.
        let mut sets: Vec<(usize, std::cmp::Reverse<u32>)> = (all.iter())
            .flat_map(|t| t.steps.iter().filter(|s| s.case == ci))
            .map(|s| (s.phase, std::cmp::Reverse(s.ranks)))
            .collect();
        sets.sort_unstable();
        sets.dedup();
        for (phase, n) in sets {
            rows.push(phase_row(case, ci, (phase, n.0), all));
        }
    }
    rows
}

/// One row of the elastic table.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PhaseRow {
    pub case: String,
    pub op: String,
    pub algo: String,
    pub path: String,
    pub dtype: String,
    pub bytes: u64,
    /// The plan's phase of these steps.
    pub phase: usize,
    /// Members of these steps.
    pub ranks: u32,
    /// Calls checked element by element, summed over the ranks.
    pub calls: u64,
    /// Calls lost (their step abandoned), summed over the ranks.
    pub lost: u64,
    /// The slowest rank's p50 and p99 GPU time per call, µs (the first
    /// round, the warm-up, left out).
    pub p50_us: f64,
    pub p99_us: f64,
}

fn phase_row(case: &Case, ci: usize, (phase, n): (usize, u32), all: &[ElasticTimes]) -> PhaseRow {
    let (mut calls, mut lost, mut p50, mut p99) = (0u64, 0u64, 0f64, 0f64);
    for t in all {
        let mut times: Vec<f64> = Vec::new();
        for s in (t.steps.iter()).filter(|s| s.case == ci && s.phase == phase && s.ranks == n) {
            calls += s.times_ns.len() as u64;
            lost += u64::from(s.lost);
            if !s.warm {
                times.extend(&s.times_ns);
            }
        }
        times.sort_by(f64::total_cmp);
        if let (Some(a), Some(b)) = (pct(&times, 50.0), pct(&times, 99.0)) {
            p50 = p50.max(a / 1e3);
            p99 = p99.max(b / 1e3);
        }
    }
    PhaseRow {
        case: describe(case, n),
        op: case.op.name().into(),
        algo: case.algo.name().into(),
        path: case.path.name().into(),
        dtype: case.dtype.name().into(),
        bytes: case.bytes(n),
        phase,
        ranks: n,
        calls,
        lost,
        p50_us: p50,
        p99_us: p99,
    }
}

/// The `p`th percentile of sorted `v` (nearest rank).
fn pct(v: &[f64], p: f64) -> Option<f64> {
    let n = v.len();
    (n > 0).then(|| v[(((p / 100.0) * n as f64).ceil() as usize).clamp(1, n) - 1])
}

/// The table, the detections and the files, as the lowest survivor prints
/// and writes them.
pub fn publish(
    ctx: &Context,
    infos: &[RankInfo],
    all: &[ElasticTimes],
    json: Option<&std::path::Path>,
    csv: Option<&std::path::Path>,
) -> Result<()> {
    let cases = cases(ctx);
    let rows = report(&cases, all);
    let mut dets: Vec<&Detection> = all.iter().flat_map(|t| &t.detections).collect();
    dets.sort_by_key(|d| d.rank);
    say!(
        "[collectives] elastic run: {} ranks ({}), {} call(s) per step (launched: {}), fault timeout {} ms; {} \
         survivor(s) reported",
        ctx.group.world,
        infos.first().map_or("", |i| i.gpu_name.as_str()),
        ctx.cfg.iters,
        ctx.launch_words(),
        ctx.cfg.fault_timeout_ns() / 1_000_000,
        all.len()
    );
    let seats: Vec<_> = infos.iter().map(RankInfo::seat).collect();
    say!("# {}", crate::ranks::info::placement(&seats, false));
    say!("\n{}", table(&rows));
    for d in &dets {
        say!("{}", detection_line(d));
    }
    let joins = joins(all);
    for j in &joins {
        say!(
            "[collectives] rank {} joined in phase {} (step {}): connected in {:.1} ms (host, the slowest member)",
            j.rank,
            j.phase,
            j.step,
            j.connect_ms
        );
    }
    let doc = serde_json::json!({
        "config": ctx.cfg,
        "ranks": ctx.group.world,
        "rows": rows,
        "detections": dets,
        "joins": joins,
        // A wrong element ends the run with exit 3 before this report.
        "wrong_elements": 0,
        "run_env": crate::results::RunEnv::capture("collectives"),
    });
    if let Some(p) = json {
        std::fs::write(p, serde_json::to_string_pretty(&doc)?)?;
    }
    if let Some(p) = csv {
        let info = serde_json::json!({"config": ctx.cfg, "ranks": ctx.group.world});
        crate::results::write_csv(p, &info, &rows)?;
    }
    Ok(())
}

/// One line per joiner: the slowest connection any survivor saw to it.
fn joins(all: &[ElasticTimes]) -> Vec<Join> {
    let mut by_rank: BTreeMap<u32, Join> = BTreeMap::new();
    for j in all.iter().flat_map(|t| &t.joins) {
        let e = by_rank.entry(j.rank).or_insert_with(|| j.clone());
        e.connect_ms = e.connect_ms.max(j.connect_ms);
    }
    by_rank.into_values().collect()
}

/// `rank 2 gone at step 7: its wait 1000.4 ms (GPU), 1012.0 ms after its kill, agreed in 1.1 ms, shrink 0.002 ms`.
fn detection_line(d: &Detection) -> String {
    let wait = d.wait_ms.map_or("named by the agreement".into(), |w| {
        format!("waited on {w:.1} ms (GPU)")
    });
    let kill = d
        .after_kill_ms
        .map_or(String::new(), |k| format!(", {k:.1} ms after its kill"));
    format!(
        "[collectives] rank {} gone at step {}: {wait}{kill}, agreed in {:.2} ms, shrink {:.3} ms (host)",
        d.rank, d.step, d.agree_ms, d.shrink_ms
    )
}

fn table(rows: &[PhaseRow]) -> String {
    let mut t = format!(
        "{:<14} {:<9} {:<6} {:<9} {:>10} {:>5} {:>6} {:>7} {:>5} {:>10} {:>10}\n",
        "op",
        "algo",
        "path",
        "type",
        "bytes",
        "phase",
        "ranks",
        "calls",
        "lost",
        "p50 µs",
        "p99 µs"
    );
    for r in rows {
        t += &format!(
            "{:<14} {:<9} {:<6} {:<9} {:>10} {:>5} {:>6} {:>7} {:>5} {:>10.2} {:>10.2}\n",
            r.op,
            r.algo,
            r.path,
            r.dtype,
            r.bytes,
            r.phase,
            r.ranks,
            r.calls,
            r.lost,
            r.p50_us,
            r.p99_us
        );
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nixl::serdes::Desc;
    use crate::ranks::nccl::NcclStatus;

    #[test]
    fn an_introduction_survives_the_wire() {
        let intro = Introduction {
            info: RankInfo {
                rank: 4,
                host: "node-1".into(),
                gpu_ordinal: 3,
                gpu_name: "NVIDIA H200".into(),
                gpu_uuid: "GPU-1234".into(),
                sm_count: 132,
                mps: true,
                nccl: NcclStatus::Unavailable("--no-baseline".into()),
            },
            card: PeerCard {
                agent: "collectives-rank-4.1".into(),
                window: Desc {
                    addr: 0x7f00_0000_0000,
                    len: 1 << 24,
                    dev_id: 0,
                },
                metadata: vec![0, 7, 255, 3],
            },
        };
        assert_eq!(Introduction::decode(&intro.encode()).unwrap(), intro);
        assert!(Introduction::decode(&intro.encode()[..10]).is_err());
    }

    #[test]
    fn plans_grow_with_new_ids_and_shrink_only_by_death() {
        let ok = |t: &str| check_plan(&Plan::parse(t).unwrap()).is_ok();
        assert!(ok("[[0,1,2,3]]"));
        assert!(ok("[[0,1,2],[0,1,2,3]]"));
        assert!(ok("[[0,1,-2,3],[0,1,3,4],[0,1,3,4,5,6]]"));
        assert!(!ok("[[0,1,2],[0,1]]"), "rank 2 leaves without dying");
        assert!(!ok("[[0,1,-2],[0,1,2]]"), "rank 2's id comes back");
        assert!(
            !ok("[[0,1],[0,1,2],[0,1,-2],[0,1,2]]"),
            "rank 2's id comes back later"
        );
    }
}
