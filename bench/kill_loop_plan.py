#!/usr/bin/env python3
"""Writes an elastic plan (upstream NIXL EP's JSON format) for a kill/rejoin
loop: phase 0 runs ranks 0..N-1; each cycle then kills one rank (1, 2, ...,
N-1 in turn; never rank 0, as -0 is 0 in JSON) in one phase and starts it
again in the next. The same plan as `Plan::kill_loop` in src/ranks/plan.rs.

    bench/kill_loop_plan.py --ranks 4 --cycles 20 > kill_loop.json
    ep --plan kill_loop.json --mode ll
"""

import argparse
import json
import sys


def kill_loop(ranks: int, cycles: int) -> list:
    everyone = list(range(ranks))
    plan = [everyone]
    for c in range(cycles):
        victim = 1 + c % (ranks - 1)
        plan.append([-r if r == victim else r for r in everyone])
        plan.append(everyone)
    return plan


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, default=4, help="ranks (2..64) [default: 4]")
    p.add_argument("--cycles", type=int, default=20, help="kill/rejoin cycles [default: 20]")
    a = p.parse_args()
    if not 2 <= a.ranks <= 64 or a.cycles < 0:
        print("error: --ranks must be 2..64 and --cycles >= 0", file=sys.stderr)
        return 2
    print(json.dumps(kill_loop(a.ranks, a.cycles), separators=(",", ":")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
