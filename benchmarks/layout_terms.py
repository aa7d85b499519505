"""One group of the published layout corpus (analysis/corpus/layouts.json), term by term: each row's predicted step
split into compute, the bubble and each dimension's exposed calls at the group's calibrated rate (as
benchmarks/model_layouts.py calibrates it, on the group's first row), the rate that would reproduce each row, and
each MoE row's tokens per local expert GEMM. Two counterfactuals show what a term weighs in a row's error:
`--drop DIM` leaves a dimension's per-layer calls out, and `--moe-tp-dense` charges MoE layers under ETP 1 with
sequence parallelism a dense layer's 2 + 2 TP calls, as layout_calls did before it followed Megatron-Core (whose
token dispatcher takes the sequence-parallel tokens, [S/TP, B, H], and gathers over the experts' TP group, one
rank under ETP 1, so only the attention block's TP calls are issued).
Arithmetic only.

    python benchmarks/layout_terms.py modelzoo-qwen3-235b-h100
    python benchmarks/layout_terms.py modelzoo-qwen3-235b-h100 --drop tp
    python benchmarks/layout_terms.py modelzoo-qwen3-235b-h100 --moe-tp-dense
"""
from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model_layouts as ML  # noqa: E402

from commbench.analysis import predict_layout as P  # noqa: E402
from commbench.analysis.corpus.layout_figures import published_tokens_per_s_per_gpu  # noqa: E402
from commbench.analysis.corpus.layouts import load_layout_corpus  # noqa: E402

SHIPPED_CALLS = P.layer_calls


def counterfactual(drop: str | None, moe_tp_dense: bool):
    """predict_layout's per-layer calls with a dimension left out or MoE layers' TP calls doubled (ETP 1 with SP)."""
    def calls(par, shape, microbatch, checkpointing="none", moe=False, style="megatron"):
        out = SHIPPED_CALLS(par, shape, microbatch, checkpointing, moe, style)
        if moe_tp_dense and moe and par.expert_tp == 1 and par.sequence_parallel and par.tp > 1:
            out = [replace(c, count=c.count * 2) if c.dim == "tp" else c for c in out]
        return [c for c in out if c.dim != drop]
    return calls


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("group", help="a corpus group, e.g. modelzoo-qwen3-235b-h100")
    parser.add_argument("--drop", choices=("tp", "cp", "ep"), help="leave this dimension's per-layer calls out")
    parser.add_argument("--moe-tp-dense", action="store_true",
                        help="MoE layers under ETP 1 and SP: a dense layer's TP calls (the count before the fix)")
    args = parser.parse_args()
    corpus = load_layout_corpus()
    if args.group not in corpus.groups():
        raise SystemExit(f"no group {args.group!r}; the groups: {', '.join(corpus.groups())}")
    P.layer_calls = counterfactual(args.drop, args.moe_tp_dense)
    rows = [r for r in corpus.groups()[args.group] if not r.not_predicted]
    first = rows[0]
    rate = ML.calibrate(corpus, first, published_tokens_per_s_per_gpu(first, corpus.shape(first)))
    print(f"# {args.group}: rate calibrated on the first row {rate:.1f} TFLOPS" +
          (f"; without {args.drop}'s calls" if args.drop else "") +
          ("; MoE layers' TP calls: a dense layer's" if args.moe_tp_dense else ""))
    for row in rows:
        got, p = ML.predicted_per_gpu(corpus, row, rate)
        published = published_tokens_per_s_per_gpu(row, corpus.shape(row))
        needs = ML.calibrate(corpus, row, published)
        exposed = ", ".join(f"{d} {x / 1e6:.2f}" for d, x in p.exposed_us.items())
        print(f"  {row.label:<46} step {p.step_us / 1e6:6.2f} s: compute {p.compute_us / 1e6:.2f}, exposed {exposed}; "
              f"bubble {p.bubble:.3f}; error {got / published - 1:+.1%}; rate reproducing it {needs:.1f} "
              f"({needs / rate:.2f}x)")
    for row in corpus.groups()[args.group]:
        shape, lay = corpus.shape(row), row.layout
        if shape.experts:
            tokens = (row.microbatch or 1) * row.seq_len // lay["cp"] // (lay["tp"] if lay.get("sequence_parallel")
                                                                          else 1)
            local = shape.experts // lay["ep"]  # experts a GPU holds; routing uniform, as the forced-balance rows
            print(f"  {row.label:<46} {tokens} tokens a rank and micro-batch, {local} local experts: "
                  f"{tokens * shape.top_k // local} tokens per local expert GEMM; published "
                  f"{row.throughput.get('tflops_per_gpu')} TFLOPs a GPU")
    return 0


if __name__ == "__main__":
    sys.exit(main())
