"""What the Python scripts of bench/ share: their command line (--help
prints the script's docstring, a bad call exits 2 with its usage), sizes
written as people read them, Markdown tables and their cells, JSON that
may be gzipped, and matplotlib without a display. A script finds this
folder next to itself:

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
    import benchlib
"""
import gzip
import json
import sys


def args(doc, usage, least, most=None):
    """The script's arguments (sys.argv[1:]): `least` to `most` of them
    (None: no upper bound), none an option. --help or -h prints `doc` and
    exits 0; anything else that does not fit prints `usage` and exits 2.
    Called before matplotlib is imported, so neither needs it."""
    given = sys.argv[1:]
    if given[:1] in (["-h"], ["--help"]):
        print(doc)
        sys.exit(0)
    fits = len(given) >= least and (most is None or len(given) <= most)
    if not fits or any(a.startswith("-") for a in given):
        print(f"usage: {usage} (try --help)", file=sys.stderr)
        sys.exit(2)
    return given


def size(b):
    """`b` bytes in the largest binary unit that divides it: 4 KiB,
    32 MiB, 1 GiB, else 12345 B."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if b >= 1 << shift and b % (1 << shift) == 0:
            return f"{b >> shift} {unit}"
    return f"{b} B"


def num(x, fmt="{:.2f}"):
    """`x` formatted by `fmt`, or "-" where there is no value (None)."""
    return "-" if x is None else fmt.format(x)


def ratio(a, b):
    """a / b, or None where either is missing or b is 0."""
    return a / b if a is not None and b else None


def table(head, rows):
    """A Markdown table as a list of lines: the header `head` (cells),
    then one line per row of `rows` (any values, written with str)."""
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return out + ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]


def open_text(path, errors="strict"):
    """`path` opened for reading as text, gunzipped where it ends in .gz
    (the results folders keep their large JSON files gzipped)."""
    opener = gzip.open if path.endswith(".gz") else open
    return opener(path, "rt", errors=errors)


def load_json(path):
    """The JSON document in `path` (.json or .json.gz)."""
    with open_text(path) as f:
        return json.load(f)


def pyplot():
    """matplotlib.pyplot, drawing to files (the Agg backend: no display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_png(fig, path, dpi):
    """`fig` written to `path` as a PNG of at most 256 colours (line plots
    use a handful; a palette PNG is about a third of a full-colour one,
    which keeps docs/results under its cap)."""
    import io

    from PIL import Image

    buf = io.BytesIO()
    fig.savefig(buf, dpi=dpi, format="png")
    buf.seek(0)
    Image.open(buf).convert("RGB").quantize(colors=256).save(path, optimize=True)
