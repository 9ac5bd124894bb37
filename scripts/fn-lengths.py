"""Lists Rust functions longer than a limit, longest first: how the
"functions fit on a screen" rule of the roles, binaries and examples is
checked. A function's length runs from its `fn` line to its closing brace
(braces in strings and comments are skipped well enough for this code).

    python3 scripts/fn-lengths.py [--max 80] [PATH ...]   (default: src/simple_write src/bin examples)
"""
import argparse
import pathlib
import re

FN = re.compile(r"^\s*(pub(\([^)]*\))?\s+)?(const\s+)?(async\s+)?(unsafe\s+)?fn\s+(\w+)")


def functions(path):
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        m = FN.match(lines[i])
        if not m:
            i += 1
            continue
        depth, started, j = 0, False, i
        while j < len(lines):
            code = re.sub(r'"(\\.|[^"\\])*"|//.*', "", lines[j])
            depth += code.count("{") - code.count("}")
            started = started or "{" in code
            if started and depth <= 0:
                break
            if not started and code.rstrip().endswith(";"):
                break  # a declaration without a body
            j += 1
        if started:
            yield m.group(6), i + 1, j - i + 1
        i += 1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--max", type=int, default=80)
    ap.add_argument("paths", nargs="*", default=["src/simple_write", "src/bin", "examples"])
    a = ap.parse_args()
    found = []
    for p in a.paths:
        for f in sorted(pathlib.Path(p).rglob("*.rs")) if pathlib.Path(p).is_dir() else [pathlib.Path(p)]:
            found += [(n, f, name, line) for name, line, n in functions(f)]
    found.sort(reverse=True)
    longest = found[0] if found else None
    over = [x for x in found if x[0] > a.max]
    for n, f, name, line in over:
        print(f"{n:5}  {f}:{line}  {name}")
    if longest:
        print(f"{len(found)} functions; longest {longest[0]} lines ({longest[2]} in {longest[1]}); {len(over)} over {a.max}")
    return 1 if over else 0


if __name__ == "__main__":
    raise SystemExit(main())
