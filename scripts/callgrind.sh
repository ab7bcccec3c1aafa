#!/usr/bin/env bash
# callgrind.sh: counts the instructions per operation that BENCHMARKS.md
# reports, with valgrind's callgrind, which counts the same on a busy
# machine as on an idle one.
#
# Usage: scripts/callgrind.sh [WHAT...]
#   WHAT: pair (a cached 1 MiB alloc+free), pair-phases (the same with
#   blocks counted by phase), mixed (the allocator alone on
#   random_mixed), cs336 (the allocator alone on the cs336 step), replay
#   (`gpumem replay` of plain random_mixed, parsing included), replay-cs336.
#   Default: pair mixed cs336 replay.
#
# Method: Go binaries built with CGO_ENABLED=0 and run with GOMAXPROCS=1
# GODEBUG=asyncpreemptoff=1 GOGC=off (callgrind aborts on Go's preemption
# signal otherwise). Each figure is the difference between two runs that
# differ only in the number of repetitions, divided by the number of
# operations in the difference, so that start-up, trace loading and the
# benchmark's set-up cancel out.
set -euo pipefail
cd "$(dirname "$0")/.."
what=("$@")
[ ${#what[@]} -eq 0 ] && what=(pair mixed cs336 replay)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export CGO_ENABLED=0 GOMAXPROCS=1 GODEBUG=asyncpreemptoff=1 GOGC=off

go test -c -o "$tmp/allocator.test" ./allocator
go build -o "$tmp/gpumem" ./cmd/gpumem

# ir CMD...: instructions executed by CMD.
ir() {
	valgrind --tool=callgrind --callgrind-out-file=/dev/null "$@" 2>&1 >/dev/null |
		sed -n 's/.*Collected : \([0-9]*\).*/\1/p'
}

# bench NAME N1 N2 OPS_PER_ITERATION: instructions per op of a benchmark
# run for N1 and then N2 iterations.
bench() {
	local a b
	a=$(cd allocator && ir "$tmp/allocator.test" -test.run='^$' -test.bench="^$1\$" -test.benchtime="$2x")
	b=$(cd allocator && ir "$tmp/allocator.test" -test.run='^$' -test.bench="^$1\$" -test.benchtime="$3x")
	echo "scale=1; ($b - $a) / (($3 - $2) * $4)" | bc
}

ops() { zcat -f "$1" | grep -c '^[afrsSctm]'; }

# replay TRACE: instructions per op of `gpumem replay --json` of the plain
# trace, replayed once and three times in one run.
replay() {
	zcat -f "$1" >"$tmp/plain.trace"
	local n a b
	n=$(ops "$tmp/plain.trace")
	a=$(ir "$tmp/gpumem" replay --json "$tmp/plain.trace")
	b=$(ir "$tmp/gpumem" replay --json "$tmp/plain.trace" "$tmp/plain.trace" "$tmp/plain.trace")
	echo "scale=1; ($b - $a) / (2 * $n)" | bc
}

mixed=trace/replay/testdata/pytorch/random_mixed.trace.gz
cs336=trace/replay/testdata/pytorch/pub_cs336_MAGMA27_lm_fwdbwd.trace.gz
for w in "${what[@]}"; do
	case $w in
	pair) echo "cached alloc+free pair (BenchmarkAllocFreeCached): $(bench BenchmarkAllocFreeCached 100000 500000 1) instructions per pair" ;;
	pair-phases) echo "cached pair, phases counted (BenchmarkAllocFreeCachedPhases): $(bench BenchmarkAllocFreeCachedPhases 100000 500000 1) instructions per pair" ;;
	mixed) echo "allocator on random_mixed (BenchmarkReplayRandomMixed): $(bench BenchmarkReplayRandomMixed 1 3 "$(ops $mixed)") instructions per op" ;;
	cs336) echo "allocator on cs336 (BenchmarkReplayTransformerStep): $(bench BenchmarkReplayTransformerStep 20 100 "$(ops $cs336)") instructions per op" ;;
	replay) echo "gpumem replay of plain random_mixed: $(replay $mixed) instructions per op" ;;
	replay-cs336) echo "gpumem replay of plain cs336: $(replay $cs336) instructions per op" ;;
	*) echo "unknown: $w" >&2; exit 2 ;;
	esac
done
