#!/usr/bin/env bash
# gpu-check.sh: runs the CUDA backend's GPU tests and benchmarks on a machine
# with an NVIDIA GPU and prints the figures; then the C library's test
# program (cmd/libgpumem/ctest) and the adapters' tests (adapters/*, tag
# cuda) on the same GPU.
#
# Usage:
#   scripts/gpu-check.sh build DIR   build the test binary into DIR (needs Go,
#                                    gcc and the CUDA headers and libcuda.so
#                                    that scripts/ci-cuda.sh caches)
#   scripts/gpu-check.sh run DIR     run the binary in DIR (needs only the
#                                    NVIDIA driver: libcuda.so.1 and a GPU;
#                                    no Go toolchain, no network)
#   scripts/gpu-check.sh             both, in a temporary folder
#
# DIR can be copied from the build machine to the GPU machine: it holds the
# test binaries (linked against libcuda.so.1 by name), libgpumem.so and its
# header, the C test program, and a copy of this script. Environment: GPUMEM_CUDA_CACHE as for ci-cuda.sh; GPUMEM_BENCHTIME
# (default 2s) for the benchmarks.
set -euo pipefail

die() { echo "gpu-check: error: $*" >&2; exit 1; }
note() { echo "gpu-check: $*" >&2; }

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

build() {
	local dir=$1
	local root
	root=$(cd "$here/.." && pwd)
	[ -f "$root/go.mod" ] || die "build must run from the repository's scripts/ folder"
	command -v go >/dev/null || die "go not found on PATH (build needs Go; run needs only the driver)"
	local cache=${GPUMEM_CUDA_CACHE:-${HOME:?HOME is not set}/.cache/gpumem-cuda}
	local sdk=$cache/sdk
	if [ ! -f "$sdk/include/cuda.h" ] || [ ! -e "$sdk/lib/libcuda.so" ]; then
		note "fetching the CUDA headers and libcuda.so with scripts/ci-cuda.sh"
		bash "$root/scripts/ci-cuda.sh" fetch
	fi
	mkdir -p "$dir"
	note "building $dir/cuda.test"
	(cd "$root" && CGO_ENABLED=1 CGO_CFLAGS="-O2 -g -I$sdk/include" CGO_LDFLAGS="-L$sdk/lib" \
		go test -c -tags cuda -o "$dir/cuda.test" ./device/cuda) || die "building the test binary failed"
	if command -v readelf >/dev/null; then
		local needed
		needed=$(readelf -d "$dir/cuda.test" | sed -n 's/.*(NEEDED).*\[\(.*cuda.*\)\]/\1/p')
		[ "$needed" = libcuda.so.1 ] || die "the binary needs '$needed', want libcuda.so.1 by name"
		if readelf -d "$dir/cuda.test" | grep -Eq '\((RPATH|RUNPATH)\)'; then
			die "the binary carries an RPATH/RUNPATH; it must find libcuda.so.1 through the system"
		fi
	fi
	note "building $dir/libgpumem.so and the C test program"
	(cd "$root" && CGO_ENABLED=1 CGO_CFLAGS="-O2 -g -I$sdk/include" CGO_LDFLAGS="-L$sdk/lib" \
		go build -buildmode=c-shared -tags cuda -o "$dir/libgpumem.so" ./cmd/libgpumem) ||
		die "building libgpumem.so failed"
	gcc -O1 -g -Wall -I"$dir" -I"$sdk/include" -o "$dir/ctest" "$root/cmd/libgpumem/ctest/ctest.c" \
		-L"$dir" -L"$sdk/lib" -lgpumem -lcuda -lpthread -ldl || die "building the C test program failed"
	local m name
	for m in "$root"/adapters/*/go.mod; do
		m=$(dirname "$m")
		name=adapter-$(basename "$m").test
		note "building $dir/$name"
		(cd "$m" && CGO_ENABLED=1 CGO_CFLAGS="-O2 -g -I$sdk/include" CGO_LDFLAGS="-L$sdk/lib" \
			go test -c -tags cuda -o "$dir/$name" .) || die "building the adapter tests of $m failed"
	done
	cp "$here/gpu-check.sh" "$dir/gpu-check.sh"
	note "built; copy $dir to the GPU machine and run: $dir/gpu-check.sh run $dir"
}

run() {
	local dir
	dir=$(cd "$1" && pwd)
	[ -x "$dir/cuda.test" ] || die "$dir/cuda.test not found (run: gpu-check.sh build $1)"
	if command -v ldconfig >/dev/null && ! ldconfig -p | grep -q 'libcuda\.so\.1 ' && [ -z "${LD_LIBRARY_PATH:-}" ]; then
		die "libcuda.so.1 not found: install the NVIDIA driver"
	fi
	local out=$dir/gpu-check.log
	note "running GPU tests and benchmarks (log: $out)"
	set +e
	(cd "$dir" && ./cuda.test -test.count=1 -test.v -test.run '^(TestGPU|Example)' \
		-test.bench '^BenchmarkGPU' -test.benchtime "${GPUMEM_BENCHTIME:-2s}" -test.benchmem) 2>&1 | tee "$out"
	local rc=${PIPESTATUS[0]}
	set -e
	if grep -q -- '--- SKIP: TestGPU' "$out"; then
		grep -m1 -B1 -- '--- SKIP: TestGPU' "$out" | head -1 >&2
		die "GPU tests were skipped: no usable GPU (or the stub driver is on LD_LIBRARY_PATH)"
	fi
	[ "$rc" = 0 ] || die "GPU tests failed (exit $rc)"
	echo
	echo "== figures =="
	grep -E '^BenchmarkGPU' "$out" || true
	awk '
		/^BenchmarkGPUDeviceMallocFree/ { for (i = 1; i < NF; i++) if ($(i+1) == "ns/op") raw = $i }
		/^BenchmarkGPUAllocatorCached/  { for (i = 1; i < NF; i++) if ($(i+1) == "ns/op") cached = $i }
		END {
			if (raw > 0 && cached > 0)
				printf "cuMemAlloc+cuMemFree 1 MiB: %.0f ns; allocator cached Alloc+Free: %.0f ns; %.0fx faster\n", raw, cached, raw / cached
		}' "$out"
	note "C library test program on the GPU"
	(cd "$dir" && LD_LIBRARY_PATH=$dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} ./ctest) ||
		die "the C test program failed on the GPU"
	local t
	for t in "$dir"/adapter-*.test; do
		[ -x "$t" ] || continue
		note "$(basename "$t") on the GPU"
		(cd "$dir" && "$t" -test.count=1 -test.v -test.run '^TestCUDA') 2>&1 | tee -a "$out" ||
			die "$(basename "$t") failed on the GPU"
		grep -q -- '--- SKIP: TestCUDA' "$out" && die "$(basename "$t"): the CUDA tests were skipped"
	done
	note "ok"
}

case "${1:-}" in
build)
	[ $# = 2 ] || die "usage: gpu-check.sh build DIR"
	build "$2"
	;;
run)
	[ $# = 2 ] || die "usage: gpu-check.sh run DIR"
	run "$2"
	;;
"")
	tmp=$(mktemp -d)
	trap 'rm -rf "$tmp"' EXIT
	build "$tmp"
	run "$tmp"
	;;
*)
	die "usage: gpu-check.sh [build DIR | run DIR]"
	;;
esac
