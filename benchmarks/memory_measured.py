"""Memory per device: proxies/layouts/memory.py's prediction against a real training step's peak, measured on this
machine's CPU by torch's own tracker (proxies/layouts/memory_measure.py: MemTracker, FSDPMemTracker for FSDP2), one
rank, bare, under DDP and under FSDP2, float32 and bfloat16 (issue 47, item 5); with --layout, llama-tiny's
layouts as `train --layout` trains them on 4 local gloo ranks (TP, SP, CP, FSDP2 or DDP; no pipeline), the
fullest rank's peak. Prints per case the measured peak, the prediction and its error, and the tracker's parts;
the median and max |error| and the target (within 10%). No timing is involved: the tracker counts tensor
storages, so load does not change a figure.

    python benchmarks/memory_measured.py [--json out/memory_measured.json]
    python benchmarks/memory_measured.py --layout fsdp4 --layout tp2,fsdp2 ...   [default: LAYOUTS below]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys

from commbench.proxies.layouts.memory_measure import DTYPES, WRAPPERS, measure_peak, predicted_peak, shape_of

MIB = 2**20
LLAMA = "transformers:LlamaForCausalLM:"
CASES = {  # name: (constructor, sequence length, batch)
    "llama-tiny": (LLAMA + "hidden_size=64,intermediate_size=176,num_hidden_layers=4,num_attention_heads=4,"
                   "num_key_value_heads=2,vocab_size=1024,max_position_embeddings=64,tie_word_embeddings=false", 64, 4),
    "llama-h512-v32k": (LLAMA + "hidden_size=512,intermediate_size=1408,num_hidden_layers=4,num_attention_heads=8,"
                        "num_key_value_heads=4,vocab_size=32000,max_position_embeddings=1024,"
                        "tie_word_embeddings=false", 512, 2),
}
TARGET = 0.10
LAYOUTS = ("fsdp4", "ddp4", "tp2,fsdp2", "tp2sp,fsdp2", "tp2,ddp2", "cp2,fsdp2")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {', '.join(CASES)}")
    parser.add_argument("--json", metavar="PATH", help="every row as JSON")
    parser.add_argument("--layout", action="append", nargs="?", const="", metavar="SPEC",
                        help=f"llama-tiny's layouts on 4 ranks (repeat it; alone: {', '.join(LAYOUTS)})")
    args = parser.parse_args(argv)
    if args.layout is not None:
        return _layouts([t for t in args.layout if t] or list(LAYOUTS), args.json)
    names = [n.strip() for n in args.cases.split(",") if n.strip()]
    unknown = [n for n in names if n not in CASES]
    if unknown:
        print(f"memory_measured.py: unknown case {unknown[0]!r}; known: {', '.join(CASES)}", file=sys.stderr)
        return 2
    rows = []
    print(f"{'case':16} {'wrapper':7} {'dtype':9} {'measured MiB':>12} {'predicted MiB':>13} {'error':>7}  "
          "parts at the peak (MiB)")
    for name in names:
        constructor, seq, batch = CASES[name]
        for dtype in DTYPES:
            shape = shape_of(constructor, seq, dtype)
            for wrapper in WRAPPERS:
                measured = measure_peak(constructor, seq, batch, dtype, wrapper)
                predicted = predicted_peak(shape, batch, wrapper).total_nbytes
                error = predicted / measured.total_nbytes - 1
                parts = ", ".join(f"{k.lower()} {v / MIB:.1f}" for k, v in measured.by_kind.items() if v)
                print(f"{name:16} {wrapper:7} {dtype:9} {measured.total_nbytes / MIB:12.2f} {predicted / MIB:13.2f} "
                      f"{error:+7.1%}  {parts}", flush=True)
                rows.append({"case": name, "seq_len": seq, "batch": batch, "dtype": dtype, "wrapper": wrapper,
                             "measured_nbytes": measured.total_nbytes, "predicted_nbytes": predicted, "error": error,
                             "measured_parts": measured.by_kind})
    return _summary(rows, args.json)


def _layouts(texts: list[str], path: str | None) -> int:
    """Each layout's fullest rank against the prediction for it (memory_measure.layout_peaks)."""
    from commbench.proxies.layouts.memory_measure import layout_peaks, predicted_layout_peak
    from commbench.proxies.layouts.parallelism import LayoutError, parse_layout
    from commbench.proxies.profile import load_profile

    transformer = load_profile("llama-tiny").transformer
    try:
        layouts = [parse_layout(text, "ddp", 4) for text in texts]
        measured = layout_peaks(layouts, transformer)
    except (LayoutError, ValueError) as exc:
        print(f"memory_measured.py: {exc}", file=sys.stderr)
        return 2
    rows = []
    print(f"{'layout':16} {'measured MiB':>12} {'predicted MiB':>13} {'error':>7}  parts at the peak (MiB)")
    for par in layouts:
        peak, predicted = measured[par.name], predicted_layout_peak(par, transformer).total_nbytes
        error = predicted / peak.total_nbytes - 1
        parts = ", ".join(f"{k.lower()} {v / MIB:.3f}" for k, v in peak.by_kind.items() if v)
        print(f"{par.name:16} {peak.total_nbytes / MIB:12.3f} {predicted / MIB:13.3f} {error:+7.1%}  {parts}")
        rows.append({"case": "llama-tiny", "layout": par.name, "ranks": 4, "dtype": "float32",
                     "measured_nbytes": peak.total_nbytes, "predicted_nbytes": predicted, "error": error,
                     "measured_parts": peak.by_kind})
    return _summary(rows, path)


def _summary(rows: list[dict], path: str | None) -> int:
    errors = [abs(r["error"]) for r in rows]
    verdict = "met" if max(errors) <= TARGET else "MISSED"
    print(f"# |error| median {statistics.median(errors):.1%}, max {max(errors):.1%}; target <= {TARGET:.0%}: {verdict}")
    if path:
        with open(path, "w") as out:
            json.dump(rows, out, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
