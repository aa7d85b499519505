"""Published multi-dimensional training throughput (analysis/corpus/layouts.json) against predict_layout.

What is predicted is what a calibration point allows: within each group of rows (one source, one machine, one
software release) the achieved compute rate `tflops` is fitted so that the group's first row's published
throughput is reproduced exactly, and every other row of the group is then predicted from it. So each other
row tests a ratio: across scale for one model (Narayanan et al.'s Table 2, Llama 3's 8K -> 16K GPUs), across
layouts and batches (the CP 16 stage of Llama 3, one model at two global batches), and across models at a
fixed recipe (the weak-scaling table, one NeMo release's models). Error = predicted / published ratio - 1
(positive: the model is optimistic). Memory per GPU is compared where a source states it (none does yet).

    python benchmarks/model_layouts.py [--json FILE]

Rows the model cannot lay out (`not_predicted`) are listed with the reason.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from dataclasses import dataclass, replace

from commbench.analysis.corpus.layout_figures import published_tokens_per_s_per_gpu, shape_profile
from commbench.analysis.corpus.layouts import (
    ASSUMED,
    LayoutCorpus,
    Row,
    load_layout_corpus,
)
from commbench.analysis.predict_layout import Job, predict_layout
from commbench.proxies.profile import load_profile


@dataclass(frozen=True)
class Outcome:
    row: Row
    published: float  # tokens/s per GPU
    predicted: float
    tflops: float  # the group's calibrated compute rate
    calibration: bool
    memory_gb: float
    step_s: float
    bubble: float

    @property
    def error(self) -> float:
        return self.predicted / self.published - 1


def job_for(corpus: LayoutCorpus, row: Row, tflops: float) -> Job:
    shape = corpus.shape(row)
    profile = shape_profile(row.model, shape) if row.model in corpus.shapes else load_profile(row.model)
    system = corpus.systems[row.system]
    peak = system.hardware.device_tflops.get("bf16") or system.hardware.device_tflops.get("fp16")
    return Job(shape, profile, system.hardware, system.gpus_per_node, row.microbatch or ASSUMED["microbatch"], tflops,
               row.checkpointing or ASSUMED["checkpointing"], "nccl", peak,
               ep_dispatcher=row.layout.get("ep_dispatcher") or "alltoall")


def predicted_per_gpu(corpus: LayoutCorpus, row: Row, tflops: float):
    prediction = predict_layout(job_for(corpus, row, tflops), row.parallelism())
    return prediction.tokens_per_s / row.gpus, prediction


def calibrate(corpus: LayoutCorpus, row: Row, target: float) -> float:
    """The compute rate at which `row` runs at `target` tokens/s per GPU: secant steps on the log of the rate
    (throughput is nearly proportional to it; the communication the step waits for is what is not)."""
    def miss(log_rate: float) -> float:
        return math.log(predicted_per_gpu(corpus, row, math.exp(log_rate))[0] / target)

    x0, x1 = math.log(100.0), math.log(400.0)
    f0, f1 = miss(x0), miss(x1)
    for _ in range(30):
        if abs(f1) < 1e-5 or f1 == f0:
            break
        x0, x1, f0 = x1, min(x1 - f1 * (x1 - x0) / (f1 - f0), math.log(1e6)), f1
        f1 = miss(x1)
    return math.exp(x1)


def run(corpus: LayoutCorpus) -> tuple[list[Outcome], list[Row]]:
    outcomes, skipped = [], []
    for rows in corpus.groups().values():
        usable = [r for r in rows if not r.not_predicted]
        skipped += [r for r in rows if r.not_predicted]
        if not usable:
            continue
        first = usable[0]
        tflops = calibrate(corpus, first, published_tokens_per_s_per_gpu(first, corpus.shape(first)))
        for row in usable:
            got, p = predicted_per_gpu(corpus, row, tflops)
            outcomes.append(Outcome(row, published_tokens_per_s_per_gpu(row, corpus.shape(row)), got, tflops,
                                    row is first, p.memory.total_nbytes / 1e9, p.step_us / 1e6, p.bubble))
    return outcomes, skipped


def unstated_depth(corpus: LayoutCorpus, outcomes: list[Outcome], depths=(2, 4)) -> list[str]:
    """Groups run interleaved at a depth their source does not state (predicted at V = 1): each other row's
    error at V = `depths` for every row of the group, the rate calibrated again on the first row at that V."""
    lines = []
    for group in dict.fromkeys(o.row.group for o in outcomes):
        members = [o for o in outcomes if o.row.group == group]
        if not any(o.row.layout.get("schedule") == "interleaved" and o.row.layout.get("virtual_stages") is None
                   for o in members):
            continue
        for depth in depths:
            try:
                errors = _errors_at_depth(corpus, members, depth)
            except ValueError as exc:
                lines.append(f"# {group} at V = {depth}: {exc}")
                continue
            lines.append(f"# {group} at V = {depth} (not stated; the table above has V = 1): " +
                         ", ".join(f"{label} {error:+.1%}" for label, error in errors))
    return lines


def _errors_at_depth(corpus: LayoutCorpus, members: list[Outcome], depth: int) -> list[tuple[str, float]]:
    from commbench.proxies.layouts.parallelism import LayoutError

    def at_depth(row: Row):
        par = replace(row.parallelism(), virtual_stages=depth)
        try:
            par.check(row.gpus, corpus.systems[row.system].gpus_per_node, corpus.shape(row))
        except LayoutError as exc:
            raise ValueError(str(exc)) from None
        return predict_layout(job_for(corpus, row, tflops), par).tokens_per_s / row.gpus

    first = members[0]
    tflops = first.tflops
    for _ in range(12):
        tflops *= first.published / at_depth(first.row)
    return [(o.row.label, at_depth(o.row) / o.published - 1) for o in members[1:]]


def table(outcomes: list[Outcome], skipped: list[Row]) -> list[str]:
    lines = [f"# {'group':<27} {'row':<44} {'TFLOPS':>7} {'published':>10} {'predicted':>10} {'error':>7} "
             f"{'bubble':>7} {'GB/GPU':>7}"]
    for o in outcomes:
        error = ("calib" if abs(o.error) < 1e-3 else f"calib{o.error:+.1%}") if o.calibration else f"{o.error:+.1%}"
        lines.append(f"  {o.row.group:<27} {o.row.label:<44} {o.tflops:>7.1f} {o.published:>10,.0f} "
                     f"{o.predicted:>10,.0f} {error:>7} {o.bubble:>7.3f} {o.memory_gb:>7.1f}")
    ratios = [abs(o.error) for o in outcomes if not o.calibration]
    if ratios:
        lines.append(f"# ratios: {len(ratios)} rows, median |error| {statistics.median(ratios):.1%}, "
                     f"max {max(ratios):.1%}; calibration rows: {sum(o.calibration for o in outcomes)}")
    for kind, same in (("one model across scale or layout", True), ("across models at one recipe", False)):
        chosen = [abs(o.error) for o in outcomes if not o.calibration and _same_model(o, outcomes) == same]
        if chosen:
            lines.append(f"#   {kind}: {len(chosen)} rows, median |error| {statistics.median(chosen):.1%}")
    for row in skipped:
        lines.append(f"# not predicted: {row.label} ({row.source}): {row.not_predicted}")
    stated = [o for o in outcomes if o.row.memory_gb is not None]
    lines.append(f"# memory per GPU: {len(stated)} rows state it" if stated else
                 "# memory per GPU: no row's source states it; the predicted GB/GPU above are not checked")
    return lines


def _same_model(outcome: Outcome, outcomes: list[Outcome]) -> bool:
    """Whether the row's group calibrates on the same model as the row."""
    first = next(o for o in outcomes if o.calibration and o.row.group == outcome.row.group)
    return first.row.model == outcome.row.model


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write every row's outcome here")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    corpus = load_layout_corpus()
    outcomes, skipped = run(corpus)
    print("\n".join(table(outcomes, skipped) + unstated_depth(corpus, outcomes)))
    print(f"# {time.perf_counter() - started:.1f} s")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump([{"group": o.row.group, "row": o.row.label, "source": o.row.source, "published": o.published,
                        "predicted": o.predicted, "tflops": o.tflops, "calibration": o.calibration,
                        "error": None if o.calibration else o.error, "memory_gb": o.memory_gb} for o in outcomes],
                      handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
