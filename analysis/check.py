"""A prediction checked against the user's own run: `commbench check RUN.jsonl --hw HW.json`.

For each measured point of a sweep (a result record) the cost model predicts the same call
(its collective, size, dtype, ranks, nodes and schedule, costed as fit.predict_records does); for each proxy
replay (a proxy record of kind proxy) it predicts the same step (its model, batch, buckets and
compute on its nodes x ranks: scaling.predict_step; a parallel layout's replay: check_layout.py). Each row
gives measured, predicted and the error, predicted / measured - 1 (negative: the model is optimistic); the summary
gives the median and largest |error| over all rows and over the points of at least 64 KiB (where issue
targets are set: small calls are latency, which the model fits least well). A model from `fit`
carries its leave-one-out refits (intervals.py): each row then has its 80% interval, and the
summary the coverage, the share of measured values inside their interval (80% is what an honest interval gives).
A run whose CPU ranks outnumber its host's cores (its header says both) is oversubscribed:
the model has no notion of cores, so its rows are marked and left out of the summary.
A run measured with another backend, library or host than the fit's (provenance.py) is left
out, with one note per run naming both.
"""
from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass

import numpy as np

from commbench.algorithms import LIBRARY_ALGORITHM
from commbench.analysis.fit_points import FitError, schedule_for, setup_of
from commbench.analysis.hosts import run_loads
from commbench.analysis.intervals import interval_us, levels_fitted, schedule_interval_us
from commbench.analysis.provenance import headers_by_run, mismatch
from commbench.backends.registry import record_capabilities
from commbench.collectives import DTYPES
from commbench.costmodel import Hardware, form_us
from commbench.sizes import format_size
from commbench.topology import Topology

LARGE_BYTES = 64 << 10


@dataclass(frozen=True)
class Row:
    kind: str  # sweep, proxy (a replay), train (real DDP training, its compute taken from its replay) or compute (a
    # layout replay's measured piece against the compute block's)
    setup: str  # backend/algorithm, ranks, nodes (sweep) or model, backend, layout (proxy)
    what: str  # collective and size, or "step" / "comm"
    nbytes: int  # the call's size; a proxy step: its gradients
    measured_us: float
    predicted_us: float
    interval_us: tuple[float, float] | None = None  # the prediction's 80% interval (a fitted model's)
    oversubscribed: str | None = None  # "N ranks on C cores": CPU ranks beyond their host's cores (not judged)

    @property
    def error(self) -> float:
        return self.predicted_us / self.measured_us - 1.0

    @property
    def inside(self) -> bool | None:
        """Whether the measured time falls inside the prediction's interval (None: no interval)."""
        if self.interval_us is None:
            return None
        return self.interval_us[0] <= self.measured_us <= self.interval_us[1]

    def to_json(self) -> dict:
        return {"record": "check", "kind": self.kind, "setup": self.setup, "what": self.what, "nbytes": self.nbytes,
                "measured_us": self.measured_us, "predicted_us": self.predicted_us, "error": self.error,
                "interval_us": list(self.interval_us) if self.interval_us else None, "inside": self.inside,
                "oversubscribed": self.oversubscribed}


def check(records: list[dict], hw: Hardware) -> tuple[list[Row], list[str]]:
    """(rows, notes): every point of `records` the model can predict, and one note per kind it cannot."""
    notes: list[str] = []
    records, foreign = applicable(records, hw)
    rows = _sweep_rows(records, hw, notes) + _proxy_rows(records, hw, notes) + _trace_rows(records, hw, notes)
    return rows, foreign + notes


def applicable(records: list[dict], hw: Hardware) -> tuple[list[dict], list[str]]:
    """(records, notes): the result and proxy records of runs the fit applies to (with every other
    record), and one note per run left out, naming what it and the fit were measured with."""
    headers, left_out = headers_by_run(records), Counter()
    kept = []
    for r in records:
        why = mismatch(hw.meta, r, headers.get(r.get("run_id"))) if r.get("record") in ("result", "proxy") \
            and r.get("kind", "measured") != "predicted" else None
        if why:
            left_out[(os.path.basename(str(r.get("_file") or r.get("run_id") or "?")), why)] += 1
        else:
            kept.append(r)
    return kept, [f"{source}: {count} record(s) left out, {why} ({hw.name}): fit their own sweep to predict them"
                  for (source, why), count in left_out.items()]


def _config(headers: dict, record: dict) -> dict:
    """The config of a record's run, from its header ({}: none, or not an object in a damaged file)."""
    config = (headers.get(record.get("run_id")) or {}).get("config")
    return config if isinstance(config, dict) else {}


def _marked(setup: str, record: dict, loads: dict) -> tuple[str, str | None]:
    """The row's setup and its oversubscription ("N ranks on C cores"), from its run's header."""
    load = loads.get(record.get("run_id"))
    over = load.oversubscribed if load is not None else None
    return (f"{setup}, oversubscribed: {over}" if over else setup), over


def _sweep_rows(records: list[dict], hw: Hardware, notes: list[str]) -> list[Row]:
    measured = [r for r in records if r.get("record") == "result" and r.get("kind", "measured") == "measured"
                and r.get("time_us") and record_capabilities(r).measured]
    usable = [r for r in measured if r["collective"] in LIBRARY_ALGORITHM]
    if len(usable) < len(measured):
        notes.append(f"{len(measured) - len(usable)} point(s) of collectives the model has no schedule for: left out")
    rows, loads = [], run_loads(records)
    for r in usable:
        try:
            topo, form = schedule_for(r)  # built once: the prediction and its interval cost the same rounds
        except FitError as exc:
            notes.append(str(exc))
            continue
        itemsize = DTYPES[r["dtype"]].itemsize
        predicted = form_us(form, topo, hw, itemsize)  # as fit.predict_records costs a record
        interval = schedule_interval_us(hw, form, topo, itemsize, float(predicted))
        what = f"{r['collective']} {format_size(int(r['nbytes'])).replace(' ', '')} {r.get('placement', '')}"
        nodes = int(r.get("nnodes") or 1)
        setup, over = _marked(f"{setup_of(r)}, {r['world_size']} ranks" + (f" on {nodes} nodes" if nodes > 1 else ""),
                              r, loads)
        rows.append(Row("sweep", setup, what.strip(), int(r["nbytes"]), float(r["time_us"]), float(predicted),
                        interval, over))
    return rows


def _proxy_rows(records: list[dict], hw: Hardware, notes: list[str]) -> list[Row]:
    """A row per proxy replay (kind proxy) and per real training run (kind train) whose compute is known:
    a replay's own measured split (its header's compute_split_us, DDP's own work included), its --tflops,
    or its median compute split as the profile's FLOPs are; a training run takes the split of a proxy
    replay of the same setup in the same files (`proxy --validate` writes both)."""
    headers = {r.get("run_id"): r for r in records if r.get("record") == "header"}
    replays = _measured_replays(records, headers, notes)
    rows, loads = [], run_loads(records)
    for r in records:
        if r.get("record") == "proxy" and r.get("kind") in ("proxy", "train") and r.get("status", "ok") == "ok" \
                and r.get("setup") != "trace":
            rows += _layout_rows(r, headers, loads, hw, notes) if r.get("layout") else \
                _run_rows(r, headers, replays, loads, hw, notes)
    return rows


def _layout_rows(r: dict, headers: dict, loads: dict, hw: Hardware, notes: list[str]) -> list[Row]:
    """The step row, and a replay's exposed-communication row, of a parallel layout's run (check_layout.py)."""
    from commbench.analysis.check_layout import LayoutCheckError, check_layout_pieces, check_layout_run

    cfg = _config(headers, r)
    try:
        load = loads.get(r.get("run_id"))  # a host holds at most the run's ranks, whatever its header lists
        host = max(1, min(load.ranks_per_host, int(r.get("world_size") or 1))) if load is not None else None
        checked = check_layout_run(r, cfg, hw, LIBRARY_ALGORITHM["allreduce"], ranks_per_host=host)
    except LayoutCheckError as exc:
        notes.append(str(exc))
        return []
    setup, over = _marked(checked.setup, r, loads)
    nbytes = int(r.get("gradient_bytes") or 0)
    rows = [Row("proxy", setup, "step", nbytes, float(r["step_us_p50"]), checked.step_us, None, over)]
    if r.get("comm_us_p50"):
        rows.append(Row("proxy", setup, "comm", nbytes, float(r["comm_us_p50"]), checked.exposed_us, None, over))
    try:
        pieces = check_layout_pieces(r, headers.get(r.get("run_id")) or {}, cfg, hw)
    except LayoutCheckError as exc:
        notes.append(str(exc))
        pieces = []
    label = f"{r.get('model')} {r['layout'].get('layout')} pieces (slowest rank)"
    return rows + [Row("compute", label, piece, 0, measured, predicted, None, over)
                   for piece, measured, predicted in pieces]


def _trace_rows(records: list[dict], hw: Hardware, notes: list[str]) -> list[Row]:
    """A step row and a comm row per replay of a user's trace (`commbench replay`): the same trace's calls and
    traced compute predicted (analysis/predict_trace.py) against the replay's medians."""
    from commbench.analysis.predict_trace import predict_trace
    from commbench.proxies.traces.calls import TraceError
    from commbench.proxies.traces.files import read_traces

    headers = {r.get("run_id"): r for r in records if r.get("record") == "header"}
    rows, loads = [], run_loads(records)
    for r in records:
        if r.get("record") != "proxy" or r.get("setup") != "trace" or r.get("kind") != "proxy" or \
                r.get("status", "ok") != "ok" or not r.get("step_us_p50"):
            continue
        traces = _config(headers, r).get("traces") or []
        nodes = int(r.get("nnodes") or 1)
        try:
            p = predict_trace(read_traces(list(traces)), hw, Topology(nodes, int(r["world_size"]) // nodes))
        except (TraceError, ValueError) as exc:
            notes.append(f"{r.get('model')}: its trace cannot be predicted ({str(exc).splitlines()[0]})")
            continue
        setup, over = _marked(f"{r.get('model')}, {r['world_size']} ranks, {r.get('backend')}", r, loads)
        rows.append(Row("proxy", setup, "step", int(r.get("gradient_bytes") or 0), float(r["step_us_p50"]),
                        p.median(p.steps_us), None, over))
        if r.get("comm_us_p50"):
            rows.append(Row("proxy", setup, "comm", int(r.get("gradient_bytes") or 0), float(r["comm_us_p50"]),
                            p.median(p.comm_us), None, over))
    return rows


def _measured_replays(records: list[dict], headers: dict, notes: list[str]) -> dict[tuple, dict]:
    """A training run's twin, by _setup_key: a replay of its setup whose compute was measured."""
    replays: dict[tuple, dict] = {}
    for r in records:
        cfg = _config(headers, r)
        if r.get("record") == "proxy" and r.get("kind") == "proxy" and r.get("status", "ok") == "ok" \
                and cfg.get("compute") == "measured":
            if _setup_key(r, headers) in replays:
                notes.append(f"several measured replays of {r['model']} b{r.get('batch')} on {r.get('world_size')} "
                             f"ranks: a training run of that setup takes the last one's compute")
            replays[_setup_key(r, headers)] = r
    return replays


def _step_inputs(r: dict, headers: dict, replays: dict, loads: dict, notes: list[str]) -> tuple | None:
    """(profile, topology, compute split, comm_cpu_gbps) of one proxy or training run, or None with a note
    (an unknown model, no step time or whole nodes, a training run without a replay beside it)."""
    from commbench.proxies.profile import ProfileError, load_profile

    cfg = _config(headers, r)
    try:
        profile = load_profile(r["model"])
    except (ProfileError, ValueError) as exc:
        notes.append(f"{r['model']}: {exc}")
        return None
    nodes = int(r.get("nnodes") or 1)
    world = int(r["world_size"])
    if not r.get("step_us_p50") or r["step_us_p50"] <= 0 or nodes < 1 or world % nodes:
        notes.append(f"{r['model']} on {world} rank(s), {nodes} node(s): no step time or no whole nodes in the "
                     f"record; left out")
        return None
    replay = r if r["kind"] == "proxy" else replays.get(_setup_key(r, headers))
    split = _compute_split(r, cfg, profile, (headers.get(replay.get("run_id")) or {}).get("compute_split_us")
                           if replay else None)
    load = loads.get(r.get("run_id"))
    # CPU ranks with no spare core: the communication's threads take CPU from the compute (its replay measured how
    # much per byte); a GPU's, or a rank with a core to spare, takes none
    spare = load is None or load.device != "cpu" or not load.cpus or load.ranks_per_host < load.cpus
    # ... and only a compute that runs on the CPU (measured here): a --compute flops replay sleeps, as a GPU's would
    spun = replay is not None and _config(headers, replay).get("compute") == "measured"
    comm_cpu = replay.get("comm_cpu_gbps") if spun and not spare else None
    if split is None:
        notes.append(f"train run of {r['model']} on {world} rank(s): no proxy replay of the same setup in these "
                     f"files to take its compute from (`proxy --validate` writes both); left out")
        return None
    return profile, Topology(nodes, world // nodes), split, comm_cpu


def _run_rows(r: dict, headers: dict, replays: dict, loads: dict, hw: Hardware, notes: list[str]) -> list[Row]:
    """The step row of one proxy or training run, and a replay's communication row ([]: left out, noted)."""
    from commbench.analysis.scaling import StepQuestion, predict_step, step_interval_us
    from commbench.proxies.setups import DEFAULT_SETUP, Compute

    inputs = _step_inputs(r, headers, replays, loads, notes)
    if inputs is None:
        return []
    profile, topo, split, comm_cpu = inputs
    cfg = _config(headers, r)
    algorithm = cfg.get("algorithm") if record_capabilities(r).schedule else None
    if algorithm in (None, "auto"):
        algorithm = LIBRARY_ALGORITHM["allreduce"]
    try:
        q = StepQuestion.from_record(r, Compute(*split), topo, profile, algorithm=algorithm, comm_cpu_gbps=comm_cpu)
    except ValueError as exc:
        notes.append(f"{r['model']}: {exc}; left out")
        return []
    pred = predict_step(q, topo, hw).times
    kind = "train" if r["kind"] == "train" else "proxy"
    named = "" if q.choice.name == DEFAULT_SETUP else f" {q.choice.name}"
    setup, over = _marked(f"{r['model']} b{q.batch}{named}, {r['backend']}/{algorithm}, {topo}", r, loads)
    # the step's interval spreads its communication only, as predict-scaling's and the sim proxy's do
    interval = step_interval_us(q, topo, hw)
    rows = [Row(kind, setup, "step", int(r["gradient_bytes"]), float(r["step_us_p50"]), float(pred.step_us),
                interval, over)]
    if kind == "proxy" and r.get("comm_us_p50") and topo.world > 1:  # one rank communicates nothing
        rows.append(Row("proxy", setup, "comm", int(r["gradient_bytes"]), float(r["comm_us_p50"]),
                        float(pred.comm_us), interval_us(hw, lambda v: predict_step(q, topo, v).times.comm_us)
                        if levels_fitted(hw, topo) else None, over))
    return rows


def _setup_key(r: dict, headers: dict) -> tuple:
    """What a training run and its replay share (`proxy --validate` runs both alike)."""
    cfg = _config(headers, r)
    return (r.get("model"), r.get("batch"), r.get("world_size"), r.get("nnodes") or 1, r.get("backend"),
            r.get("library"), r.get("device"), r.get("bucket_mb"), r.get("bucketing") or "ddp", bool(cfg.get("amp")),
            r.get("setup") or "ddp", repr(sorted((r.get("knobs") or {}).items())))


def _compute_split(r: dict, cfg: dict, profile, measured: dict | None) -> tuple[float, float, float, float] | None:
    """(forward, backward, optimizer, DDP's own work) microseconds of a run's step, or None (a training run
    with no replay to take it from)."""
    from commbench.proxies.timeline import flops_times_us

    if isinstance(measured, dict) and all(isinstance(measured.get(k), (int, float))
                                          for k in ("forward", "backward", "optimizer")):
        ddp = measured.get("ddp")
        return (float(measured["forward"]), float(measured["backward"]), float(measured["optimizer"]),
                float(ddp) if isinstance(ddp, (int, float)) else 0.0)  # older replays did not measure DDP's work
    if r["kind"] == "train":
        return None
    if cfg.get("compute") == "flops" and cfg.get("tflops"):
        return (*flops_times_us(profile, int(r["batch"]), float(cfg["tflops"])), 0.0, 0.0)
    if cfg.get("compute") == "trace" and profile.traced is not None:
        return (*profile.traced.times_us(int(r["batch"])), 0.0, 0.0)
    if r.get("compute_us_p50"):  # measured compute without its split: split as the profile's FLOPs (or times) are
        forward, backward = profile.compute_work()
        total = forward + backward
        share = forward / total if total else 1 / 3
        return r["compute_us_p50"] * share, r["compute_us_p50"] * (1 - share), 0.0, 0.0
    return 0.0, 0.0, 0.0, 0.0


def summary(rows: list[Row], include_oversubscribed: bool = False) -> dict:
    """Median and largest |error|, over every row but compute pieces, sweep points >= 64 KiB, proxy steps, training
    steps and compute pieces (a measured layout replay's, against the block's); rows of
    oversubscribed runs left out (counted in `oversubscribed_left_out`) unless `include_oversubscribed`."""
    left_out = 0 if include_oversubscribed else sum(1 for r in rows if r.oversubscribed)
    rows = rows if include_oversubscribed else [r for r in rows if not r.oversubscribed]

    def stats(chosen: list[Row]) -> dict:
        errors = np.abs([r.error for r in chosen])
        judged = [r.inside for r in chosen if r.inside is not None]
        return {"rows": len(chosen), "median_abs_error": float(np.median(errors)) if len(chosen) else None,
                "max_abs_error": float(errors.max()) if len(chosen) else None,
                "optimistic": sum(1 for r in chosen if r.error < 0),
                "coverage": sum(judged) / len(judged) if judged else None}  # share inside the 80% interval

    steps = [r for r in rows if r.kind != "compute"]  # a run's compute pieces are judged apart (--max-error: the rest)
    return {"record": "check_summary", "oversubscribed_left_out": left_out, "all": stats(steps),
            "sweep_64k_up": stats([r for r in rows if r.kind == "sweep" and r.nbytes >= LARGE_BYTES]),
            "proxy_steps": stats([r for r in rows if r.kind == "proxy" and r.what == "step"]),
            "train_steps": stats([r for r in rows if r.kind == "train"]),
            "compute_pieces": stats([r for r in rows if r.kind == "compute"])}
