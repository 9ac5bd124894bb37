#!/usr/bin/env python3
"""A fault campaign for elastic ep runs: random plans and random kills.

    python3 scripts/elastic_campaign.py --ep BIN/ep --out DIR --runs N [--seed S]
        [--modes ll,ht] [--max-ranks 6] [--plan-only]

Each run draws, from --seed (printed, repeatable):
  - a plan: a capacity of 3..--max-ranks ranks, 2..4 phases, each phase
    killing 0..2 of its members (rank 0 never: a plan cannot name it) and
    starting 0..2 joiners, killed ids among them; the first runs force the
    cases a random draw might miss (the lowest member killed, the highest,
    two in one phase, kills in consecutive phases, a killed id rejoining);
  - the mode (ll or ht), the data path (put or store), the signal (SIGKILL or
    SIGSTOP) of the plan's kills, and the launcher's --kill-seed;
  - in every second run, besides, a kill by pid that no plan names: a rank of
    phase 0 (rank 0 included) at a random moment after the steps began.

Per run it checks the run's exit status, that every death (planned or not)
is named by every survivor of its phase (the "ranks gone" lines), that no
survivor was lost (gone without being killed), and reads the JSON for wrong
values, lost steps, detection (host ms from the kill to the step that masked
it, and the GPU wait up to the masking) and agreement times (host ms from a
survivor's report to the decision). DIR gets one folder per run (plan,
output, JSON), campaign.tsv (a row per run), deaths.tsv (a row per death),
summary.md (the percentiles table) and campaign.png (when matplotlib is
there). Exit status: 0 when every run passed every check, 1 otherwise, 2 for
bad arguments.
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


def draw_run(rng, k, a):
    """Run k's draws: plan, mode, path, signals, kill seed, the victim by pid."""
    cap, phases = draw_plan(rng, k, a.max_ranks)
    mode = rng.choice(a.modes)
    path = rng.choice(["put", "store"])
    sig = rng.choice(["KILL", "STOP"])
    kill_seed = rng.randrange(1 << 32)
    unplanned = k % 2 == 0
    # The victim: a process of phase 0 that no plan kills (its death is
    # then the one nobody planned), rank 0 included.
    spared = [r for r in phases[0] if r >= 0 and not planned_death(phases, r)] or [0]
    victim = rng.choice(spared) if unplanned else None
    if unplanned and k == 2:
        victim = min(spared)
    usig = rng.choice(["KILL", "STOP"])
    delay = rng.random() * (1.0 if mode == "ll" else 0.3)
    return cap, phases, mode, path, sig, kill_seed, victim, usig, delay


def run_one(a, k, rng, out):
    cap, phases, mode, path, sig, kill_seed, victim, usig, delay = draw_run(rng, k, a)
    unplanned = victim is not None
    d = os.path.join(out, f"r{k:03d}")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "plan.json"), "w") as f:
        json.dump(phases, f)
    iters = ["--iters", "400", "--warmup", "10"] if mode == "ll" else ["--iters", "60", "--warmup", "3", "--tokens", "1024"]
    # 40 experts per rank of the capacity: every rank hosts a whole number.
    iters += ["--experts", str(40 * cap)]
    if a.check_connection:
        iters = ["--check-connection", "--iters", "40"]
    cmd = [a.ep, "--plan", os.path.join(d, "plan.json"), "--capacity", str(cap), "--mode", mode, "--path", path,
           "--kill-signal", sig, "--kill-seed", str(kill_seed), "--json", os.path.join(d, "run.json")] + iters
    with open(os.path.join(d, "cmd.txt"), "w") as f:
        f.write(" ".join(cmd) + "\n")
    so, se = open(os.path.join(d, "out.txt"), "w"), open(os.path.join(d, "err.txt"), "w")
    t0 = time.time()
    p = subprocess.Popen(cmd, stdout=so, stderr=se)
    killed_pid = None
    if unplanned:
        killed_pid = kill_by_pid(d, victim, usig, delay, p)
    try:
        rc = p.wait(timeout=a.run_timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        rc = p.wait()
        rc = rc if rc else 124
    so.close(), se.close()
    secs = time.time() - t0
    return judge(d, k, cap, phases, mode, path, sig, victim if killed_pid else None, usig, delay, rc, secs,
                 a.check_connection)


def kill_by_pid(d, victim, sig, delay, proc):
    """Kills rank `victim`'s first process once phase 0's steps are under way
    (a progress line; without a GPU, once the ranks are connected)."""
    pid = None
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        text = open(os.path.join(d, "err.txt")).read()
        m = re.search(rf"^\[ep\] started rank {victim} \(pid (\d+)\)$", text, re.M)
        if m:
            pid = int(m.group(1))
        if pid and ("steps verified" in text or "connected to all" in open(os.path.join(d, "out.txt")).read()):
            break
        time.sleep(0.02)
    if pid is None or proc.poll() is not None:
        return None
    time.sleep(delay)
    try:
        os.kill(pid, getattr(signal, "SIG" + sig))
    except ProcessLookupError:
        return None
    return pid


def judge(d, k, cap, phases, mode, path, sig, victim, usig, delay, rc, secs, check):
    stdout = open(os.path.join(d, "out.txt")).read()
    stderr = open(os.path.join(d, "err.txt")).read()
    try:
        doc = json.load(open(os.path.join(d, "run.json")))
    except (OSError, ValueError):
        doc = {"phases": [], "ranks": []}
    rows = {}
    for row in doc.get("phases", []):
        rows.setdefault(row["phase"], row)
    # The deaths: the plan's kills the launcher sent, and the kill by pid.
    deaths = []
    # A kill sent after its phase ended hit a process whose work was done.
    late = {(int(m.group(1)), int(m.group(2))) for m in
            re.finditer(r"^\[ep\] phase (\d+) ended before the planned kill of rank (\d+)", stderr, re.M)}
    for m in re.finditer(r"^\[ep\] phase (\d+): sent (\S+) to rank (\d+)", stderr, re.M):
        if (int(m.group(1)), int(m.group(3))) not in late:
            deaths.append((int(m.group(1)), int(m.group(3)), "plan " + m.group(2)))
    lines = gone_lines(stdout)
    # The kill by pid counts once the launcher saw that death; its phase is
    # the first in which a survivor named it.
    if victim is not None and re.search(rf"died unplanned, the others went on: [^\n]*\brank {victim}\b", stderr):
        phase = min((p for _, p, g, _ in lines if victim in g), default=0)
        deaths.append((phase, victim, "pid SIG" + usig))
    dead_ids = {(p, r) for p, r, _ in deaths}
    death_rows = []
    for phase, r, how in deaths:
        row = rows.get(phase, {})
        namers = {n for n, p, g, _ in lines if p == phase and r in g}
        # Without a GPU (--check-connection) there is no report: whoever
        # named it stands for the survivors.
        survivors = set(row.get("ranks", [])) - set(row.get("killed", [])) if row else namers or {None}
        det = [x for res in doc.get("ranks", []) if res["phase"] == phase for x in res.get("detected", [])
               if x["rank"] == r]
        death_rows.append({
            "run": k, "phase": phase, "rank": r, "how": how, "survivors": len(survivors),
            "named_by": len(namers & survivors),
            "detect_ms": max((x["after_kill_ms"] for x in det if x.get("after_kill_ms") is not None), default=None),
            "gpu_wait_ms": max((x["wait_ms"] for x in det), default=None),
            "agree_ms": max((ms for _, p, g, ms in lines if p == phase and r in g), default=None),
        })
    agree = [ms for _, _, _, ms in lines]
    gone_all = {(i, r) for i, row in rows.items() for r in row.get("killed", [])}
    # A rank gone that nobody killed: a survivor lost. A planned victim
    # agreed gone a phase later (killed late) is not one.
    killed_ids = {r for _, r in dead_ids}
    lost_survivors = sorted({r for _, r in gone_all} - killed_ids)
    wrong = sum(row.get("wrong_values", 0) for row in doc.get("phases", []))
    lost_steps = sum(row.get("lost_steps", 0) for row in doc.get("phases", []))
    unnamed = [x for x in death_rows if x["named_by"] < x["survivors"]]
    ok = rc == 0 and not unnamed and not lost_survivors and wrong == 0
    ok = ok and (bool(doc.get("phases")) or check)
    run = {
        "run": k, "capacity": cap, "plan": json.dumps(phases, separators=(",", ":")), "mode": mode, "path": path,
        "plan_signal": "SIG" + sig, "unplanned": f"rank {victim} SIG{usig} +{delay * 1e3:.0f} ms" if victim is not None else "-",
        "exit": rc, "deaths": len(death_rows), "unnamed": len(unnamed), "survivors_lost": len(lost_survivors),
        "late_kills": len(late), "lost_steps": lost_steps, "wrong_values": wrong,
        "agree_max_ms": max(agree) if agree else None, "seconds": round(secs, 1), "ok": ok,
    }
    return run, death_rows, agree


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
    ]
    out = [f"# Elastic fault campaign: {len(runs)} runs, seed {a.seed}", "",
           "| | |", "|---|---|"] + [f"| {k} | {v} |" for k, v in rows]
    out += ["", "| time, ms | samples | p50 | p99 | max |", "|---|---|---|---|---|"]
    for name, v in [("detection (kill to the step that masked it, host clock)", det),
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
    ax[1].set_xlabel("ms from the kill to the step that masked it")
    ax[1].set_title("detection on the GPU (CDF)")
    fig.tight_layout()
    fig.savefig(os.path.join(out, "campaign.png"), dpi=110)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--ep", required=True, help="the ep binary")
    p.add_argument("--out", required=True, help="results folder")
    p.add_argument("--runs", type=int, required=True, help="how many runs")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--modes", default="ll,ht", help="comma-separated: ll, ht")
    p.add_argument("--max-ranks", type=int, default=6, help="largest capacity drawn (at least 3)")
    p.add_argument("--run-timeout", type=int, default=180, help="seconds before a run is killed")
    p.add_argument("--first", type=int, default=1, help="number of the first run (to go on with a campaign)")
    p.add_argument("--plan-only", action="store_true", help="print the drawn plans and stop (no GPU)")
    p.add_argument("--check-connection", action="store_true",
                   help="run ep --check-connection (no GPU: membership only; no JSON, so no times)")
    a = p.parse_args()
    a.modes = [m for m in a.modes.split(",") if m]
    if a.runs < 1 or a.max_ranks < 3 or any(m not in ("ll", "ht") for m in a.modes):
        p.error("--runs >= 1, --max-ranks >= 3, --modes of ll and ht")
    rng = random.Random(a.seed)
    if a.plan_only:
        for k in range(1, a.runs + 1):
            print(k, *draw_plan(rng, k, a.max_ranks))
        return 0
    if not os.access(a.ep, os.X_OK):
        print(f"campaign: {a.ep} is not an executable ep (build it, or unpack the GPU bundle)", file=sys.stderr)
        return 2
    os.makedirs(a.out, exist_ok=True)
    print(f"campaign: {a.runs} runs, seed {a.seed}, results in {a.out}", file=sys.stderr)
    runs, deaths, agree = [], [], []
    for k in range(1, a.first + a.runs):
        if k < a.first:
            # The draws of the runs before, so that run k is the same run.
            draw_run(rng, k, a)
            continue
        run, drows, ag = run_one(a, k, rng, a.out)
        runs.append(run), deaths.extend(drows), agree.extend(ag)
        print(f"[{k}/{a.runs}] {'ok' if run['ok'] else 'FAILED'}: {run['mode']} {run['path']} plan {run['plan']} "
              f"(kills {run['plan_signal']}), unplanned {run['unplanned']}: exit {run['exit']}, "
              f"{run['deaths']} death(s), {run['unnamed']} unnamed, agree max {fmt(run['agree_max_ms'])} ms, "
              f"{run['seconds']} s", file=sys.stderr)
        # After every run: a campaign cut short keeps what it measured.
        write_tsv(os.path.join(a.out, "campaign.tsv"), runs)
        write_tsv(os.path.join(a.out, "deaths.tsv"), deaths)
        text = summary(runs, deaths, agree, a)
        open(os.path.join(a.out, "summary.md"), "w").write(text)
    print(text)
    plot(a.out, deaths, agree)
    return 0 if all(r["ok"] for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
