#!/usr/bin/env bash
# pgo.sh: writes cmd/gpumem/default.pgo, the CPU profile that builds of
# the gpumem command apply. Go's default -pgo=auto reads a main package's
# default.pgo in `go build`, `go install` and `go run`, and guides the
# whole program's inlining and devirtualization by it; a package imported
# by another program is built by that program's profile, not this one.
#
# The profile is of TestProfileWorkload (cmd/gpumem/pgo_test.go): replays
# of the shared traces, as users run them. Run this after a change that
# moves the replay's hot paths; a stale profile loses some of the gain,
# never correctness. BENCHMARKS.md gives the figures with and without it
# (scripts/callgrind.sh measures the built command, so with it).
#
# Usage: scripts/pgo.sh
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# The workload's build ignores the profile in place, so that the new one
# does not depend on the old.
go test -c -pgo=off -o "$tmp/gpumem.test" ./cmd/gpumem ||
	{ echo "pgo: building the workload failed" >&2; exit 1; }
(cd cmd/gpumem && "$tmp/gpumem.test" -test.run '^TestProfileWorkload$' -test.count=1 \
	-pgo.workload -test.cpuprofile "$tmp/cpu.pprof" >"$tmp/out" 2>&1) ||
	{ echo "pgo: the workload failed: $(tail -1 "$tmp/out")" >&2; exit 1; }
cp "$tmp/cpu.pprof" cmd/gpumem/.default.pgo.tmp ||
	{ echo "pgo: writing cmd/gpumem/default.pgo failed" >&2; exit 1; }
mv cmd/gpumem/.default.pgo.tmp cmd/gpumem/default.pgo ||
	{ echo "pgo: writing cmd/gpumem/default.pgo failed" >&2; exit 1; }
echo "pgo: wrote cmd/gpumem/default.pgo ($(wc -c <cmd/gpumem/default.pgo) bytes)"
