#!/usr/bin/env python3
"""Make snapshot pickles laid out as current PyTorch writes them.

    python3 gen_current.py     writes current*.pickle.gz here

torch.cuda.memory._dump_snapshot pickles the dict of
torch.cuda.memory._snapshot() with Python's pickle module at its default
protocol (5 from Python 3.14; written here at 5 whatever the Python). The
dicts below carry every key that current PyTorch puts in a snapshot
(torch/csrc/cuda/Module.cpp and memory_snapshot.cpp): segment_pool_id,
is_expandable, allocated_size, active_size and requested_size in segments;
compile_context, user_metadata and time_us in trace entries; the oom
entry's device_free in place of addr; the segment_map, segment_unmap and
snapshot actions; external_annotations; and the allocator_settings of
today, graph_capture_record_stream_reuse included. Frames carry the keys
that _snapshot(augment_with_fx_traces=True) adds. The pickles hold plain
data only, as PyTorch's do.

The files:

  current.pickle.gz          memory history recorded: a device trace with
                             every action, for device 0; an empty trace
                             for device 1, which has a live block
  current_notrace.pickle.gz  no history recorded: device_traces is [[]]
  current_nokey.pickle.gz    no device_traces key at all
  memory_snapshot.pickle.gz  torch.cuda.memory_snapshot(): the segments
                             list alone
"""
import gzip
import os
import pickle

HERE = os.path.dirname(os.path.abspath(__file__))
MIB = 1 << 20
S1 = 0x55D0C0DE1000  # a non-null cudaStream_t
S2 = 0x55D0C0DE2000  # another one

FRAME = [
    {"filename": "train.py", "name": "forward", "line": 42,
     "fx_node_op": "call_function", "fx_node_name": "mm", "fx_node_target": "aten.mm",
     "fx_original_trace": "  File \"model.py\", line 7, in forward\n"},
    {"filename": "??", "name": "c10::cuda::CUDACachingAllocator::malloc", "line": 0},
]


def block(addr, size, requested, state):
    return {"address": addr, "size": size, "requested_size": requested, "state": state,
            "frames": FRAME if state != "inactive" else []}


def segment(device, addr, blocks, stream=0, pool=(0, 0), expandable=False):
    total = sum(b["size"] for b in blocks)
    return {"device": device, "address": addr, "total_size": total,
            "allocated_size": sum(b["size"] for b in blocks if b["state"] == "active_allocated"),
            "active_size": sum(b["size"] for b in blocks if b["state"] != "inactive"),
            "requested_size": sum(b["requested_size"] for b in blocks),
            "stream": stream, "segment_type": "large" if total > MIB else "small",
            "segment_pool_id": pool, "is_expandable": expandable, "frames": FRAME,
            "blocks": blocks}


def segments():
    a = segment(0, 0x7000000000, [
        block(0x7000000000, 8 * MIB, 8000000, "active_allocated"),
        block(0x7000800000, 12 * MIB, 0, "inactive")], expandable=True)
    b = segment(0, 0x7100000000, [
        block(0x7100000000, 512, 400, "active_allocated"),
        block(0x7100000200, 1024, 1000, "active_pending_free"),
        block(0x7100000600, 2 * MIB - 1536, 0, "inactive")], stream=S1, pool=(1, 0))
    c = segment(1, 0x8000000000, [
        block(0x8000000000, 1536, 1500, "active_allocated"),
        block(0x8000000600, 2 * MIB - 1536, 0, "inactive")])
    return [a, b, c]


def entry(action, addr, size, stream=0, t=0):
    return {"action": action, "addr": addr, "size": size, "stream": stream,
            "compile_context": "0/1" if action == "alloc" else "",
            "user_metadata": "phase=forward", "frames": FRAME, "time_us": 1764633600000000 + t}


def trace0():
    return [
        entry("segment_map", 0x7000000000, 8 * MIB, 0, 1),
        entry("alloc", 0x7000000000, 8000000, 0, 2),
        entry("free_completed", 0x7200000000, 300, S2, 3),
        entry("alloc", 0x7100000200, 1000, S1, 4),
        entry("segment_map", 0x7000800000, 4 * MIB, 0, 5),
        entry("alloc", 0x7000800000, 4000000, 0, 6),
        entry("free_requested", 0x7000800000, 4000000, 0, 7),
        entry("free_completed", 0x7000800000, 4000000, 0, 8),
        entry("segment_unmap", 0x7000800000, 4 * MIB, 0, 9),
        {"action": "oom", "device_free": 1024, "size": 1 << 40, "stream": 0,
         "compile_context": "", "user_metadata": "", "frames": FRAME, "time_us": 1764633600000010},
        entry("snapshot", 0, 0, 0, 11),
        entry("free_requested", 0x7100000200, 1000, S1, 12),
        entry("segment_alloc", 0x7100000000, 2 * MIB, S1, 13),
        entry("segment_free", 0x7300000000, 2 * MIB, 0, 14),
        entry("some_action_of_tomorrow", 0, 0, 0, 15),
        entry("alloc", 0x7000800000, 64, 0, 16),
        entry("free_requested", 0x7000800000, 64, 0, 17),
        entry("free_completed", 0x7000800000, 64, 0, 18),
    ]


def settings():
    return {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "max_split_size": -1,
            "garbage_collection_threshold": 0.0, "expandable_segments": True,
            "pinned_num_register_threads": 1, "release_lock_on_cudamalloc": False,
            "pinned_use_cuda_host_register": False,
            "roundup_power2_divisions": {"1": 0, "2": 0, "4": 0, "8": 0, "16": 0, "32": 0, "64": 0,
                                         "128": 0, "256": 0, "512": 0, "1024": 0, "2048": 0,
                                         "4096": 0, "8192": 0, "16384": 0, "32768": 0},
            "graph_capture_record_stream_reuse": False}


def write(name, obj):
    with gzip.GzipFile(os.path.join(HERE, name), "wb", mtime=0) as f:
        f.write(pickle.dumps(obj, protocol=5))


def main():
    write("current.pickle.gz", {
        "segments": segments(), "device_traces": [trace0(), []],
        "allocator_settings": settings(),
        "external_annotations": [{"stage": "START", "name": "step 3", "device": 0,
                                  "time_us": 1764633600000000}]})
    untraced = segments()
    for s in untraced:
        s["frames"] = []
        for b in s["blocks"]:
            b["frames"] = []
    write("current_notrace.pickle.gz", {"segments": untraced, "device_traces": [[]],
                                        "allocator_settings": settings(), "external_annotations": []})
    write("current_nokey.pickle.gz", {"segments": untraced, "allocator_settings": settings()})
    write("memory_snapshot.pickle.gz", untraced)


if __name__ == "__main__":
    main()
