"""`check` for runs of a parallel layout (records that carry `layout`: `proxy --layout`, `train --layout`):
the step analysis/predict_layout.py predicts for the run's model, layout, micro-batches and compute rate on
the fitted hardware, against the run's median step, and its exposed communication against the replay's.

Only a replay whose compute is FLOPs at a given rate (`--tflops`, `compute: flops`) is predicted: its compute
is then exactly what the prediction assumes, so the rows check the communication and the pipeline. A run
whose compute rate is not known (training, or a replay measuring its compute) is left out with the reason:
benchmarks/layouts_accuracy.py fits a rate on one layout and predicts the others from it."""
from __future__ import annotations

from dataclasses import dataclass, fields

from commbench.analysis.predict_layout import Job, predict_layout
from commbench.costmodel import Hardware
from commbench.proxies.layouts.calls import CHECKPOINTING
from commbench.proxies.layouts.parallelism import LayoutError, Parallelism
from commbench.proxies.profile import ProfileError, load_profile
from commbench.topology import Topology

LAYOUT_FIELDS = {f.name for f in fields(Parallelism)}
MAX_MICROBATCHES = 4096  # a step's micro-batches, as predict-scaling --layout caps them (the pipeline grows with them)
TFLOPS_RANGE = (1e-9, 1e6)  # a replay's --tflops, per rank: anything outside is a damaged file


class LayoutCheckError(ValueError):
    """Why a layout run cannot be predicted (one line, for check's notes)."""


@dataclass(frozen=True)
class LayoutCheck:
    setup: str  # the row's setup column: model, layout, micro-batches, rate, backend/algorithm, topology
    step_us: float  # predicted step
    exposed_us: float  # predicted communication the step waits for (a replay's comm_us is its exposed time)


def parallelism_of(record: dict) -> Parallelism:
    """The layout a record carries (Parallelism.to_dict), or LayoutCheckError."""
    layout = record.get("layout")
    if not isinstance(layout, dict):
        raise LayoutCheckError(f"{record.get('model')}: the record carries no layout")
    try:
        par = Parallelism(**{k: v for k, v in layout.items() if k in LAYOUT_FIELDS})
        par.check()  # whole degrees of at least 1 (a damaged file may hold anything)
        if par.microbatches > MAX_MICROBATCHES:
            raise ValueError(f"{par.microbatches} micro-batches, more than {MAX_MICROBATCHES}")
        return par
    except (TypeError, ValueError) as exc:  # LayoutError is a ValueError
        raise LayoutCheckError(f"{record.get('model')}: its layout {layout.get('layout')!r} is damaged "
                               f"({exc})") from exc


def check_layout_run(record: dict, config: dict, hw: Hardware, algorithm: str) -> LayoutCheck:
    """The prediction of one layout run (a proxy record and its header's config), or LayoutCheckError."""
    par = parallelism_of(record)
    name = f"{record.get('model')} {par.name}"
    if record.get("kind") != "proxy" or config.get("compute") != "flops" or not config.get("tflops"):
        raise LayoutCheckError(f"{name} ({record.get('kind')}): its compute rate is not known (only a replay's "
                               "--tflops is); benchmarks/layouts_accuracy.py fits one; left out")
    try:
        profile = load_profile(record["model"])
    except (ProfileError, ValueError) as exc:
        raise LayoutCheckError(f"{record['model']}: {exc}") from exc
    if profile.transformer is None:
        raise LayoutCheckError(f"{name}: the profile has no transformer shape; left out")
    world, nodes = int(record.get("world_size") or 0), int(record.get("nnodes") or 1)
    if world != par.world or nodes < 1 or world % nodes:
        raise LayoutCheckError(f"{name}: {world} rank(s) on {nodes} node(s) do not hold the layout; left out")
    topo = Topology(nodes, world // nodes)
    microbatch, tflops, checkpointing = _run_settings(name, config)
    job = Job(profile.transformer, profile, hw, topo.ranks_per_node, microbatch, tflops,
              checkpointing, algorithm)
    try:
        par.check(world, topo.ranks_per_node, profile.transformer)
        prediction = predict_layout(job, par)
    except LayoutError as exc:
        raise LayoutCheckError(f"{name}: {exc}; left out") from exc
    setup = (f"{name} mb{par.microbatches}x{microbatch} at {job.tflops:g} TFLOP/s, "
             f"{record.get('backend')}/{algorithm}, {topo}")
    return LayoutCheck(setup, prediction.step_us, sum(prediction.exposed_us.values()))


def _run_settings(name: str, config: dict) -> tuple[int, float, str]:
    """(sequences a micro-batch, TFLOP/s, checkpointing) of a replay's header config, or LayoutCheckError."""
    microbatch, tflops = config.get("microbatch") or 1, config.get("tflops")
    checkpointing = config.get("checkpointing") or "none"
    if not isinstance(microbatch, int) or isinstance(microbatch, bool) or not 1 <= microbatch <= 1 << 20:
        raise LayoutCheckError(f"{name}: its header's microbatch {microbatch!r} is not a whole number of sequences")
    if not isinstance(tflops, (int, float)) or isinstance(tflops, bool) or \
            not TFLOPS_RANGE[0] <= tflops <= TFLOPS_RANGE[1]:
        raise LayoutCheckError(f"{name}: its header's tflops {tflops!r} is not a rate between {TFLOPS_RANGE[0]:g} "
                               f"and {TFLOPS_RANGE[1]:g}")
    if checkpointing not in CHECKPOINTING:
        raise LayoutCheckError(f"{name}: its header's checkpointing {checkpointing!r} is not one of "
                               f"{', '.join(CHECKPOINTING)}")
    return microbatch, float(tflops), checkpointing
