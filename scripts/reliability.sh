#!/usr/bin/env bash
# reliability.sh: measures the figures that RELIABILITY.md reports: the
# cases of the bad-input catalogue, the soaks at full length, and the peak
# resident memory (GNU time's "Maximum resident set size") of gpumem on a
# generated 20-million-op trace, on decompression bombs, and on the small
# inputs of the second round (self-referential and memo-expanded pickles,
# /dev/zero as a config, huge parameter counts, a long generation).
#
# Usage: scripts/reliability.sh [OUTDIR]   (default: a new temporary folder)
# Environment: SOAK=0 skips the full-length soaks (minutes); OPS sets the
# length of the generated trace (default 20000000).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-$(mktemp -d)}
mkdir -p "$out"
ops=${OPS:-20000000}
command -v /usr/bin/time >/dev/null || { echo "reliability.sh needs GNU time at /usr/bin/time"; exit 1; }

echo "== catalogue of bad inputs"
go test ./cmd/gpumem -run 'TestCatalogue$' -count=1 -v | grep -c '^    --- PASS' | sed 's/$/ cases passed/'

if [ "${SOAK:-1}" != 0 ]; then
	echo
	echo "== soaks at full length"
	go test ./allocator -run 'TestSoak$' -soak -count=1 -v -timeout 1h | grep -E 'ops \(|^(--- |ok)'
	go test ./allocator -run 'TestSoakManager$' -soak -race -count=1 -v -timeout 1h | grep -E '^(--- |ok)|DATA RACE'
fi

go build -o "$out/gpumem" ./cmd/gpumem

# peak prints the peak resident memory and the wall time of a command, and
# the first line of what it printed on stderr ("ok" when nothing).
peak() {
	local name=$1
	shift
	/usr/bin/time -v "$@" >/dev/null 2>"$out/time.txt" || true
	printf '%-28s %8s KiB  %s s  %s\n' "$name" \
		"$(awk -F': ' '/Maximum resident/ {print $2}' "$out/time.txt")" \
		"$(awk -F': ' '/Elapsed \(wall clock\)/ {print $2}' "$out/time.txt")" \
		"$(grep -v -m1 -P '^\tCommand being timed' "$out/time.txt" | grep -v -P '^\t' | cut -c1-110 || echo ok)"
}

echo
echo "== generated trace: $ops ops"
python3 - "$out/ops.trace.gz" "$ops" <<'PY'
import gzip, random, sys
random.seed(1)
path, n = sys.argv[1], int(sys.argv[2])
with gzip.open(path, "wt", compresslevel=1) as out:
    out.write("# memtrace v1 generated: %d ops, at most 4,000 live blocks on 4 streams\n" % n)
    live, nid, buf = [], 0, []
    for ops in range(n):
        r = random.random()
        if (r < 0.5 or not live) and len(live) < 4000:
            k = random.random()
            if k < 0.7:
                size = random.randint(1, 1 << 20)
            elif k < 0.99:
                size = random.randint(1 << 20, 64 << 20)
            else:
                size = random.randint(64 << 20, 256 << 20)
            buf.append("a %d %d %d\n" % (nid, size, random.randrange(4)))
            live.append(nid)
            nid += 1
        elif r < 0.97:
            j = random.randrange(len(live))
            live[j], live[-1] = live[-1], live[j]
            buf.append("f %d\n" % live.pop())
        elif r < 0.985:
            buf.append("r %d %d\n" % (random.choice(live), random.randrange(1, 4)))
        elif r < 0.995:
            buf.append("s %d\n" % random.randrange(1, 4))
        elif r < 0.999:
            buf.append("m step%d\n" % ops)
        else:
            buf.append("S\n")
        if len(buf) >= 100000:
            out.write("".join(buf))
            buf = []
    buf += ["f %d\n" % i for i in live]
    out.write("".join(buf))
PY
peak "replay $ops ops" "$out/gpumem" replay "$out/ops.trace.gz"

echo
echo "== decompression bombs (2 MB of gzip each, 2 GiB decompressed)"
python3 - "$out" <<'PY'
import gzip, os, sys
d = sys.argv[1]
member = lambda b: gzip.compress(b, compresslevel=9, mtime=0)
zeros, na, line = member(b"\0" * (1 << 20)), member(b"Na" * (1 << 19)), member(b"a" * (1 << 20))
with open(os.path.join(d, "zeros.pickle.gz"), "wb") as f:
    f.write(member(b"\x80\x02]") + zeros * 2000)
with open(os.path.join(d, "list.pickle.gz"), "wb") as f:  # a valid list of None, to the memory limit
    f.write(member(b"\x80\x02]") + na * 2000 + member(b"."))
with open(os.path.join(d, "zeros.trace.gz"), "wb") as f:
    f.write(zeros * 2000)
with open(os.path.join(d, "line.trace.gz"), "wb") as f:
    f.write(line * 2000)
PY
peak "convert zeros.pickle.gz" "$out/gpumem" convert "$out/zeros.pickle.gz"
peak "convert list.pickle.gz" "$out/gpumem" convert "$out/list.pickle.gz"
peak "replay zeros.trace.gz" "$out/gpumem" replay "$out/zeros.trace.gz"
peak "replay line.trace.gz" "$out/gpumem" replay "$out/line.trace.gz"
echo
echo "== round 2: small inputs that crashed or grew without bound"
python3 - "$out" <<'PY2'
import gzip, os, struct, sys
d = sys.argv[1]
u = lambda s: b"X" + struct.pack("<I", len(s)) + s.encode()
def selfref(n):  # allocator_settings: a list holding itself n times, through the memo
    p = b"\x80\x02}(" + u("device_traces") + b"]]a" + u("allocator_settings") + b"]q\x00"
    return p + (b"(" + b"h\x00" * 1000 + b"e") * (n // 1000) + b"u."
def memo(n):  # device_traces[0]: one alloc and one free dict named n times
    e = lambda a: (b"}(" + u("action") + u(a) + u("addr") + b"M\x00\x10" + u("size") + b"M\x00\x02"
                   + u("stream") + b"K\x00u")
    p = b"\x80\x02}(" + u("device_traces") + b"]]" + e("alloc") + b"q\x01a" + e("free_completed") + b"q\x02a"
    return p + (b"(" + b"h\x01h\x02" * 500 + b"e") * ((n - 2) // 1000) + b"a" + u("segments") + b"]u."
for name, data in (("settings-1m", selfref(10**6)), ("settings-4m", selfref(4 * 10**6)), ("memo-16m", memo(16 * 10**6))):
    with open(os.path.join(d, name + ".pickle.gz"), "wb") as f:
        f.write(gzip.compress(data, 9, mtime=0))
PY2
ls -l "$out"/settings-1m.pickle.gz "$out"/settings-4m.pickle.gz "$out"/memo-16m.pickle.gz | awk '{print $5, $9}'
peak "convert settings-1m" "$out/gpumem" convert "$out/settings-1m.pickle.gz"
peak "convert settings-4m" "$out/gpumem" convert "$out/settings-4m.pickle.gz"
peak "convert memo-16m" "$out/gpumem" convert "$out/memo-16m.pickle.gz"
peak "estimate --config /dev/zero" "$out/gpumem" estimate --config /dev/zero
peak "estimate --params 100T" "$out/gpumem" estimate --params 100T
peak "estimate --generate 100000" "$out/gpumem" estimate --model llama-7b --mode infer --generate 100000

echo
echo "files in $out"
