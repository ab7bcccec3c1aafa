#!/usr/bin/env bash
# bench.sh: runs gpumem's benchmarks the way BENCHMARKS.md reports them and
# summarizes them with benchstat (golang.org/x/perf), plus the replay figures
# of `gpumem replay` on the test traces and on a generated hot loop.
#
# Usage: scripts/bench.sh [OUTDIR]   (default: a new temporary folder)
# Environment: COUNT (default 10), BENCHTIME (default 1s).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-$(mktemp -d)}
mkdir -p "$out"
count=${COUNT:-10}
benchtime=${BENCHTIME:-1s}

go install golang.org/x/perf/cmd/benchstat@v0.0.0-20260908200009-22c9c6c9d4da
benchstat=$(go env GOPATH)/bin/benchstat

echo "== go test -bench (count $count, benchtime $benchtime) -> $out/bench.txt"
go test -run '^$' -bench . -benchtime "$benchtime" -count "$count" \
	./allocator ./stats ./device/sim ./trace/... >"$out/bench.txt"
"$benchstat" "$out/bench.txt"

echo
echo "== gpumem replay (median of $count runs)"
go build -o "$out/gpumem" ./cmd/gpumem
python3 - "$out/hot.trace.gz" <<'PY'
import gzip, sys
with gzip.open(sys.argv[1], "wt") as f:
    f.write("# memtrace v1 hot loop: 1e6 x (alloc 1 MiB, free)\n")
    f.write("a 0 1048576\nf 0\n" * 1000000)
PY
for t in trace/replay/testdata/pytorch/random_mixed.trace.gz trace/testdata/pub_cs336_MAGMA27_lm_fwdbwd.trace.gz "$out/hot.trace.gz"; do
	for mode in "" --baseline; do
		for _ in $(seq "$count"); do
			"$out/gpumem" replay --json $mode "$t"
		done | python3 -c '
import json, statistics, sys
rs = [json.loads(l) for l in sys.stdin]
ns = statistics.median(r["ns_per_op"] for r in rs)
r = rs[0]
name = r["trace"].split("/")[-1]
mode = sys.argv[1] or "caching"
print("%-40s %-10s %8.1f ns/op  peak reserved %14d  device mallocs %7d  fragmentation %.3f" % (
    name, mode, ns, r["peak_reserved_bytes"], r["device_allocs"], r["fragmentation"]))
' "$mode"
	done
done
