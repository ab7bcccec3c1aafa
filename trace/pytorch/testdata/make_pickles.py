#!/usr/bin/env python3
"""Make the small snapshot pickles that the trace package's tests read.

    python3 make_pickles.py              writes the hand-made edge cases here
    python3 make_pickles.py strip IN OUT  copies snapshot IN to OUT (gzip)
                                          without its stack frames

The pickles hold plain dicts and lists, as torch.cuda.memory._dump_snapshot
writes them; evil.pickle is the exception: it would run a shell command if
a Python unpickler loaded it, and the importer must refuse it.
"""
import gzip
import os
import pickle
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
S1 = 0x7F0000001000  # a non-null cudaStream_t
S2 = 0x7F0000002000  # another one


def entry(action, addr, size, stream=0):
    return {"action": action, "addr": addr, "size": size, "stream": stream,
            "time_us": 1, "frames": []}


def edge():
    """Pre-window blocks of both kinds, three streams, a free_requested
    without free_completed, ignored actions, and a second device."""
    seg_a = {"device": 0, "address": 0x1000000, "total_size": 2 << 20, "stream": 0,
             "segment_type": "small", "blocks": [
                 {"address": 0x1000000, "size": 512, "requested_size": 500,
                  "state": "active_allocated", "frames": []},
                 {"address": 0x1000200, "size": (2 << 20) - 512, "requested_size": 0,
                  "state": "inactive", "frames": []}]}
    seg_b = {"device": 0, "address": 0x2000000, "total_size": 2 << 20, "stream": S1,
             "segment_type": "small", "blocks": [
                 {"address": 0x2000000, "size": 2048, "requested_size": 2000,
                  "state": "active_allocated", "frames": []},
                 {"address": 0x2000800, "size": 4096, "requested_size": 4096,
                  "state": "active_pending_free", "frames": []}]}
    seg_d1 = {"device": 1, "address": 0x5000, "total_size": 2 << 20, "stream": 0,
              "segment_type": "small", "blocks": [
                  {"address": 0x5000, "size": 512, "requested_size": 64,
                   "state": "active_allocated", "frames": []}]}
    oom = {"action": "oom", "device_free": 123, "size": 1 << 40, "stream": 0, "time_us": 1}
    trace0 = [
        entry("segment_alloc", 0x2000000, 2 << 20, S1),
        entry("alloc", 0x1000400, 700),
        entry("free_requested", 0x3000000, 300, S2),
        entry("free_completed", 0x3000000, 300, S2),
        entry("alloc", 0x2000000, 2000, S1),
        entry("alloc", 0x2000800, 4096, S1),
        entry("free_requested", 0x1000400, 700),
        entry("free_completed", 0x1000400, 700),
        entry("free_requested", 0x2000800, 4096, S1),
        entry("snapshot", 0, 7000),
        oom,
        entry("alloc", 0x1000400, 100),
        entry("free_requested", 0x1000400, 100),
        entry("free_completed", 0x1000400, 100),
        entry("segment_free", 0x4000000, 2 << 20),
        entry("some_future_action", 0, 0),
    ]
    trace1 = [entry("alloc", 0x5000, 64)]
    return {"segments": [seg_a, seg_b, seg_d1], "device_traces": [trace0, trace1],
            "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "", "max_split_size": -1,
                                   "expandable_segments": False}}


class Evil:
    def __reduce__(self):
        return (os.system, ("echo this must never run",))


def write(name, obj, protocol):
    with open(os.path.join(HERE, name), "wb") as f:
        pickle.dump(obj, f, protocol=protocol)


def strip(x):
    if isinstance(x, dict):
        return {k: strip(v) for k, v in x.items() if k not in ("frames", "forward_frames")}
    if isinstance(x, list):
        return [strip(v) for v in x]
    return x


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "strip":
        with open(sys.argv[2], "rb") as f:
            snap = pickle.load(f)
        with gzip.open(sys.argv[3], "wb") as f:
            f.write(pickle.dumps(strip(snap), protocol=4))
        return
    write("edge.pickle", edge(), 2)
    write("empty.pickle", {"segments": [], "device_traces": [[]]}, 4)
    write("notrace.pickle", {"segments": []}, 4)
    double = edge()
    double["device_traces"][0].insert(2, entry("alloc", 0x1000400, 8))
    write("double_alloc.pickle", double, 4)
    write("evil.pickle", {"device_traces": [[Evil()]]}, 4)


if __name__ == "__main__":
    main()
