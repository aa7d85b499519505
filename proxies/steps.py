"""Step records of proxy and train runs: one JSON line per step as it completes, a readable
row on stdout, and a summary (median and p90 over the steps after warm-up). The record
types themselves (StepRecord, ProxyResult) live in commbench.results with the others.

Each step's figures are its slowest rank's (a synchronous data-parallel step is as slow as
its slowest rank): the row, the JSON step record (written and flushed by rank 0 as the step
ends, so a crash loses nothing) and the summary alike. A step splits exactly into compute,
exposed communication (measured, never more than the communication) and other (the rest of
its wall time: descheduled, or compute slowed by its core's other work); see StepTimes.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from commbench.results import ProxyResult, ResultSink, StepRecord, new_run_id

__all__ = ["METRICS", "ProxyResult", "StepLog", "summarize"]  # ProxyResult lives in commbench.results

METRICS = ("compute_us", "comm_us", "exposed_comm_us", "step_us", "other_us")  # other last: older files lack it
STEP = METRICS.index("step_us")
COLUMNS = (("compute_us", "compute(ms)", 12), ("comm_us", "comm(ms)", 10), ("exposed_comm_us", "exposed(ms)", 12),
           ("other_us", "other(ms)", 10), ("step_us", "step(ms)", 10))  # the table, left to right


def summarize(step_rows: np.ndarray) -> dict[str, float | None]:
    """(steps x METRICS) array (NaN where unknown) -> p50/p90 of each."""
    out: dict[str, float | None] = {}
    for column, name in enumerate(METRICS):
        values = step_rows[:, column] if len(step_rows) else np.empty(0)
        values = values[~np.isnan(values)]
        p50, p90 = (np.percentile(values, [50, 90]) if values.size else (None, None))
        out[f"{name}_p50"] = None if p50 is None else float(p50)
        out[f"{name}_p90"] = None if p90 is None else float(p90)
    return out


class StepLog:
    """Prints and writes steps on rank 0; everything is a no-op elsewhere."""

    def __init__(self, json_path: str | None, lead: bool, samples_per_step: int):
        self.lead, self.samples = lead, samples_per_step
        self.sink = ResultSink(json_path) if lead and json_path else None
        self.run_id = new_run_id()

    def header(self, record: dict[str, Any], lines: list[str]) -> None:
        if not self.lead:
            return
        if self.sink:
            self.sink.header({"run_id": self.run_id, **record})
        for line in lines:
            print(f"# {line}", flush=True)
        titles = " ".join(f"{title:>{width}}" for _, title, width in COLUMNS)
        print(f"# {'step':>6} {titles} {'samples/s':>11}", flush=True)

    def step(self, index: int, warmup: bool, values: dict[str, Any]) -> None:
        if not self.lead:
            return
        step_us = values["step_us"]
        rate = self.samples / (step_us * 1e-6) if step_us and self.samples else None  # 0 us, or no samples
        cells = " ".join(f"{_ms(values.get(name)):>{width}}" for name, _, width in COLUMNS)
        shown = "-" if rate is None else f"{rate:.1f}"
        print(f"  {index:>6} {cells} {shown:>11}{'  (warm-up)' if warmup else ''}", flush=True)
        if self.sink:
            self.sink.write(StepRecord(run_id=self.run_id, step=index, warmup=warmup, **values,
                                       samples_per_s=rate))

    def summary(self, result: ProxyResult) -> None:
        if not self.lead:
            return
        if self.sink:
            self.sink.write(result)
            self.sink.close()
        if result.status != "ok":
            return
        if result.telemetry:
            from commbench.telemetry import summary_line

            print(f"# {summary_line(result.telemetry)}")
        rate = "-" if result.samples_per_s is None else f"{result.samples_per_s:.1f}"
        print(f"# median {_cells(result, 'p50')} {rate:>11}"
              + (f"   (of {result.steps} measured step{'s' if result.steps != 1 else ''}: a sample, not a "
                 f"distribution)" if result.steps < 3 and result.kind != "predicted" else ""))
        print(f"# p90    {_cells(result, 'p90')}", flush=True)
        if result.compute_us_p50 is not None and result.steps > 1:
            print("# each column's own median and p90: a step's columns add up (compute + exposed + other = step), "
                  "their medians need not", flush=True)


def _cells(result: ProxyResult, stat: str) -> str:
    return " ".join(f"{_ms(getattr(result, f'{name}_{stat}')):>{width}}" for name, _, width in COLUMNS)


def _ms(value_us: float | None) -> str:
    return "-" if value_us is None or value_us != value_us else f"{value_us / 1e3:.2f}"
