"""How fast and in how much memory `commbench replay` reads a large PyTorch profiler trace.

Writes a trace of about --mb MB per rank, laid out as torch's profiler writes one (indented JSON, one
event per block): the events of tests/data/traces/ddp_2rank_gloo_rank*.json.gz repeated as later steps,
their times shifted. Then reads the two ranks with proxies/trace_files.read_traces in a fresh process
and prints the wall time, the CPU time (what a loaded host does not inflate) and the process's peak
resident memory (ru_maxrss) before and after.

    python benchmarks/trace_read_speed.py --mb 100
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "tests", "data", "traces")


def write_big(source: str, path: str, target_bytes: int) -> int:
    """The source trace's events repeated, each copy shifted past the last; returns the steps written."""
    with gzip.open(source, "rt") as f:
        trace = json.load(f)
    events = [e for e in trace.pop("traceEvents") if e.get("ph") == "X"]
    span = max(e["ts"] + e.get("dur", 0) for e in events) - min(e["ts"] for e in events) + 1000.0
    head = json.dumps(trace, indent=2)[:-2]  # the object without its closing brace
    copies = 0
    with open(path, "w", encoding="utf-8") as out:
        out.write(head + ',\n  "traceEvents": [\n')
        first = True
        while out.tell() < target_bytes:
            for e in events:
                shifted = dict(e, ts=e["ts"] + copies * span)
                if isinstance(shifted.get("name"), str) and shifted["name"].startswith("ProfilerStep#"):
                    shifted["name"] = f"ProfilerStep#{copies}_{shifted['name'][13:]}"
                out.write(("" if first else ",\n") + json.dumps(shifted, indent=2))
                first = False
            copies += 1
        out.write("\n  ]\n}\n")
    return copies


def read_in_child(paths: list[str]) -> dict:
    code = ("import json, resource, sys, time\n"
            "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
            "from commbench.proxies.traces.files import read_traces\n"
            "from commbench.proxies.traces.torch_profiler import read_torch_trace\n"
            "c = time.process_time(); t = time.perf_counter(); read_torch_trace(sys.argv[1])\n"
            "one, one_cpu = time.perf_counter() - t, time.process_time() - c\n"
            "t = time.perf_counter(); job = read_traces(sys.argv[1:]); s = time.perf_counter() - t\n"
            "print(json.dumps({'read_s': s, 'one_s': one, 'one_cpu_s': one_cpu, 'rss_before_mib': before / 1024, "
            "'rss_after_mib': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "
            "'calls': sum(len(st.calls) for st in job.ranks[0].steps), 'steps': len(job.ranks[0].steps)}))\n")
    proc = subprocess.run([sys.executable, "-c", code, *paths], capture_output=True, text=True, check=True)
    return json.loads(proc.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=100.0, help="Size of each rank's trace, MB (1e6 bytes).")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        paths = []
        for rank in (0, 1):
            path = os.path.join(folder, f"rank{rank}.json")
            copies = write_big(os.path.join(DATA, f"ddp_2rank_gloo_rank{rank}.json.gz"), path, int(args.mb * 1e6))
            paths.append(path)
        sizes = [os.path.getsize(p) / 1e6 for p in paths]
        start = time.perf_counter()
        got = read_in_child(paths)
        print(f"one rank's trace of {sizes[0]:.1f} MB read in {got['one_s']:.2f} s ({got['one_cpu_s']:.2f} s of CPU); "
              f"two traces of {sizes[0]:.1f} and {sizes[1]:.1f} MB ({copies} copies of the captured steps): "
              f"read and checked in {got['read_s']:.2f} s ({time.perf_counter() - start:.2f} s with the "
              f"interpreter's start), "
              f"{got['steps']} steps and {got['calls']} calls per rank; peak RSS {got['rss_after_mib']:.0f} MiB "
              f"({got['rss_before_mib']:.0f} MiB before reading)")
        writer_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"# this process's own peak RSS (writing): {writer_mib:.0f} MiB")


if __name__ == "__main__":
    main()
