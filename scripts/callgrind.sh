#!/usr/bin/env bash
# callgrind.sh: counts the instructions per operation that BENCHMARKS.md
# reports, with valgrind's callgrind, which counts the same on a busy
# machine as on an idle one.
#
# Usage: scripts/callgrind.sh [WHAT...]
#   WHAT: pair (a cached 1 MiB alloc+free), pair-phases (the same with
#   blocks counted by phase), streams-pair (BenchmarkStreamsScaling's
#   pair with one goroutine on one stream, and with two goroutines on two
#   streams, which GOMAXPROCS=1 runs in turns: what a pair costs once a
#   second stream has a shard), mixed (the allocator alone on
#   random_mixed), cs336 (the allocator alone on the cs336 step), replay
#   (`gpumem replay` of plain random_mixed, parsing included), replay-cs336,
#   streams (the allocator alone on BenchmarkReplayStreams' trace: 10
#   streams, GiB segments made and released as it runs), offload
#   (`gpumem replay` of trace/replay/testdata/offload10.trace.gz, parsing
#   included: 10 streams, frees across streams, GiB KV blocks; see
#   offloadTrace in trace/replay/offload_test.go), libgpumem (the
#   cached 1 MiB pair through the C library, side by side with the same
#   pair through the Go API), policy (random_mixed through replay.Run
#   under the faithful default, gpumem_policy:low_fragmentation and
#   gpumem_policy:planned, BenchmarkPolicyReplay: instructions per op of
#   each and each policy's as a multiple of the default's), policy-steps
#   (bert_b2_x20, BERT's last step repeated to 20 steps, through
#   replay.Run under the faithful default and gpumem_policy:planned, the
#   third step planned and the rest served: instructions per replay, 1
#   and 11 replays, and planned's as a multiple of the default's),
#   policy-batches (BERT's training steps at batches 2, 4 and 8, the
#   batch changing every step, over 20 and 100 steps, BenchmarkPolicyBatches,
#   under the faithful default and gpumem_policy:planned, whose plans of
#   the steps' envelope a long run amortizes: millions of instructions per
#   replay, 1 and 5 replays, and planned's as a multiple of the default's),
#   policy-train-eval (bert_train_eval, BERT's training step with four
#   evaluation steps before every six training steps, through replay.Run
#   under the faithful default and gpumem_policy:planned, whose plans are
#   kept and taken up again: millions of instructions per replay, 1 and 6
#   replays, and planned's as a multiple of the default's),
#   policy-all (every trace of BenchmarkPolicyReplay, the twelve of
#   POLICY.md's results table, under the faithful default,
#   low_fragmentation and planned: millions of instructions per replay,
#   1 and 11 replays, 1 and 3 for the traces of many steps, 1 and 2 for
#   random_mixed and offload, and each policy's as a multiple of the
#   default's; slow: some ten minutes),
#   policy-synthetic (offload, kv_legacy and kv_dynamic, the synthetic
#   step-marked traces: offload's compute steps repeat and are planned,
#   the KV traces' never repeat; through replay.Run under each mode
#   of BenchmarkPolicyReplay: millions of instructions per replay, 1 and
#   3 replays, and each mode's as a multiple of the default's), live
#   (BenchmarkLiveBlocks at 1k and 1M live blocks: instructions and
#   last-level cache misses per op, with callgrind's cache simulation of
#   an 8 MiB, 16-way last level, 2,000 and 50,000 iterations: the set-up
#   and the Go heap's sampling move the counts by thousands of
#   instructions between runs, which 48,000 ops divide down; slow: the
#   1M set-up runs twice under the simulation).
#   Default: pair mixed cs336 streams replay offload.
#
# GPUMEM_CALLGRIND_OWN=1 counts, in every figure but live's, only the
# instructions of the functions outside the Go runtime (runtime.*,
# internal/runtime/...): with GOGC=off the heap only grows, and the page
# allocator's search for each run's new spans moves a replay's total by
# up to 1 M instructions between runs of one build, where the rest agrees
# to 0.01 %. Then a change's own instructions show, but not what it costs
# in the Go runtime (allocations, copies, growth of slices): give both.
#
# The command is built as `go install` builds it, with its profile
# (cmd/gpumem/default.pgo, scripts/pgo.sh); GOFLAGS=-pgo=off gives its
# figures without. The test binaries have no profile.
#
# Method: Go binaries built with CGO_ENABLED=0 and run with GOMAXPROCS=1
# GODEBUG=asyncpreemptoff=1 GOGC=off (callgrind aborts on Go's preemption
# signal otherwise). Each figure is the difference between two runs that
# differ only in the number of repetitions, divided by the number of
# operations in the difference, so that start-up, trace loading and the
# benchmark's set-up cancel out.
#
# libgpumem needs cgo (a C library is a cgo build), the CUDA headers and the
# stub driver that scripts/ci-cuda.sh caches (run it once first): the
# library is built with -buildmode=c-shared -tags cuda, the program
# cmd/libgpumem/ctest/pair.c calls gpumem_malloc+gpumem_free N times on the
# stub driver (the cached path never reaches the driver), and the Go
# figures beside it (the allocator's pair, and the pair through the
# library's Go layer, package capi) are measured with CGO_ENABLED=1 too.
set -euo pipefail
cd "$(dirname "$0")/.."
what=("$@")
[ ${#what[@]} -eq 0 ] && what=(pair mixed cs336 streams replay offload)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export CGO_ENABLED=0 GOMAXPROCS=1 GODEBUG=asyncpreemptoff=1 GOGC=off

if [[ " ${what[*]} " != " libgpumem " ]]; then
	go test -c -o "$tmp/allocator.test" ./allocator
	go build -o "$tmp/gpumem" ./cmd/gpumem
fi

# ir CMD...: instructions executed by CMD; with GPUMEM_CALLGRIND_OWN=1,
# those of the functions outside the Go runtime only (see the header).
ir() {
	if [ "${GPUMEM_CALLGRIND_OWN:-}" = 1 ]; then
		valgrind --tool=callgrind --callgrind-out-file="$tmp/ir.out" "$@" >/dev/null 2>&1
		callgrind_annotate --auto=no --threshold=100 "$tmp/ir.out" | awk '
			/PROGRAM TOTALS/ || !/^ *[0-9,]+ \( *[0-9.]+%\) / { next }
			{
				n = $1; gsub(",", "", n)
				f = $0; sub(/^ *[0-9,]+ \( *[0-9.]+%\) +/, "", f); sub(/ .*/, "", f); sub(/^[^:]*:/, "", f)
			}
			f ~ /^(runtime\.|internal\/runtime\/|runtime\/internal\/)/ { next }
			{ t += n }
			END { printf "%.0f\n", t }'
		return
	fi
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

# misses NAME N1 N2: instructions and last-level cache misses (data reads,
# data writes) per op of a benchmark run for N1 and then N2 iterations,
# under a simulated 8 MiB, 16-way last-level cache with 64-byte lines.
# Collected's fields: Ir Dr Dw I1mr D1mr D1mw ILmr DLmr DLmw.
misses() {
	local a b
	a=$(cd allocator && sim "$tmp/allocator.test" -test.run='^$' -test.bench="^$1\$" -test.benchtime="$2x")
	b=$(cd allocator && sim "$tmp/allocator.test" -test.run='^$' -test.bench="^$1\$" -test.benchtime="$3x")
	echo "$a $b" | awk -v n=$(($3 - $2)) '{
		printf "%.1f instructions, %.2f last-level misses (%.2f reads, %.2f writes) per op\n",
			($10 - $1) / n, ($17 + $18 - $8 - $9) / n, ($17 - $8) / n, ($18 - $9) / n }'
}

# sim CMD...: callgrind's Collected counts of CMD with the cache simulated.
sim() {
	valgrind --tool=callgrind --cache-sim=yes --LL=8388608,16,64 --callgrind-out-file=/dev/null "$@" 2>&1 >/dev/null |
		sed -n 's/.*Collected : \([0-9 ]*\).*/\1/p'
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

# libgpumem_pairs: the C pair and its Go counterparts (see the header).
libgpumem_pairs() {
	local cache=${GPUMEM_CUDA_CACHE:-$HOME/.cache/gpumem-cuda}
	local sdk=$cache/sdk stub=$cache/stub
	[ -f "$sdk/include/cuda.h" ] && [ -e "$stub/libcuda.so.1" ] ||
		{ echo "callgrind: libgpumem needs scripts/ci-cuda.sh's cache in $cache (run it once)" >&2; exit 1; }
	(
		export CGO_ENABLED=1 CGO_CFLAGS="-O2 -g -I$sdk/include" CGO_LDFLAGS="-L$sdk/lib"
		go build -buildmode=c-shared -tags cuda -o "$tmp/lib/libgpumem.so" ./cmd/libgpumem
		go test -c -o "$tmp/allocator.test" ./allocator
		go test -c -o "$tmp/capi.test" ./cmd/libgpumem/internal/capi
	)
	gcc -O2 -Wall -I"$tmp/lib" -I"$sdk/include" -o "$tmp/pair" cmd/libgpumem/ctest/pair.c \
		-L"$tmp/lib" -L"$sdk/lib" -lgpumem -lcuda
	local mode a b
	echo "Go API, allocator.Alloc+Free (BenchmarkAllocFreeCached, cgo build): $(bench BenchmarkAllocFreeCached 100000 500000 1) instructions per pair"
	for mode in default-stream adopted-stream; do
		a=$(ir "$tmp/capi.test" -test.run='^$' -test.bench="^BenchmarkMallocFree/$mode\$" -test.benchtime=100000x)
		b=$(ir "$tmp/capi.test" -test.run='^$' -test.bench="^BenchmarkMallocFree/$mode\$" -test.benchtime=500000x)
		echo "library's Go layer, capi Malloc+Free, $mode: $(echo "scale=1; ($b - $a) / 400000" | bc) instructions per pair"
	done
	for mode in default stream; do
		a=$(LD_LIBRARY_PATH=$stub:$tmp/lib ir "$tmp/pair" 10000 $mode)
		b=$(LD_LIBRARY_PATH=$stub:$tmp/lib ir "$tmp/pair" 50000 $mode)
		echo "C, gpumem_malloc+gpumem_free, $([ $mode = default ] && echo default || echo adopted) stream: $(echo "scale=1; ($b - $a) / 40000" | bc) instructions per pair"
	done
}

# policy_modes TRACE K MODE...: BenchmarkPolicyReplay of TRACE under the
# faithful default and each MODE, 1 and K replays: millions of
# instructions per replay and each MODE's as a multiple of the default's.
# The trace's name is anchored (bert_b2 alone selects bert_b2_x20 too),
# and the ratios come from whole counts: rounded to a tenth of a million,
# a small trace's ratio moves by a hundredth.
policy_modes() {
	local t=$1 k=$2 d p m line
	shift 2
	d=$(bench "BenchmarkPolicyReplay/^$t\$/faithful_default" 1 "$k" 1)
	line="$t through replay.Run, M instructions per replay: faithful default $(echo "scale=2; $d / 1000000" | bc)"
	for m in "$@"; do
		p=$(bench "BenchmarkPolicyReplay/^$t\$/$m" 1 "$k" 1)
		line+=", $m $(echo "scale=2; $p / 1000000" | bc) ($(echo "scale=3; $p / $d" | bc) x)"
	done
	echo "$line"
}

mixed=trace/replay/testdata/pytorch/random_mixed.trace.gz
cs336=trace/replay/testdata/pytorch/pub_cs336_MAGMA27_lm_fwdbwd.trace.gz
offload=trace/replay/testdata/offload10.trace.gz
for w in "${what[@]}"; do
	case $w in
	pair) echo "cached alloc+free pair (BenchmarkAllocFreeCached): $(bench BenchmarkAllocFreeCached 100000 500000 1) instructions per pair" ;;
	streams-pair)
		g1=$(bench 'BenchmarkStreamsScaling/goroutines=1' 100000 500000 1)
		g2=$(bench 'BenchmarkStreamsScaling/goroutines=2' 100000 500000 1)
		echo "cached 1 MiB pair, one stream (BenchmarkStreamsScaling/goroutines=1): $g1; two goroutines on two streams, run one after the other: $g2 instructions per pair ($(echo "scale=3; $g2 / $g1" | bc) x; two cores at full speed give at most $(echo "scale=2; 2 * $g1 / $g2" | bc) x the pairs of one)"
		;;
	pair-phases) echo "cached pair, phases counted (BenchmarkAllocFreeCachedPhases): $(bench BenchmarkAllocFreeCachedPhases 100000 500000 1) instructions per pair" ;;
	mixed) echo "allocator on random_mixed (BenchmarkReplayRandomMixed): $(bench BenchmarkReplayRandomMixed 1 3 "$(ops $mixed)") instructions per op" ;;
	cs336) echo "allocator on cs336 (BenchmarkReplayTransformerStep): $(bench BenchmarkReplayTransformerStep 20 100 "$(ops $cs336)") instructions per op" ;;
	replay) echo "gpumem replay of plain random_mixed: $(replay $mixed) instructions per op" ;;
	# 20000: streamsOps in allocator/bench_live_test.go.
	streams) echo "allocator on 10 streams, GiB segments (BenchmarkReplayStreams): $(bench BenchmarkReplayStreams 2 6 20000) instructions per op" ;;
	libgpumem) libgpumem_pairs ;;
	policy)
		n=$(ops $mixed)
		d=$(bench BenchmarkPolicyReplay/random_mixed/faithful_default 1 3 "$n")
		for m in low_fragmentation planned; do
			p=$(bench "BenchmarkPolicyReplay/random_mixed/$m" 1 3 "$n")
			echo "random_mixed through replay.Run, $m: $p instructions per op, $(echo "scale=3; $p / $d" | bc) x the faithful default's $d"
		done
		;;
	policy-steps)
		d=$(bench BenchmarkPolicyReplay/bert_b2_x20/faithful_default 1 11 1)
		p=$(bench BenchmarkPolicyReplay/bert_b2_x20/planned 1 11 1)
		echo "bert_b2_x20 through replay.Run: the faithful default $d, planned $p instructions per replay ($(echo "scale=3; $p / $d" | bc) x)"
		;;
	policy-batches)
		for s in 20 100; do
			d=$(bench "BenchmarkPolicyBatches/steps=$s/faithful_default" 1 5 1000000)
			p=$(bench "BenchmarkPolicyBatches/steps=$s/planned" 1 5 1000000)
			echo "BERT at batches that change every step, $s steps: the faithful default $d, planned $p M instructions per replay ($(echo "scale=3; $p / $d" | bc) x)"
		done
		;;
	policy-train-eval)
		d=$(bench BenchmarkPolicyReplay/bert_train_eval/faithful_default 1 6 1000000)
		p=$(bench BenchmarkPolicyReplay/bert_train_eval/planned 1 6 1000000)
		echo "bert_train_eval through replay.Run: the faithful default $d, planned $p M instructions per replay ($(echo "scale=3; $p / $d" | bc) x)"
		;;
	policy-synthetic)
		for t in offload kv_legacy kv_dynamic; do
			policy_modes $t 3 faithful_expandable low_fragmentation planned
		done
		;;
	policy-all)
		# Every trace of BenchmarkPolicyReplay; the large ones replayed
		# fewer times.
		for t in random_mixed cs336 bert_b2 bert_b4 bert_b8 eor_cnn bert_b2_x20 bert_batches bert_train_eval offload kv_legacy kv_dynamic; do
			k=11
			case $t in
			random_mixed | offload) k=2 ;;
			bert_b2_x20 | bert_batches | bert_train_eval | kv_*) k=3 ;;
			esac
			policy_modes $t $k low_fragmentation planned
		done
		;;
	live)
		for n in 1k 1M; do
			echo "BenchmarkLiveBlocks/live=$n: $(misses "BenchmarkLiveBlocks/live=$n" 2000 50000)"
		done
		;;
	replay-cs336) echo "gpumem replay of plain cs336: $(replay $cs336) instructions per op" ;;
	offload) echo "gpumem replay of the 10-stream offload trace: $(replay $offload) instructions per op" ;;
	*) echo "unknown: $w" >&2; exit 2 ;;
	esac
done
