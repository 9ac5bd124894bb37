#!/usr/bin/env python3
"""A fault campaign for elastic runs of ep or collectives: random plans and random kills.

    python3 bench/elastic_campaign.py --ep BIN/ep --out DIR --runs N [--seed S]
        [--modes ll,ht] [--max-ranks 6] [--long-every 3] [--budget-s SECONDS] [--plan-only]
    python3 bench/elastic_campaign.py --collectives BIN/collectives --out DIR --runs N ...

Every --long-every'th run is one long phase (at least 10 s of steps) of
--max-ranks ranks, a plan kill in it or not, and a kill by pid of any rank
(rank 0 included) at a moment drawn uniformly over the phase's steps: what
follows a death inside a long phase is what short phases never exercise.
For such a run the campaign also checks that it ended within
  steps x (the step p50 before the death) x 1.5 + deaths x (fault timeout + 100 ms)
after its ranks connected (the survivors' phase lines give the steps and the
p50), and that no step after a decision waited on a rank already gone (their
count). Collectives runs draw the operation, algorithm and path; their plans
only lose ranks (a collectives rank leaves only by dying).

Otherwise each run draws, from --seed (printed, repeatable):
  - a plan: a capacity of 3..--max-ranks ranks, 2..4 phases, each phase
    killing 0..2 of its members (rank 0 never: a plan cannot name it) and
    starting 0..2 joiners, killed ids among them; the first runs force the
    cases a random draw might miss (the lowest member killed, the highest,
    two in one phase, kills in consecutive phases, a killed id rejoining);
  - the mode (ll or ht), the data path (put, store or both), the signal
    (SIGKILL or SIGSTOP) of the plan's kills, and the launcher's --kill-seed;
  - in every second run, besides, a kill by pid that no plan names: a rank of
    phase 0 (rank 0 included) at a random moment after the steps began.

Per run it checks the run's exit status, that every death (planned or not)
is named by every survivor of its phase (the "ranks gone" lines), that no
survivor was lost (gone without being killed), and reads the JSON for wrong
values, lost steps, detection (host ms from the kill to the step that masked
it, and the GPU wait up to the masking) and agreement times (host ms from a
survivor's report to the decision).

Ranks that share a GPU under MPS share its fatal faults: a rank killed while
its kernel runs can fail every other rank on that GPU with a CUDA error (the
programs name the cause). Such a run fails, marked "a CUDA fault under MPS"
and counted apart; survival is proven with one rank per GPU (--max-ranks no
more than the machine's GPUs).

DIR gets one folder per run (plan, output, JSON), campaign.tsv (a row per
run), deaths.tsv (a row per death), summary.md (the percentiles table) and
campaign.png (when matplotlib is there). Exit status: 0 when every run
passed every check, 1 otherwise, 2 for bad arguments.
"""
import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import time


def draw_plan(rng, k, max_ranks):
    """Phases as lists of ints, -r = killed during the phase (upstream's format)."""
    forced = {1: "lowest", 2: "highest", 3: "two", 4: "consecutive", 5: "rejoin"}.get(k)
    # A forced case needs room: three members after rank 0 is left out.
    cap = rng.randint(4 if forced else 3, max(max_ranks, 4 if forced else 3))
    n_phases = 3 if forced in ("consecutive", "rejoin") else rng.randint(2, 4)
    ids = list(range(cap))
    # Sometimes leave rank 0 out, so that the lowest member can be killed.
    first = ids[1:] if forced == "lowest" or rng.random() < 0.3 else ids
    members = sorted(first if forced else rng.sample(first, rng.randint(min(3, len(first)), len(first))))
    phases, joined = [], []
    for i in range(n_phases):
        # A plan kills a rank that was running when the phase began.
        can_die = [r for r in members if r != 0 and r not in joined]
        n_kill = rng.choice([0, 1, 1, 2])
        if forced == "lowest" and i == 0:
            kills = [min(members)] if min(members) != 0 else []
        elif forced == "highest" and i == 0:
            kills = [max(members)]
        elif forced == "two" and i == 0:
            kills = rng.sample(can_die, 2) if len(can_die) >= 2 else can_die[:1]
        elif forced == "consecutive" and i < 2:
            kills = [rng.choice(can_die)] if can_die else []
        elif forced == "rejoin" and i == 0:
            kills = [rng.choice(can_die)]
        else:
            kills = rng.sample(can_die, min(n_kill, len(can_die)))
        # Two ranks stay in every phase.
        while len(members) - len(kills) < 2 and kills:
            kills.pop()
        phases.append([-r if r in kills else r for r in members])
        survivors = [r for r in members if r not in kills]
        outside = [r for r in ids if r not in survivors]
        if forced == "rejoin" and i == 0:
            joiners = kills[:]
        else:
            joiners = rng.sample(outside, min(rng.choice([0, 0, 1, 2]), len(outside)))
        leavers = []
        if len(survivors) > 2 and rng.random() < 0.2:
            leavers = [rng.choice([r for r in survivors if r != 0] or [None])]
        members = sorted(set(survivors) - set(leavers) | set(joiners))
        joined = joiners
    return cap, phases


def planned_death(phases, r):
    """Whether the plan kills rank r's first process (started in phase 0)."""
    for phase in phases:
        if -r in phase and r != 0:
            return True
        if r not in phase:
            return False
    return False


GONE = re.compile(r"^\[rank (\d+)\] phase (\d+): ranks gone: \[([\d, ]*)\].*? (\d+) µs after my report", re.M)


def gone_lines(stdout):
    """(namer, phase, set, ms from its report to the decision) of every
    "ranks gone" line: one per survivor and decision that found a death."""
    out = []
    for m in GONE.finditer(stdout):
        gone = {int(x) for x in m.group(3).split(",") if x.strip()}
        out.append((int(m.group(1)), int(m.group(2)), gone, int(m.group(4)) / 1e3))
    return out


OPS = [("allreduce", "one-shot"), ("allreduce", "two-shot"), ("allreduce", "ll"), ("allgather", "one-shot"),
       ("reduce-scatter", "one-shot")]


def draw_run(rng, k, a):
    """Run k's draws: plan, mode (ep) or case (collectives), path, signals,
    kill seed, the victim by pid and the moment, and whether it is long."""
    long = a.long_every > 0 and k % a.long_every == 0
    if long or a.program == "collectives":
        cap = a.max_ranks
        ranks = list(range(cap))
        # One phase; the plan kills one rank besides rank 0 (or none).
        pk = rng.choice([None, None] + ranks[1:])
        phases = [[-r if r == pk else r for r in ranks]]
    else:
        cap, phases = draw_plan(rng, k, a.max_ranks)
    if a.program == "collectives":
        mode = " ".join(rng.choice(OPS))
        path = rng.choice(["store", "put"]) if not mode.endswith(" ll") else "store"
    else:
        mode = rng.choice(a.modes)
        path = rng.choice(["put", "store", "both"])
    sig = rng.choice(["KILL", "STOP"])
    kill_seed = rng.randrange(1 << 32)
    unplanned = long or k % 2 == 0
    # The victim: a process of phase 0 that no plan kills (its death is
    # then the one nobody planned), rank 0 included.
    spared = [r for r in phases[0] if r >= 0 and not planned_death(phases, r)] or [0]
    victim = rng.choice(spared) if unplanned else None
    if unplanned and k == 2:
        victim = min(spared)
    usig = rng.choice(["KILL", "STOP"])
    # A fraction of the phase's steps: the moment is drawn over all of it.
    delay = rng.random()
    return cap, phases, mode, path, sig, kill_seed, victim, usig, delay, long


def run_args(a, mode, path, cap, long):
    """The program's arguments for one run: its steps and shape."""
    if a.program == "collectives":
        op, algo = mode.split()
        rounds = 3000 if long else 300
        return ["--op", op, "--algo", algo, "--path", path, "--dtype", "f32", "-b", "8", "-e", "4K", "-f", "8",
                "--iters", "2", "--rounds", str(rounds), "--no-baseline"]
    args = ["--mode", mode, "--path", path, "--experts", str(40 * cap), "--no-baseline"]
    # A step and its agreement take about a millisecond: 12,000 of them per
    # long phase, over the paths it runs.
    runs = 2 if path == "both" else 1
    if mode == "ll":
        args += ["--iters", str(12000 // runs) if long else "400", "--warmup", "10"]
    else:
        args += ["--iters", str(6000 // runs) if long else "300", "--warmup", "3", "--tokens", "1024"]
    return args


def run_one(a, k, rng, out):
    cap, phases, mode, path, sig, kill_seed, victim, usig, delay, long = draw_run(rng, k, a)
    d = os.path.join(out, f"r{k:03d}")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "plan.json"), "w") as f:
        json.dump(phases, f)
    args = ["--check-connection", "--iters", "3000" if long else "40"] if a.check_connection \
        else run_args(a, mode, path, cap, long)
    if a.program == "ep":
        args += ["--capacity", str(cap)]
    cmd = [a.bin, "--plan", os.path.join(d, "plan.json"), "--kill-signal", sig, "--kill-seed", str(kill_seed),
           "--fault-timeout", str(a.fault_timeout), "--timeout", str(a.timeout),
           "--json", os.path.join(d, "run.json")] + args
    with open(os.path.join(d, "cmd.txt"), "w") as f:
        f.write(" ".join(cmd) + "\n")
    t0 = time.time()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = Stamped(p, d, t0)
    killed_at = kill_by_pid(a, lines, victim, usig, delay, long, p) if victim is not None else None
    try:
        rc = p.wait(timeout=a.run_timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        rc = p.wait()
        rc = rc if rc else 124
    lines.close()
    secs = time.time() - t0
    return judge(a, d, k, cap, phases, mode, path, sig, (victim, killed_at) if killed_at else None, usig, delay,
                 rc, secs, long, lines)


class Stamped:
    """A run's stdout and stderr, each line stamped (s since the launch) as
    it comes, kept in out.txt / err.txt."""

    def __init__(self, p, d, t0):
        import threading
        self.t0, self.out, self.err, self.lock = t0, [], [], threading.Lock()
        self.files = [open(os.path.join(d, "out.txt"), "w"), open(os.path.join(d, "err.txt"), "w")]
        self.threads = [threading.Thread(target=self.read, args=(p.stdout, self.out, self.files[0])),
                        threading.Thread(target=self.read, args=(p.stderr, self.err, self.files[1]))]
        for t in self.threads:
            t.start()

    def read(self, pipe, into, f):
        for line in pipe:
            at = time.time() - self.t0
            with self.lock:
                into.append((at, line.rstrip("\n")))
            f.write(f"{at:9.3f} {line}")
            f.flush()

    def close(self):
        for t in self.threads:
            t.join(timeout=30)
        for f in self.files:
            f.close()

    def text(self, which):
        with self.lock:
            return "\n".join(l for _, l in (self.out if which == "out" else self.err))

    def first(self, pattern):
        """When the first line matching `pattern` came (s), if one did."""
        with self.lock:
            return next((t for t, l in self.out + self.err if re.search(pattern, l)), None)


def kill_by_pid(a, lines, victim, sig, frac, long, proc):
    """Kills rank `victim`'s first process at a moment drawn over phase 0:
    once its ranks connected, `frac` of the phase's expected length later."""
    pid = None
    deadline = time.time() + 120
    connected = r"connected to \d+ newcomer|connected to all|join; members|\] rank\(s\) .* join|round 1/"
    while time.time() < deadline and proc.poll() is None:
        m = re.search(rf"started rank {victim} \(pid (\d+)\)", lines.text("err"))
        pid = int(m.group(1)) if m else pid
        if pid and lines.first(connected) is not None:
            break
        time.sleep(0.01)
    if pid is None or proc.poll() is not None:
        return None
    # Long phases last 10 s or more; short ones a second or two.
    time.sleep(frac * (8.0 if long else 1.0))
    try:
        os.kill(pid, getattr(signal, "SIG" + sig))
    except ProcessLookupError:
        return None
    return time.time() - lines.t0


DONE = re.compile(r"^\[rank (\d+)\] phase (\d+) done: (\d+) steps, (\d+) lost(.*)$")


def phase_lines(lines):
    """Every survivor's phase line: (rank, phase, steps, lost, waits on a gone
    rank, step p50 before ms, after ms, when it came)."""
    out = []
    for at, l in lines.out:
        m = DONE.match(l)
        if not m:
            continue
        rest = m.group(5)
        waits = re.search(r"waited on a rank already gone: (\d+)", rest)
        p50 = re.search(r"step p50 ([\d.]+) ms(?: before, ([\d.]+) ms after)?", rest)
        out.append((int(m.group(1)), int(m.group(2)), int(m.group(3)), int(m.group(4)),
                    int(waits.group(1)) if waits else 0, float(p50.group(1)) if p50 else None,
                    float(p50.group(2)) if p50 and p50.group(2) else None, at))
    return out


def judge(a, d, k, cap, phases, mode, path, sig, victim, usig, delay, rc, secs, long, lines):
    stdout, stderr = lines.text("out"), lines.text("err")
    try:
        doc = json.load(open(os.path.join(d, "run.json")))
    except (OSError, ValueError):
        doc = {}
    done = phase_lines(lines)
    # The deaths: the plan's kills the launcher sent, and the kill by pid.
    deaths = []
    # A kill sent after its phase ended hit a process whose work was done.
    late = {(int(m.group(1)), int(m.group(2))) for m in
            re.finditer(r"^\[\w+\] phase (\d+) ended before the planned kill of rank (\d+)", stderr, re.M)}
    for m in re.finditer(r"^\[\w+\] phase (\d+): sent (\S+) to rank (\d+)", stderr, re.M):
        if (int(m.group(1)), int(m.group(3))) not in late:
            deaths.append((int(m.group(1)), int(m.group(3)), "plan " + m.group(2)))
    gone = gone_lines(stdout)
    # The kill by pid counts once the launcher saw that death; its phase is
    # the first in which a survivor named it. One that came after the victim
    # ended the last phase of its life hit a process whose work was done.
    victim, killed_at = victim or (None, None)
    ended = max((x[7] for x in done if x[0] == victim), default=None) if victim is not None else None
    if ended is not None and ended < killed_at and not any(victim in g for _, _, g, _ in gone):
        late.add((-1, victim))
    elif victim is not None and re.search(rf"(died unplanned|gone), the others went on: [^\n]*\brank {victim}\b", stderr):
        phase = min((p for _, p, g, _ in gone if victim in g), default=0)
        deaths.append((phase, victim, "pid SIG" + usig))
    detected = detections(doc)
    death_rows = []
    for phase, r, how in deaths:
        # Every survivor of the phase prints its phase line.
        survivors = {n for n, p, *_ in done if p == phase}
        namers = {n for n, p, g, _ in gone if p == phase and r in g}
        det = [x for x in detected if x[0] == phase and x[1] == r]
        death_rows.append({
            "run": k, "phase": phase, "rank": r, "how": how, "survivors": len(survivors),
            "named_by": len(namers & survivors),
            "detect_ms": max((x[2] for x in det if x[2] is not None), default=None),
            "gpu_wait_ms": max((x[3] for x in det if x[3] is not None), default=None),
            "agree_ms": max((ms for _, p, g, ms in gone if p == phase and r in g), default=None),
        })
    agree = [ms for _, _, _, ms in gone]
    killed_ids = {r for _, r, _ in deaths}
    # A rank gone that nobody killed: a survivor lost.
    lost_survivors = sorted({r for _, _, g, _ in gone for r in g} - killed_ids)
    wrong = sum(row.get("wrong_values", 0) for row in doc.get("phases", []))
    lost_steps = sum(x[3] for x in done)
    waits = sum(x[4] for x in done)
    unnamed = [x for x in death_rows if x["named_by"] < x["survivors"]]
    bound = time_bound(a, lines, done, len(death_rows)) if long else None
    ok = rc == 0 and not unnamed and not lost_survivors and wrong == 0 and waits == 0 and bool(done)
    ok = ok and (bound is None or bound[0] <= bound[1])
    # A fault shared under MPS (see the docstring), as the programs name it.
    mps_fault = rc != 0 and "is shared under MPS, where a fatal fault" in stderr
    befores = [x[5] for x in done if x[5] is not None]
    afters = [x[6] for x in done if x[6] is not None]
    run = {
        "run": k, "program": a.program, "capacity": cap, "plan": json.dumps(phases, separators=(",", ":")),
        "mode": mode, "path": path, "long": long,
        "plan_signal": "SIG" + sig,
        "unplanned": f"rank {victim} SIG{usig} at {killed_at:.2f} s" if victim is not None else "-",
        "exit": rc, "deaths": len(death_rows), "unnamed": len(unnamed), "survivors_lost": len(lost_survivors),
        "late_kills": len(late), "lost_steps": lost_steps, "wrong_values": wrong, "waits_on_gone": waits,
        "steps": max((x[2] for x in done), default=0),
        "step_p50_before_ms": max(befores) if befores else None, "step_p50_after_ms": max(afters) if afters else None,
        "steps_s": round(bound[0], 2) if bound else None, "bound_s": round(bound[1], 2) if bound else None,
        "agree_max_ms": max(agree) if agree else None, "seconds": round(secs, 1), "ok": ok,
        "mps_fault": mps_fault,
    }
    return run, death_rows, agree


def detections(doc):
    """(phase, rank, ms from the kill, GPU wait ms) of every detection in a
    run's JSON: ep's per-phase results, or collectives' detection list."""
    out = []
    for res in doc.get("ranks", []) if isinstance(doc.get("ranks"), list) else []:
        for x in res.get("detected", []):
            out.append((res.get("phase", 0), x["rank"], x.get("after_kill_ms"), x.get("wait_ms")))
    for x in doc.get("detections", []):
        out.append((0, x["rank"], x.get("after_kill_ms"), x.get("wait_ms")))
    return out


def time_bound(a, lines, done, deaths):
    """A long phase's (seconds from its ranks connecting to its last phase
    line, the bound: steps x the step p50 before the death x 1.5 + deaths x
    (fault timeout + 100 ms))."""
    connected = lines.first(r"connected to \d+ newcomer|connected to all|round 1/|phase 0: ranks")
    if connected is None or not done:
        return None
    steps = max(x[2] for x in done)
    p50 = max((x[5] for x in done if x[5] is not None), default=0.0)
    took = max(x[7] for x in done) - connected
    return took, steps * p50 / 1e3 * 1.5 + deaths * (a.fault_timeout / 1e3 + 0.1)


def pct(v, q):
    if not v:
        return None
    v = sorted(v)
    return v[min(len(v) - 1, int(q * len(v)))]


def fmt(x):
    return "-" if x is None else (f"{x:.1f}" if isinstance(x, float) else str(x))


def summary(runs, deaths, agree, a):
    det = [x["detect_ms"] for x in deaths if x["detect_ms"] is not None]
    wait = [x["gpu_wait_ms"] for x in deaths if x["gpu_wait_ms"] is not None]
    planned = sum(1 for x in deaths if x["how"].startswith("plan"))
    rows = [
        ("runs (passed)", f"{len(runs)} ({sum(r['ok'] for r in runs)})"),
        ("deaths (planned / by pid)", f"{len(deaths)} ({planned} / {len(deaths) - planned})"),
        ("deaths named by every survivor", f"{sum(x['named_by'] >= x['survivors'] for x in deaths)} of {len(deaths)}"),
        ("survivors lost", str(sum(r["survivors_lost"] for r in runs))),
        ("wrong values", str(sum(r["wrong_values"] for r in runs))),
        ("lost steps (reported, not counted as verified)", str(sum(r["lost_steps"] for r in runs))),
        ("runs exiting non-zero", str(sum(r["exit"] != 0 for r in runs))),
        ("of them, ranks failed by a CUDA fault under MPS (one client's fault fails all: KERNEL_GUIDE.md §8)",
         str(sum(r["mps_fault"] for r in runs))),
        ("kills that came after their phase ended (not deaths in the run)", str(sum(r["late_kills"] for r in runs))),
        ("steps after a decision that waited on a rank already gone", str(sum(r["waits_on_gone"] for r in runs))),
    ]
    longs = [r for r in runs if r["long"]]
    if longs:
        ratio = [r["step_p50_after_ms"] / r["step_p50_before_ms"] for r in longs
                 if r["step_p50_after_ms"] and r["step_p50_before_ms"]]
        within = sum(1 for r in longs if r["bound_s"] is not None and r["steps_s"] <= r["bound_s"])
        rows += [
            ("long phases (one phase, >= 10 s of steps drawn), within their time bound",
             f"{len(longs)}, {within} within"),
            ("long phases: step p50 after the death / before (host, with the agreement)",
             f"p50 {fmt(pct(ratio, .5))}, max {fmt(max(ratio) if ratio else None)}"),
        ]
    by = {}
    for r in runs:
        key = f"{r['program']} {r['mode']} {r['path']}"
        by[key] = by.get(key, 0) + r["deaths"]
    rows.append(("deaths by program, mode/case and path", "; ".join(f"{k}: {v}" for k, v in sorted(by.items()))))
    out = [f"# Elastic fault campaign: {len(runs)} runs, seed {a.seed}", "",
           "| | |", "|---|---|"] + [f"| {k} | {v} |" for k, v in rows]
    out += ["", "| time, ms | samples | p50 | p99 | max |", "|---|---|---|---|---|"]
    for name, v in [("detection (kill to this survivor adopting the decision, host clock)", det),
                    ("GPU wait up to the masking", wait),
                    ("agreement (a survivor's report to the decision)", agree)]:
        out.append(f"| {name} | {len(v)} | {fmt(pct(v, .5))} | {fmt(pct(v, .99))} | {fmt(max(v) if v else None)} |")
    return "\n".join(out) + "\n"


def write_tsv(path, rows):
    if not rows:
        return
    keys = list(rows[0].keys())
    with open(path, "w") as f:
        f.write("\t".join(keys) + "\n")
        for r in rows:
            f.write("\t".join(fmt(r[k]) for k in keys) + "\n")


def plot(out, deaths, agree):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("campaign: no matplotlib here, no plot (summary.md has the numbers)", file=sys.stderr)
        return
    fig, ax = plt.subplots(1, 2, figsize=(11, 4))
    for v, label in [(sorted(agree), "agreement")]:
        if v:
            ax[0].plot(v, [(i + 1) / len(v) for i in range(len(v))], label=label)
    ax[0].set_xscale("log")
    ax[0].set_xlabel("ms from a survivor's report to the decision")
    ax[0].set_ylabel("fraction of agreements")
    ax[0].set_title("agreement after a death (CDF)")
    det = sorted(x["detect_ms"] for x in deaths if x["detect_ms"] is not None)
    if det:
        ax[1].plot(det, [(i + 1) / len(det) for i in range(len(det))])
    ax[1].set_xlabel("ms from the kill to the decision")
    ax[1].set_title("detection on the GPU (CDF)")
    fig.tight_layout()
    fig.savefig(os.path.join(out, "campaign.png"), dpi=110)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    prog = p.add_mutually_exclusive_group(required=True)
    prog.add_argument("--ep", help="the ep binary")
    prog.add_argument("--collectives", help="the collectives binary")
    p.add_argument("--out", required=True, help="results folder")
    p.add_argument("--runs", type=int, required=True, help="how many runs")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--modes", default="ll,ht", help="ep: comma-separated: ll, ht")
    p.add_argument("--max-ranks", type=int, default=6,
                   help="largest capacity drawn (at least 3); with several GPUs, their count: one rank per GPU")
    p.add_argument("--long-every", type=int, default=3, help="every Nth run is one long phase (0: none)")
    p.add_argument("--fault-timeout", type=int, default=1000, help="ms, passed to every run")
    p.add_argument("--timeout", type=int, default=20, help="s, every run's --timeout")
    p.add_argument("--run-timeout", type=int, default=60, help="seconds before a run is killed")
    p.add_argument("--budget-s", type=int, default=0,
                   help="start no run after this many seconds (0: no limit); what ran is summarised")
    p.add_argument("--first", type=int, default=1, help="number of the first run (to go on with a campaign)")
    p.add_argument("--plan-only", action="store_true", help="print the drawn plans and stop (no GPU)")
    p.add_argument("--check-connection", action="store_true",
                   help="run --check-connection (no GPU: membership only; no JSON, so no times)")
    a = p.parse_args()
    a.program, a.bin = ("ep", a.ep) if a.ep else ("collectives", a.collectives)
    a.modes = [m for m in a.modes.split(",") if m]
    if a.runs < 1 or a.max_ranks < 3 or any(m not in ("ll", "ht") for m in a.modes):
        p.error("--runs >= 1, --max-ranks >= 3, --modes of ll and ht")
    rng = random.Random(a.seed)
    if a.plan_only:
        for k in range(1, a.runs + 1):
            print(k, *draw_plan(rng, k, a.max_ranks))
        return 0
    if not os.access(a.bin, os.X_OK):
        print(f"campaign: {a.bin} is not an executable {a.program} (build it, or unpack the GPU bundle)",
              file=sys.stderr)
        return 2
    os.makedirs(a.out, exist_ok=True)
    print(f"campaign: {a.runs} runs, seed {a.seed}, results in {a.out}", file=sys.stderr)
    runs, deaths, agree = [], [], []
    began = time.time()
    text = summary(runs, deaths, agree, a)
    for k in range(1, a.first + a.runs):
        if a.budget_s and time.time() - began > a.budget_s:
            print(f"campaign: the budget of {a.budget_s} s is spent: runs {k}.. not started", file=sys.stderr)
            break
        if k < a.first:
            # The draws of the runs before, so that run k is the same run.
            draw_run(rng, k, a)
            continue
        run, drows, ag = run_one(a, k, rng, a.out)
        runs.append(run), deaths.extend(drows), agree.extend(ag)
        verdict = "ok" if run["ok"] else "FAILED (a CUDA fault under MPS)" if run["mps_fault"] else "FAILED"
        print(f"[{k}/{a.runs}] {verdict}: {run['program']} {run['mode']} {run['path']} "
              f"{'long ' if run['long'] else ''}plan {run['plan']} "
              f"(kills {run['plan_signal']}), unplanned {run['unplanned']}: exit {run['exit']}, "
              f"{run['deaths']} death(s), {run['unnamed']} unnamed, agree max {fmt(run['agree_max_ms'])} ms, "
              f"steps {run['steps']} in {fmt(run['steps_s'])} s (bound {fmt(run['bound_s'])}), "
              f"waits on gone {run['waits_on_gone']}, "
              f"{run['seconds']} s", file=sys.stderr)
        # After every run: a campaign cut short keeps what it measured.
        write_tsv(os.path.join(a.out, "campaign.tsv"), runs)
        write_tsv(os.path.join(a.out, "deaths.tsv"), deaths)
        text = summary(runs, deaths, agree, a)
        open(os.path.join(a.out, "summary.md"), "w").write(text)
    print(text)
    plot(a.out, deaths, agree)
    return 0 if runs and all(r["ok"] for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
