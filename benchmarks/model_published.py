"""Published data-parallel scaling results (analysis/corpus/published.json) against commbench's prediction.

Every row is predicted from its hardware as the source describes it (the corpus's `systems`), its model's
gradient profile, its batch and its setup as the source's own code states it, and its reference
throughput (the 1-GPU row, or the source's smallest count where it gives only whole nodes: then the
compute is the one that reproduces that count's throughput). Nothing is fitted to the corpus: the terms
that grow with the node count come from their own evidence (analysis/scale_terms.py), and the ablation
below switches each off to show what it does. Error = predicted - published linearity, in points
(positive: the model is optimistic).

Intervals: split-conformal on the residuals, leave-one-source-out (analysis/calibration.py): each
source's rows get the 80% interval calibrated on the other sources' rows only.

    python benchmarks/model_published.py [--out DIR] [--json FILE] [--write-calibration] [--variants]
    python benchmarks/model_published.py --collectives

DIR keeps the profiles it extracts (torchvision ResNeXt, transformers Transformer-XL); --write-calibration
writes analysis/corpus/calibration.json from the kept model's residuals (every source).
--collectives predicts the published nccl-tests figures instead (analysis/corpus/collectives.json), as
`commbench predict --algorithm auto` does from each system's description, and reports the error and the
leave-one-source-out coverage of the 80% interval that `predict` prints without a fit.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
from dataclasses import dataclass, replace
from unittest import mock

# Models without a shipped profile, and how `commbench profiles extract` builds them: torchvision's ResNeXt,
# and Transformer-XL at the sizes of NVIDIA's wt103_base.yaml / wt103_large.yaml (proxies/models/transformer_xl.py).
EXTRACTED = {
    "resnext50_32x4d": "torchvision:resnext50_32x4d",
    "resnext101_32x8d": "torchvision:resnext101_32x8d",
    "transfo-xl-base": "commbench.proxies.models.transformer_xl:build",
    "transfo-xl-large": "commbench.proxies.models.transformer_xl_large:build",
}


@dataclass(frozen=True)
class Terms:
    """Which terms that grow with the node count a prediction counts."""
    nic: bool = True  # NICs at nccl-tests' busbw for their class, not the line rate
    hop_latency: bool = True  # NCCL's per-hop latency across nodes (its tuning constants)
    stragglers: bool = True  # the expected slowest of N ranks, default step-time distribution
    congestion: bool = True  # 1 / blocking factor where the source says its fabric blocks

    def label(self) -> str:
        on = [name for name in ("nic", "hop_latency", "stragglers", "congestion") if getattr(self, name)]
        return "+".join(on) or "none"


ALL = Terms()
# What predict-scaling applies without a fit (analysis/scale_terms.KEPT, NCCL's hop latency built in): congestion
# is left out, no corpus source saying its fabric blocks (it changes no row).
KEPT = replace(ALL, congestion=False)
ABLATIONS = {"all terms": ALL, "kept (predict-scaling's)": KEPT, "without NIC efficiency": replace(ALL, nic=False),
             "without per-hop latency": replace(ALL, hop_latency=False),
             "without stragglers": replace(ALL, stragglers=False),
             "without congestion": replace(ALL, congestion=False),
             "none": Terms(False, False, False, False)}


def profile_of(model: str, out: str):
    from commbench.proxies.profile import load_profile

    if model not in EXTRACTED:
        return load_profile(model)
    path = os.path.join(out, f"{model}.json")
    if not os.path.exists(path):
        os.makedirs(out, exist_ok=True)
        command = [sys.executable, "-m", "commbench", "profiles", "extract", EXTRACTED[model], "-o", path, "--name",
                   model]
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    return load_profile(path)


@contextlib.contextmanager
def hop_latency(enabled: bool):
    """NCCL's per-hop network latency as its tuning model has it, or zero (the ablation)."""
    from commbench.costmodel import nccl_tuning

    if enabled:
        yield
        return
    zero = {"tree": (0.0, 0.0, 0.0), "ring": (0.0, 0.0, 0.0)}
    with mock.patch.dict(nccl_tuning.HOP_LATENCY_US, {"net": zero}):
        nccl_tuning.allreduce_table.cache_clear()
        try:
            yield
        finally:
            nccl_tuning.allreduce_table.cache_clear()


def predicted_linearity(corpus, row, profile, terms: Terms) -> float:
    """The row's linearity (against its reference count) as commbench predicts it with `terms`."""
    return predicted_point(corpus, row, profile, terms)[0]


def predicted_point(corpus, row, profile, terms: Terms, slowdown: float | None = None):
    """(linearity, the row's scaling record): predicted_linearity, and the record it comes from; `slowdown`: the
    step terms' overlap_slowdown instead of the class default (--variants)."""
    from commbench.analysis.corpus.published import setup_choice
    from commbench.analysis.predict_scaling import applied_terms
    from commbench.analysis.scale_terms import default_step_ratios, delivered
    from commbench.analysis.scaling import StepQuestion, predict_scaling
    from commbench.proxies.setups import Compute
    from commbench.step_terms import Term

    system = corpus.systems[row.system]
    hw = replace(system.hardware, ranks_per_node=row.gpus_per_node)
    blocking = system.oversubscription if terms.congestion else None
    hw = delivered(hw, terms.nic, blocking)
    choice = setup_choice(corpus.setup(row))
    step_terms = applied_terms(hw)  # a preset's: its device class's defaults (commbench/step_terms.py)
    if slowdown is not None:
        step_terms = replace(step_terms, overlap_slowdown=Term(slowdown, "fitted", "--variants"))
    ratios = default_step_ratios(step_terms.step_cv.value) if terms.stragglers else None
    share = profile.forward_flops / (profile.forward_flops + profile.backward_flops)

    def point(gpus: int, step_us: float):
        q = StepQuestion(profile, row.batch, Compute(step_us * share, step_us * (1 - share)), choice,
                         terms=step_terms)
        return predict_scaling(q, hw, [gpus], row.gpus_per_node, ratios)[0]

    with hop_latency(terms.hop_latency):
        step = row.batch * row.base_gpus / row.base_rate * 1e6  # the reference's step, all of it compute
        if row.base_gpus > 1:  # the compute that reproduces the reference count's throughput
            low, high = step * 0.2, step
            for _ in range(40):
                middle = (low + high) / 2
                faster = point(row.base_gpus, middle).samples_per_s > row.base_rate
                low, high = (middle, high) if faster else (low, middle)
            step = (low + high) / 2
        at = point(row.gpus, step)
        return at.samples_per_s / (row.gpus / row.base_gpus * row.base_rate), at


def summary(errors: list[float]) -> str:
    absolute = [abs(e) for e in errors]
    optimistic = sum(e > 0 for e in errors)
    return (f"median |error| {100 * statistics.median(absolute):.3f} points, "
            f"mean {100 * statistics.mean(absolute):.3f}, max {100 * max(absolute):.2f}, "
            f"{optimistic} of {len(errors)} optimistic ({100 * optimistic / len(errors):.0f}%)")


def predict_all(corpus, profiles, terms: Terms) -> list[float]:
    """Predicted linearity of every row, in corpus order."""
    return [predicted_linearity(corpus, row, profiles[row.model], terms) for row in corpus.rows]


def main() -> int:
    from commbench.analysis import calibration as C
    from commbench.analysis.corpus.published import load_corpus

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/published", help="where extracted profiles are kept")
    parser.add_argument("--json", default=None, help="write every row's prediction and interval here")
    parser.add_argument("--write-calibration", action="store_true",
                        help=f"write {os.path.relpath(C.CALIBRATION_PATH)} from the kept model's residuals")
    parser.add_argument("--collectives", action="store_true",
                        help="predict the published collective measurements (predict's interval) instead")
    parser.add_argument("--variants", action="store_true",
                        help="also the interval variants tried for issue 35 (benchmarks/model_published_variants.py)")
    args = parser.parse_args()
    if args.collectives:
        return collectives_report()
    corpus = load_corpus()
    profiles = {model: profile_of(model, args.out) for model in dict.fromkeys(r.model for r in corpus.rows)}
    print(f"# {len(corpus.rows)} rows from {len(corpus.sources)} sources, "
          f"{min(r.gpus for r in corpus.rows)}-{max(r.gpus for r in corpus.rows)} GPUs\n")
    print("## Ablation (each term from its own evidence; nothing fitted, so every figure is out of source)\n")
    results = {name: predict_all(corpus, profiles, terms) for name, terms in ABLATIONS.items()}
    for name, predicted in results.items():
        errors = [p - row.linearity for p, row in zip(predicted, corpus.rows)]
        print(f"- {name}: {summary(errors)}")
    kept = results["kept (predict-scaling's)"]
    residuals: dict[str, list[float]] = {}
    for p, row in zip(kept, corpus.rows):
        residuals.setdefault(row.source, []).append(row.linearity - p)
    loso = C.leave_one_source_out(residuals)
    print_rows(corpus, kept, loso)
    report_intervals(corpus, kept, loso)
    report_calibrated(corpus, kept, loso, C.leave_one_source_out_centres(residuals))
    if args.variants:
        from model_published_variants import report_variants

        report_variants(corpus, lambda s: [predicted_point(corpus, row, profiles[row.model], KEPT, s)
                                           for row in corpus.rows])
    if args.json:
        write_json(args.json, corpus, kept, loso)
    if args.write_calibration:
        flat = [(row.source, row.linearity - p) for p, row in zip(kept, corpus.rows)]
        C.save_calibration(C.Calibration(tuple(r for _, r in flat), tuple(s for s, _ in flat), C.LEVEL,
                                         "python benchmarks/model_published.py --write-calibration",
                                         f"predict-scaling, nccl, terms {KEPT.label()} (analysis/scale_terms.py)"))
        print(f"\nwrote {C.CALIBRATION_PATH}")
    return 0


def print_rows(corpus, predicted: list[float], loso: dict) -> None:
    print("\n## Every row (the kept terms; interval: leave-one-source-out split conformal, 80%)\n")
    print("| source | model | system | precision | batch/GPU | GPUs (nodes) | published linearity | predicted | "
          "error (points) | 80% interval | inside |\n|---|---|---|---|---|---|---|---|---|---|---|")
    for p, row in zip(predicted, corpus.rows):
        low, high = loso[row.source]
        inside = p + low <= row.linearity <= p + high
        print(f"| {row.source} | {row.model} | {row.system} | {row.precision} | {row.batch} | {row.gpus} "
              f"({row.nodes}) | {row.linearity:.3f} | {p:.3f} | {100 * (p - row.linearity):+.2f} | "
              f"[{p + low:.3f}, {p + high:.3f}] | {'yes' if inside else 'no'} |")


def report_intervals(corpus, predicted: list[float], loso: dict) -> None:
    inside, widths = [], []
    print("\n## Leave-one-source-out, per source\n")
    for source in corpus.sources:
        rows = [(p, row) for p, row in zip(predicted, corpus.rows) if row.source == source]
        low, high = loso[source]
        hits = [p + low <= row.linearity <= p + high for p, row in rows]
        errors = [p - row.linearity for p, row in rows]
        inside += hits
        widths += [high - low] * len(rows)
        print(f"- {source} ({len(rows)} rows): {summary(errors)}; interval offsets [{100 * low:+.2f}, "
              f"{100 * high:+.2f}] points, {sum(hits)} of {len(rows)} inside")
    errors = [p - row.linearity for p, row in zip(predicted, corpus.rows)]
    print(f"\nall rows: {summary(errors)}")
    print(f"80% intervals: {sum(inside)} of {len(inside)} inside ({100 * sum(inside) / len(inside):.0f}%), "
          f"median width {100 * statistics.median(widths):.2f} points")


def report_calibrated(corpus, predicted: list[float], loso: dict, centres: dict) -> None:
    """The estimate predict-scaling shows (issue 35): each row's raw prediction moved by the median residual of
    the other sources (leave-one-source-out, as its interval), its error, and whether it lies in its interval."""
    print("\n## The calibrated estimate, leave-one-source-out (the raw prediction + the other sources' median "
          "residual)\n")
    errors, inside = [], 0
    for source in corpus.sources:
        rows = [(p, row) for p, row in zip(predicted, corpus.rows) if row.source == source]
        mine = [p + centres[source] - row.linearity for p, row in rows]
        errors += mine
        low, high = loso[source]
        inside += sum(p + low <= p + centres[source] <= p + high for p, _ in rows)
        print(f"- {source} ({len(rows)} rows): centre {100 * centres[source]:+.2f} points; {summary(mine)}")
    on_one_side = max(sum(e > 0 for e in errors), sum(e < 0 for e in errors)) / len(errors)
    print(f"\nall rows, calibrated: {summary(errors)}; {100 * on_one_side:.0f}% on one side; the estimate inside "
          f"its own interval on {inside} of {len(errors)} rows")


def write_json(path: str, corpus, predicted: list[float], loso: dict) -> None:
    out = [{"source": row.source, "model": row.model, "system": row.system, "precision": row.precision,
            "batch": row.batch, "gpus": row.gpus, "base_gpus": row.base_gpus, "published_linearity": row.linearity,
            "predicted_linearity": p, "interval": [p + loso[row.source][0], p + loso[row.source][1]]}
           for p, row in zip(predicted, corpus.rows)]
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(out, handle, indent=1)


def collectives_report() -> int:
    """Every published nccl-tests figure against `commbench predict`, and the 80% interval each row gets when its
    source is held out of the calibration (analysis/corpus/collectives.py). Rows marked `beyond_nic` are predicted
    and printed but calibrate nothing; their own coverage is printed apart."""
    import math

    from commbench.analysis import calibration as C
    from commbench.analysis.corpus import collectives as K
    from commbench.analysis.predict import row_us

    corpus = K.load_collectives()
    calibrated = K.residuals(corpus, row_us)
    print(f"# {len(corpus.rows)} rows from {len(corpus.sources)} sources, {len(corpus.calibrated_rows)} calibrated "
          f"(error = predicted / measured time - 1; negative: predicted too fast)\n")
    print("| source | system | nodes x GPUs | collective | size (B) | measured busbw | predicted busbw | error | "
          "80% interval (x time) | inside | calibrated |\n|---|---|---|---|---|---|---|---|---|---|---|")
    outcomes: dict[bool, list[tuple[float, bool, float]]] = {True: [], False: []}
    for row in corpus.rows:
        r = K.row_residual(corpus, row, row_us)
        others = [v for source, values in calibrated.items() if source != row.source for v in values]
        low, high = C.bounds(others)
        hit = low <= r <= high
        outcomes[row.beyond_nic is None].append((math.exp(-r) - 1, hit, math.exp(high) / math.exp(low)))
        size = "unknown" if row.nbytes is None else row.nbytes
        print(f"| {row.source} | {row.system} | {row.nodes}x{row.gpus_per_node} | {row.collective} | {size} | "
              f"{row.busbw_gbps:g} | {row.busbw_gbps * math.exp(r):.1f} | {100 * (math.exp(-r) - 1):+.1f}% | "
              f"[{math.exp(low):.2f}, {math.exp(high):.2f}] | {'yes' if hit else 'no'} | "
              f"{'no (beyond_nic)' if row.beyond_nic else 'yes'} |")
    print()
    for kept, label in ((True, "calibrated rows"), (False, "beyond_nic rows (not calibrated)")):
        _collectives_summary(label, outcomes[kept])
    flat = [r for values in calibrated.values() for r in values]
    low, high = C.bounds(flat)
    print(f"shipped (every calibrated row, what predict prints): x{math.exp(low):.3f} to x{math.exp(high):.3f} the "
          f"time, order statistics {C.order_indices(len(flat))} of {len(flat)}")
    return 0


def _collectives_summary(label: str, outcomes: list[tuple[float, bool, float]]) -> None:
    """One line each: the errors' median, max and signs, and the leave-one-source-out coverage and width."""
    if not outcomes:
        return
    errors = [e for e, _, _ in outcomes]
    inside = sum(hit for _, hit, _ in outcomes)
    slow = sum(e > 0 for e in errors)
    print(f"{label}: median |error| {100 * statistics.median(abs(e) for e in errors):.1f}%, max "
          f"{100 * max(abs(e) for e in errors):.1f}%; {slow} of {len(errors)} predicted too slow, {len(errors) - slow} "
          f"too fast; 80% intervals (leave-one-source-out): {inside} of {len(errors)} inside "
          f"({100 * inside / len(errors):.0f}%), median width x{statistics.median(w for _, _, w in outcomes):.2f} "
          f"(high / low)")


if __name__ == "__main__":
    sys.exit(main())
