#!/usr/bin/env bash
# coll2's second GPU call: bench.sh again (today's main beside this branch,
# now with the peer pointers looked up once), then scripts/run_collectives.sh
# from this branch (--max auto: up to 1 GiB, stream and graph) at 3 ranks.
set -uo pipefail
D=$(cd "$(dirname "$0")" && pwd)
bash "$D/bench.sh" > /dev/null 2>&1
mkdir -p /tmp/after2 && tar -C /tmp/after2 -xJf "$D/after.tar.xz"
L=$OUT/logs/matrix; mkdir -p "$L"
timeout 330 "$D/scripts/run_collectives.sh" --bin /tmp/after2/bin --nixl-lib /tmp/after2/nixl/.nixl_cu13.mesonpy.libs \
  --out "$L" --ranks 3 --no-torchrun > "$L/driver.log" 2>&1
echo "run_collectives exit $?" >> "$L/driver.log"
python3 "$D/scripts/plot_collectives.py" "$OUT/logs/small-3r.png" "$OUT"/logs/before-3r.json "$OUT"/logs/after-3r-stream.json \
  "$OUT"/logs/after-3r-graph.json > "$OUT/logs/plot.log" 2>&1
python3 "$D/scripts/plot_collectives.py" "$OUT/logs/matrix-3r.png" "$L"/coll-3r1g-mps.json "$L"/coll-3r1g-mps-graph.json \
  >> "$OUT/logs/plot.log" 2>&1
rm -f "$OUT/coll2-logs.tgz"; tar -C "$OUT" -czf /tmp/coll2-logs2.tgz logs && rm -rf "$OUT/logs" && mv /tmp/coll2-logs2.tgz "$OUT/"
cat "$L/driver.log"
