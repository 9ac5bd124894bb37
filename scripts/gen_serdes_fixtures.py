"""Writes tests/fixtures/serdes/*.bin: descriptor lists serialized by the
real NIXL library (the nixl-cu13 wheel's Python bindings: the pickled state
of an nixlXferDList is exactly nixlSerDes bytes), and prints a line per file.

    .venv/bin/python scripts/gen_serdes_fixtures.py [--stdout]

--stdout prints name<TAB>hex per case instead of writing the files.
tests/serdes.rs decodes each file, re-encodes it with our codec and
compares byte for byte; with the bindings present it also checks live.
The case list is shared with that test through tests/fixtures/serdes/cases.txt.
"""
import os
import sys

# Arguments before the bindings: --help and a bad call need no NIXL.
if sys.argv[1:2] in (["-h"], ["--help"]):
    print(__doc__)
    sys.exit(0)
if sys.argv[1:] not in ([], ["--stdout"]):
    print("usage: gen_serdes_fixtures.py [--stdout] (try --help)", file=sys.stderr)
    sys.exit(2)

import nixl_cu13._bindings as b  # noqa: E402

here = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "serdes")
segs = {"DRAM": b.DRAM_SEG, "VRAM": b.VRAM_SEG, "BLK": b.BLK_SEG, "OBJ": b.OBJ_SEG, "FILE": b.FILE_SEG}

def cases():
    for line in open(os.path.join(here, "cases.txt")):
        line = line.split("#")[0].strip()
        if not line:
            continue
        name, seg, *descs = line.split()
        yield name, seg, [tuple(int(x, 0) for x in d.split(",")) for d in descs]

def serialize(seg, descs):
    return b.nixlXferDList(segs[seg], descs).__getstate__()

if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--stdout":
        # name<TAB>hex per case, for the live comparison in tests/serdes.rs
        for name, seg, descs in cases():
            print(f"{name}\t{serialize(seg, descs).hex()}")
        sys.exit(0)
    for name, seg, descs in cases():
        data = serialize(seg, descs)
        with open(os.path.join(here, name + ".bin"), "wb") as f:
            f.write(data)
        print(f"{name}: {len(data)} bytes")
