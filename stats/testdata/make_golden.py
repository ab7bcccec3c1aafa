#!/usr/bin/env python3
"""Write the golden memory summaries that the stats tests compare against.

The tables come from PyTorch's own memory_summary code, not from a rewrite:
this script reads torch/cuda/memory.py (PyTorch 2.6.0's, path given on the
command line), takes the memory_summary function out of it with the ast
module (it holds _format_size and _format_count as inner functions) and runs
it without torch, with memory_stats replaced by a stub that returns the
stats of a scenario.

Usage:

    python3 make_golden.py path/to/memory.py scenario.json [scenario.json ...]

A scenario file is a JSON object {"device": N, "stats": {KEY: VALUE, ...}}
whose stats are the flat keys of torch.cuda.memory_stats(). For each
scenario NAME.json the script writes NAME.golden (the full table) and
NAME.abbreviated.golden (abbreviated=True) beside it.
"""

import ast
import collections
import json
import os
import sys
import typing


def load_memory_summary(memory_py):
    with open(memory_py, encoding="utf-8") as f:
        tree = ast.parse(f.read(), filename=memory_py)
    funcs = [
        node
        for node in tree.body
        if isinstance(node, ast.FunctionDef) and node.name == "memory_summary"
    ]
    if len(funcs) != 1:
        sys.exit(f"{memory_py}: expected one memory_summary function, found {len(funcs)}")
    module = ast.Module(body=funcs, type_ignores=[])
    code = compile(module, memory_py, "exec")

    scenario = {}

    def memory_stats(device=None):
        return scenario["stats"]

    def _get_device_index(device, optional=False):
        return scenario["device"] if device is None else device

    namespace = {
        "Union": typing.Union,
        "Device": int,
        "memory_stats": memory_stats,
        "_get_device_index": _get_device_index,
    }
    exec(code, namespace)
    return namespace["memory_summary"], scenario


def main(argv):
    if len(argv) < 3:
        sys.exit(__doc__)
    memory_summary, scenario = load_memory_summary(argv[1])
    for path in argv[2:]:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        scenario["device"] = data.get("device", 0)
        # memory_stats returns an OrderedDict sorted by key.
        scenario["stats"] = collections.OrderedDict(sorted(data["stats"].items()))
        stem = os.path.splitext(path)[0]
        for suffix, abbreviated in ((".golden", False), (".abbreviated.golden", True)):
            table = memory_summary(device=None, abbreviated=abbreviated)
            with open(stem + suffix, "w", encoding="utf-8", newline="\n") as out:
                out.write(table)
            print(f"wrote {stem + suffix}")


if __name__ == "__main__":
    main(sys.argv)
