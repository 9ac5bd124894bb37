//! Collectives that survive a rank's death (`--elastic`, or `--plan FILE`
//! of one phase whose `-r` ranks the launcher kills), written as phases:
//!
//! 1. **meet** — the ranks agree on the configuration, introduce
//!    themselves, open the session (window, views, pointers) and the
//!    membership of [`crate::ranks`] (its opening round is the barrier);
//! 2. **steps** — rounds of the sweep, one step per case: `--iters` calls,
//!    each with fresh inputs and every output element checked against the
//!    sum of the call's members; after each step the survivors agree on
//!    who is gone ([`Membership::agree`]). A wait on a dead or frozen rank
//!    masks it after `--fault-timeout` and abandons the step on every
//!    member (cuda/collectives.cu: the abort slots), so a death costs one
//!    step's calls, counted lost, never a wrong element;
//! 3. **shrink** — a decision that removes ranks gives the next step fewer
//!    members ([`View`]): chunk ownership, slices and output slots are
//!    recomputed over the survivors' indices; the window, its
//!    registration and the views stay (nothing is re-registered, no kernel
//!    runs meanwhile);
//! 4. **end** — the round that ends the phase, the session closed among
//!    the survivors, and the lowest survivor's report: per case and member
//!    count the time per call, calls checked and lost, and each death's
//!    detection, agreement and shrink.
//!
//! Ranks do not join an elastic collectives run (a plan of one phase).

use std::collections::BTreeSet;
use std::time::Instant;

use anyhow::Result;
use serde::{Deserialize, Serialize};

use super::case::Case;
use super::session::{Context, RankInfo, Session, StepOutcome, describe};
use crate::ranks::check::decision_line;
use crate::ranks::membership::{Membership, lowest, unix_ns};
use crate::say;

/// One rank's steps of one case over one set of members.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StepRow {
    /// Index into the run's cases ([`cases`]).
    pub case: usize,
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

/// One rank's elastic run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ElasticTimes {
    pub rank: u32,
    pub steps: Vec<StepRow>,
    pub detections: Vec<Detection>,
}

crate::json_value!(ElasticTimes => "elastic results");

/// The run's cases, in step order within a round.
pub fn cases(ctx: &Context) -> Vec<Case> {
    ctx.cfg.groups().into_iter().flat_map(|g| g.cases).collect()
}

/// Steps, phase 0: `rounds` rounds of every case; returns this rank's
/// rows and detections.
pub fn steps(ctx: &Context, s: &Session, el: &Membership, rounds: u32) -> Result<ElasticTimes> {
    let (g, cfg) = (ctx.group, ctx.cfg);
    let cases = cases(ctx);
    let calls = u64::from(cfg.iters);
    let mut out = ElasticTimes {
        rank: g.rank,
        ..Default::default()
    };
    let mut masked = BTreeSet::new();
    let mut first_call = 0u64;
    for round in 0..rounds {
        for (ci, case) in cases.iter().enumerate() {
            let step = u64::from(round) * cases.len() as u64 + ci as u64 + 1;
            s.view.set(ctx.view_of(&el.active(0), step));
            el.steps_begin(0)?;
            let o = s.run_step(ctx, case, first_call, calls)?;
            first_call += calls;
            out.steps.push(StepRow {
                case: ci,
                ranks: s.view.get().ranks,
                times_ns: o.times_ns.clone(),
                lost: o.lost,
                warm: round == 0,
            });
            agree(ctx, el, step, &o, &mut masked, &mut out)?;
        }
        if g.rank == lowest(&el.active(0)) {
            tracing::info!("round {}/{rounds} verified", round + 1);
        }
    }
    Ok(out)
}

/// After step `step`: what this rank masked (its kernels, or the ranks
/// found dead meanwhile) goes to the agreement; a decision that removes
/// ranks shrinks the members of the next step.
fn agree(
    ctx: &Context,
    el: &Membership,
    step: u64,
    o: &StepOutcome,
    masked: &mut BTreeSet<u32>,
    out: &mut ElasticTimes,
) -> Result<()> {
    let g = ctx.group;
    let others: Vec<u32> = el.active(0).into_iter().filter(|&r| r != g.rank).collect();
    masked.extend(&o.masked);
    masked.extend(el.found_dead(&others, 0)?);
    let d = el.agree(0, step, masked)?;
    masked.retain(|r| d.gone.contains(r));
    if !d.forgiven.is_empty() {
        // Every member finished the step before reporting: nothing of it is
        // in flight, the forgiven rank simply stays a member.
        say!("{}", decision_line(g.rank, 0, &d));
    }
    if d.new.is_empty() {
        return Ok(());
    }
    let decided = Instant::now();
    let now = unix_ns();
    say!("{}", decision_line(g.rank, 0, &d));
    let view = ctx.view_of(&el.active(0), step + 1);
    let shrink_ms = decided.elapsed().as_secs_f64() * 1e3;
    let survivors = view.ranks;
    for &r in &d.new {
        out.detections.push(Detection {
            rank: r,
            step,
            wait_ms: o
                .masked
                .contains(&r)
                .then(|| o.waited_ns.unwrap_or(0) as f64 / 1e6),
            after_kill_ms: el
                .died_at(0, r)?
                .map(|k| now.saturating_sub(k) as f64 / 1e6),
            agree_ms: d.waited_us as f64 / 1e3,
            shrink_ms,
        });
    }
    tracing::info!(
        "step {step}: rank(s) {:?} gone; the next steps run over {survivors} members (nothing re-registered)",
        d.new
    );
    Ok(())
}

/// The rows of the lowest survivor's report: per case and member count,
/// the calls checked and lost and the slowest rank's p50 and p99.
pub fn report(cases: &[Case], all: &[ElasticTimes]) -> Vec<PhaseRow> {
    let mut rows: Vec<PhaseRow> = Vec::new();
    for (ci, case) in cases.iter().enumerate() {
        let mut counts: Vec<u32> = all
            .iter()
            .flat_map(|t| t.steps.iter().filter(|s| s.case == ci).map(|s| s.ranks))
            .collect();
        counts.sort_unstable_by(|a, b| b.cmp(a));
        counts.dedup();
        for n in counts {
            rows.push(phase_row(case, ci, n, all));
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

fn phase_row(case: &Case, ci: usize, n: u32, all: &[ElasticTimes]) -> PhaseRow {
    let (mut calls, mut lost, mut p50, mut p99) = (0u64, 0u64, 0f64, 0f64);
    for t in all {
        let mut times: Vec<f64> = Vec::new();
        for s in t.steps.iter().filter(|s| s.case == ci && s.ranks == n) {
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
        "[collectives] elastic run: {} ranks ({}), {} call(s) per step, fault timeout {} ms; {} survivor(s) reported",
        ctx.group.world,
        infos.first().map_or("", |i| i.gpu_name.as_str()),
        ctx.cfg.iters,
        ctx.cfg.fault_timeout_ns() / 1_000_000,
        all.len()
    );
    say!("\n{}", table(&rows));
    for d in &dets {
        say!("{}", detection_line(d));
    }
    let doc = serde_json::json!({
        "config": ctx.cfg,
        "ranks": ctx.group.world,
        "rows": rows,
        "detections": dets,
        // A wrong element ends the run with exit 3 before this report.
        "wrong_elements": 0,
        "run_env": crate::results::RunEnv::capture("collectives"),
    });
    if let Some(p) = json {
        std::fs::write(p, serde_json::to_string_pretty(&doc)?)?;
    }
    if let Some(p) = csv {
        std::fs::write(p, csv_text(&rows))?;
    }
    Ok(())
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
        "{:<14} {:<9} {:<6} {:<9} {:>10} {:>6} {:>7} {:>5} {:>10} {:>10}\n",
        "op", "algo", "path", "type", "bytes", "ranks", "calls", "lost", "p50 µs", "p99 µs"
    );
    for r in rows {
        t += &format!(
            "{:<14} {:<9} {:<6} {:<9} {:>10} {:>6} {:>7} {:>5} {:>10.2} {:>10.2}\n",
            r.op, r.algo, r.path, r.dtype, r.bytes, r.ranks, r.calls, r.lost, r.p50_us, r.p99_us
        );
    }
    t
}

fn csv_text(rows: &[PhaseRow]) -> String {
    let mut t = String::from("op,algo,path,dtype,bytes,ranks,calls,lost,p50_us,p99_us\n");
    for r in rows {
        t += &format!(
            "{},{},{},{},{},{},{},{},{:.3},{:.3}\n",
            r.op, r.algo, r.path, r.dtype, r.bytes, r.ranks, r.calls, r.lost, r.p50_us, r.p99_us
        );
    }
    t
}
