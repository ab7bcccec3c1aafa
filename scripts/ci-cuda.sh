#!/usr/bin/env bash
# ci-cuda.sh: compiles, vets and tests the CUDA backend (build tag cuda) on a
# machine without a GPU.
#
# The CUDA headers (Debian's nvidia-cuda-dev) and the driver library to link
# against (Debian's libcuda1) are fetched with apt into a cache folder outside
# the repository, through a private apt configuration: the system's apt
# sources, lists and package state are never touched and nothing is
# installed. Only the headers and libcuda.so* are kept; a later run finds them
# and skips the download.
#
# The tests run against a stub driver
# (device/cuda/internal/cudastub/csrc/libcuda_stub.c) built here as
# libcuda.so.1 and put first on LD_LIBRARY_PATH, so the Go glue is exercised
# without a GPU. Tests that need a real device skip themselves.
#
# Environment:
#   GPUMEM_CUDA_CACHE     cache folder (default $HOME/.cache/gpumem-cuda)
#   GPUMEM_DEBIAN_MIRROR  Debian mirror to use (default: the one this
#                         machine's apt sources use for main, else
#                         http://deb.debian.org/debian)
#   GPUMEM_DEBIAN_SUITE   suite (default bookworm)
#
# Then it builds the C library (cmd/libgpumem, -buildmode=c-shared) with
# its header beside it into the cache folder, builds the C test program
# cmd/libgpumem/ctest/ctest.c against it, and runs it on the stub driver
# (PyTorch's pluggable-allocator calls from several threads on two streams,
# with the default configuration, with GPUMEM_ALLOC_CONF=
# gpumem_policy:low_fragmentation, and with a bad configuration).
#
# Usage: scripts/ci-cuda.sh [fetch|libgpumem]
#   fetch: only fill the cache; libgpumem: only the C library's build and
#   test (with the stub driver built first)
set -euo pipefail

die() { echo "ci-cuda: error: $*" >&2; exit 1; }
note() { echo "ci-cuda: $*" >&2; }

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cache=${GPUMEM_CUDA_CACHE:-${HOME:?HOME is not set}/.cache/gpumem-cuda}
suite=${GPUMEM_DEBIAN_SUITE:-bookworm}
sdk=$cache/sdk

case "$cache" in
"$root"|"$root"/*) die "GPUMEM_CUDA_CACHE ($cache) must be outside the repository" ;;
esac

# find_mirror prints the URI the system's apt sources use for Debian main.
find_mirror() {
	local f
	for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
		[ -r "$f" ] || continue
		# deb [options] URI suite components...
		awk -v s="$suite" '
			$1 == "deb" {
				i = 2
				if ($i ~ /^\[/) { while ($i !~ /\]$/) i++; i++ }
				if ($(i+1) == s) for (j = i + 2; j <= NF; j++) if ($j == "main") { print $i; exit }
			}' "$f"
	done
	for f in /etc/apt/sources.list.d/*.sources; do
		[ -r "$f" ] || continue
		# deb822 stanzas separated by blank lines.
		awk -v s="$suite" '
			function flush() {
				if (types ~ /(^| )deb( |$)/ && (" " suites " ") ~ (" " s " ") && (" " comps " ") ~ / main /) { split(uris, u, " "); print u[1]; found = 1 }
				types = uris = suites = comps = ""
			}
			/^[ \t]*$/ { flush(); if (found) exit; next }
			/^#/ { next }
			tolower($1) == "types:" { $1 = ""; types = $0 }
			tolower($1) == "uris:" { $1 = ""; uris = $0 }
			tolower($1) == "suites:" { $1 = ""; suites = $0 }
			tolower($1) == "components:" { $1 = ""; comps = $0 }
			END { if (!found) flush() }' "$f"
	done
}

fetch() {
	command -v apt-get >/dev/null || die "apt-get not found: this script needs a Debian-like system"
	command -v dpkg-deb >/dev/null || die "dpkg-deb not found"
	local mirror=${GPUMEM_DEBIAN_MIRROR:-}
	if [ -z "$mirror" ]; then
		mirror=$(find_mirror | sed -n 1p)
		mirror=${mirror:-http://deb.debian.org/debian}
	fi
	local keyring=/usr/share/keyrings/debian-archive-keyring.gpg
	[ -r "$keyring" ] || die "$keyring is missing (install debian-archive-keyring)"
	local arch
	arch=$(dpkg --print-architecture)

	local apt=$cache/apt
	rm -rf "$apt"
	mkdir -p "$apt/state/lists/partial" "$apt/cache/archives/partial" \
		"$apt/etc/sources.list.d" "$apt/etc/preferences.d" "$apt/etc/apt.conf.d" "$apt/debs"
	: >"$apt/state/status"
	echo "deb [signed-by=$keyring] $mirror $suite main contrib non-free non-free-firmware" >"$apt/etc/sources.list"
	local opts=(
		-o "Dir::State=$apt/state"
		-o "Dir::State::status=$apt/state/status"
		-o "Dir::Cache=$apt/cache"
		-o "Dir::Etc::SourceList=$apt/etc/sources.list"
		-o "Dir::Etc::SourceParts=$apt/etc/sources.list.d"
		-o "Dir::Etc::Preferences=$apt/etc/preferences"
		-o "Dir::Etc::PreferencesParts=$apt/etc/preferences.d"
		-o "APT::Architecture=$arch"
		-o "APT::Architectures=$arch"
		-o "Debug::NoLocking=1"
		-o "Acquire::Languages=none"
	)
	[ "$(id -u)" = 0 ] && opts+=(-o "APT::Sandbox::User=root")

	note "fetching nvidia-cuda-dev and libcuda1 from $mirror ($suite) into $cache"
	local t0=$SECONDS
	apt-get "${opts[@]}" -q update >&2 || die "apt-get update failed (mirror $mirror; set GPUMEM_DEBIAN_MIRROR)"
	(cd "$apt/debs" && apt-get "${opts[@]}" -q download nvidia-cuda-dev libcuda1) >&2 ||
		die "apt-get download of nvidia-cuda-dev libcuda1 failed"
	local fetch_s=$((SECONDS - t0))

	local x=$apt/x
	mkdir -p "$x"
	local deb
	for deb in "$apt"/debs/*.deb; do
		dpkg-deb -x "$deb" "$x" || die "cannot unpack $deb"
	done
	[ -f "$x/usr/include/cuda.h" ] || die "cuda.h not found in nvidia-cuda-dev"
	local libdir
	libdir=$(dirname "$(find "$x" -name 'libcuda.so.1' | sed -n 1p)")
	[ -n "$libdir" ] && [ "$libdir" != . ] || die "libcuda.so.1 not found in libcuda1"

	local tmp=$cache/sdk.new
	rm -rf "$tmp"
	mkdir -p "$tmp/lib"
	cp -a "$x/usr/include" "$tmp/include"
	cp -a "$libdir"/libcuda.so* "$tmp/lib/"
	[ -e "$tmp/lib/libcuda.so" ] || ln -s libcuda.so.1 "$tmp/lib/libcuda.so"
	(cd "$apt/debs" && ls *.deb) >"$tmp/PACKAGES"
	rm -rf "$sdk"
	mv "$tmp" "$sdk"
	rm -rf "$apt"
	note "apt fetch took ${fetch_s}s; cache holds $(du -sh "$sdk" | cut -f1) ($(tr '\n' ' ' <"$sdk/PACKAGES"))"
}

if [ -f "$sdk/include/cuda.h" ] && [ -e "$sdk/lib/libcuda.so" ]; then
	note "using cached headers and libcuda in $sdk ($(du -sh "$sdk" | cut -f1))"
else
	fetch
fi
[ "${1:-}" = fetch ] && exit 0

command -v go >/dev/null || die "go not found on PATH"
command -v gcc >/dev/null || die "gcc not found (cgo needs it)"

cd "$root"
export CGO_ENABLED=1
export CGO_CFLAGS="-O2 -g -I$sdk/include"
export CGO_LDFLAGS="-L$sdk/lib"

stub=$cache/stub
mkdir -p "$stub"
note "building the stub driver $stub/libcuda.so.1"
gcc -O1 -g -Wall -Werror -shared -fPIC -I"$sdk/include" -Wl,-soname,libcuda.so.1 \
	-o "$stub/libcuda.so.1" device/cuda/internal/cudastub/csrc/libcuda_stub.c -lpthread ||
	die "building the stub driver failed"

# libgpumem builds the C library and its header into $cache/libgpumem,
# checks that the header declares PyTorch's pluggable-allocator pair and the
# stats call with their exact signatures, and runs the C test program on
# the stub driver.
libgpumem() {
	local out=$cache/libgpumem
	rm -rf "$out"
	mkdir -p "$out"
	note "go build -buildmode=c-shared -tags cuda ./cmd/libgpumem"
	go build -buildmode=c-shared -tags cuda -o "$out/libgpumem.so" ./cmd/libgpumem ||
		die "building libgpumem.so failed"
	[ -f "$out/libgpumem.h" ] || die "libgpumem.h was not written beside libgpumem.so"
	local decl
	for decl in \
		'extern void* gpumem_malloc(ssize_t size, int device, cudaStream_t stream);' \
		'extern void gpumem_free(void* ptr, ssize_t size, int device, cudaStream_t stream);' \
		'extern size_t gpumem_memory_stats_json(int device, char* buf, size_t cap);' \
		'extern int gpumem_mark_step(int device, char* name);' \
		'extern size_t gpumem_plan_stats_json(int device, char* buf, size_t cap);'; do
		grep -qF "$decl" "$out/libgpumem.h" || die "libgpumem.h lacks: $decl"
	done
	note "building the C test program"
	gcc -O1 -g -Wall -Werror -I"$out" -I"$sdk/include" -o "$out/ctest" cmd/libgpumem/ctest/ctest.c \
		-L"$out" -L"$sdk/lib" -lgpumem -lcuda -lpthread -ldl || die "building the C test program failed"
	local lp=$stub:$out${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
	note "C test program (stub driver): default configuration"
	env -u GPUMEM_ALLOC_CONF -u PYTORCH_CUDA_ALLOC_CONF LD_LIBRARY_PATH="$lp" "$out/ctest" ||
		die "the C test program failed (default configuration)"
	note "C test program (stub driver): GPUMEM_ALLOC_CONF=gpumem_policy:low_fragmentation"
	GPUMEM_ALLOC_CONF=gpumem_policy:low_fragmentation LD_LIBRARY_PATH="$lp" "$out/ctest" ||
		die "the C test program failed (low_fragmentation)"
	note "C test program (stub driver): GPUMEM_ALLOC_CONF=gpumem_policy:planned"
	GPUMEM_ALLOC_CONF=gpumem_policy:planned LD_LIBRARY_PATH="$lp" "$out/ctest" ||
		die "the C test program failed (planned)"
	note "C test program (stub driver): a bad configuration"
	GPUMEM_ALLOC_CONF=no_such_key:1 LD_LIBRARY_PATH="$lp" "$out/ctest" badconf ||
		die "the C test program failed (bad configuration)"
}

if [ "${1:-}" = libgpumem ]; then
	libgpumem
	note "ok"
	exit 0
fi

note "go vet -tags cuda ./..."
go vet -tags cuda ./... || die "go vet -tags cuda failed"
note "go build -tags cuda ./..."
go build -tags cuda ./... || die "go build -tags cuda failed"

race=-race
[ "${GPUMEM_CI_NORACE:-}" = 1 ] && race=
note "go test -tags cuda $race (stub driver) ./device/cuda/..."
LD_LIBRARY_PATH=$stub${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} \
	go test -count=1 $race -tags cuda ./device/cuda/... ||
	die "stub-backed tests failed"
libgpumem
for m in adapters/*/go.mod; do
	m=$(dirname "$m")
	note "go test -tags cuda (stub driver) in $m"
	(cd "$m" && go vet -tags cuda ./... &&
		LD_LIBRARY_PATH=$stub${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} go test -count=1 -tags cuda ./...) ||
		die "the adapter $m failed with the cuda tag"
done
note "ok"
