"""`check` for runs of a parallel layout (records that carry `layout`: `proxy --layout`, `train --layout`):
the step analysis/predict_layout.py predicts for the run's model, layout, micro-batches and compute rate on
the fitted hardware, against the run's median step, and its exposed communication against the replay's.

A replay whose compute is FLOPs at a given rate (`--tflops`, `compute: flops`) is predicted at that rate: its
compute is then exactly what the prediction assumes, so the rows check the communication and the pipeline.
Any other run (real training, a replay measuring its compute or spinning a block's times) is predicted from the
compute block of `--hw` (`commbench compute`), operator by operator, as predict-scaling --layout predicts it: the
rows then check compute and communication together. Without a block the run is left out with the reason
(benchmarks/layouts_accuracy.py fits a rate on one layout and predicts the others from it).

A replay that measured its compute on the ranks (`proxy --layout --compute measured`) also holds what its ranks
timed of their pieces (the header's `layout_compute_us`, each the slowest rank's: a decoder layer, a CP block, the
embedding, the head, the optimizer's update); with a block, each is set against the same piece costed from the block
(`check_layout_pieces`, through proxies/layouts/pieces.from_block): where a step's error comes from, piece by
piece, the operators measured on the device against the block's model of them."""
from __future__ import annotations

from dataclasses import dataclass, fields, replace

from commbench.analysis.predict_layout import Job, predict_layout
from commbench.costmodel import Hardware
from commbench.proxies.layouts import layer_ops
from commbench.proxies.layouts.calls import CHECKPOINTING
from commbench.proxies.layouts.parallelism import LayoutError, Parallelism
from commbench.proxies.layouts.pieces import RankCompute, from_block
from commbench.proxies.profile import DTYPE_BYTES, ProfileError, load_profile
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


def check_layout_run(record: dict, config: dict, hw: Hardware, algorithm: str,
                     ranks_per_host: int | None = None) -> LayoutCheck:
    """The prediction of one layout run (a proxy record and its header's config), or LayoutCheckError;
    `ranks_per_host`: the ranks that shared the run's host (its header's; emulated nodes share one), which a CPU
    block's cores are shared by (None: a node's ranks)."""
    par = parallelism_of(record)
    name = f"{record.get('model')} {par.name}"
    at_rate = record.get("kind") == "proxy" and config.get("compute") == "flops"
    try:
        profile = load_profile(record["model"])
    except (ProfileError, ValueError) as exc:
        raise LayoutCheckError(f"{record['model']}: {exc}") from exc
    if profile.transformer is None:
        raise LayoutCheckError(f"{name}: the profile has no transformer shape; left out")
    # `train --layout` trains in float32 (proxies/layouts/train/model.py): 4-byte activations and messages; a replay
    # sends the profile's widths
    trained = record.get("kind") == "train"
    shape = replace(profile.transformer, dtype_bytes=DTYPE_BYTES["float32"]) if trained else profile.transformer
    block, dtype = (None, "") if at_rate else _block(name, record, hw, shape)
    world, nodes = int(record.get("world_size") or 0), int(record.get("nnodes") or 1)
    if world != par.world or nodes < 1 or world % nodes:
        raise LayoutCheckError(f"{name}: {world} rank(s) on {nodes} node(s) do not hold the layout; left out")
    topo = Topology(nodes, world // nodes)
    microbatch, tflops, checkpointing = _run_settings(name, config, rate=block is None)
    job = Job(shape, profile, hw, topo.ranks_per_node, microbatch, tflops, checkpointing, algorithm,
              compute=block, compute_dtype=dtype or "bfloat16", ranks_per_host=ranks_per_host)
    try:
        par.check(world, topo.ranks_per_node, shape)
        prediction = predict_layout(job, par)
    except LayoutError as exc:
        raise LayoutCheckError(f"{name}: {exc}; left out") from exc
    compute = f"the {dtype} compute block" if block else f"{job.tflops:g} TFLOP/s"
    setup = (f"{name} mb{par.microbatches}x{microbatch} at {compute}, "
             f"{record.get('backend')}/{algorithm}, {topo}")
    return LayoutCheck(setup, prediction.step_us, sum(prediction.exposed_us.values()))


PIECE_LIMIT_US = 1e12  # a measured piece beyond this (11.6 days) is a damaged file


def check_layout_pieces(record: dict, header: dict, config: dict, hw: Hardware) -> list[tuple[str, float, float]]:
    """(piece, measured us, predicted us) for each piece a `proxy --layout --compute measured` run timed (its
    header's layout_compute_us: each the slowest rank's, measure_on_ranks) against the same piece costed from the
    compute block of `hw`, the largest over the pipeline's stages as the measured is the largest over its ranks;
    `config` the header's config as check read it. [] for any other run; LayoutCheckError where the pieces cannot
    be set against a block."""
    measured = header.get("layout_compute_us") if isinstance(header, dict) else None
    if record.get("kind") != "proxy" or config.get("compute") != "measured" or not isinstance(measured, dict):
        return []
    par = parallelism_of(record)
    name = f"{record.get('model')} {par.name}"
    try:
        ours = RankCompute(**measured)
    except TypeError as exc:
        raise LayoutCheckError(f"{name}: its header's layout_compute_us is damaged ({exc})") from exc
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v <= PIECE_LIMIT_US
               for v in ours.values()):
        raise LayoutCheckError(f"{name}: its header's layout_compute_us holds a time that is not one")
    try:
        shape = load_profile(record["model"]).transformer
    except (ProfileError, ValueError) as exc:
        raise LayoutCheckError(f"{record['model']}: {exc}") from exc
    if shape is None:
        return []
    block, dtype = _block(name, record, hw, shape)
    microbatch, _, _ = _run_settings(name, config, rate=False)
    stages = [from_block(block, par, shape, microbatch, stage, dtype) for stage in range(par.pp)]
    pairs = [(f.name, getattr(ours, f.name), max(getattr(t, f.name) for t in stages)) for f in fields(RankCompute)]
    return [(piece.removesuffix("_us").replace("_", " "), float(mine), float(model))
            for piece, mine, model in pairs if mine > 0 and model > 0]


def _block(name: str, record: dict, hw: Hardware, shape) -> tuple:
    """(the hardware's compute block, the precision to read it in) for a run whose compute is not a given rate,
    or LayoutCheckError saying why it cannot be predicted."""
    unknown = f"{name} ({record.get('kind')}): its compute is not a replay's --tflops"
    if hw.compute is None:
        raise LayoutCheckError(f"{unknown} and {hw.name} has no compute block (`commbench compute` measures one); "
                               "its compute rate is not known; left out")
    dtype, lacks = layer_ops.reading(hw.compute, shape)
    if lacks:
        raise LayoutCheckError(f"{unknown} and {hw.name}'s compute block lacks {', '.join(lacks)}; left out")
    return hw.compute, dtype


def _run_settings(name: str, config: dict, rate: bool = True) -> tuple[int, float, str]:
    """(sequences a micro-batch, TFLOP/s (0 where `rate` is not wanted), checkpointing) of a run's header config,
    or LayoutCheckError."""
    microbatch, tflops = config.get("microbatch") or 1, config.get("tflops") if rate else 0.0
    checkpointing = config.get("checkpointing") or "none"
    if not isinstance(microbatch, int) or isinstance(microbatch, bool) or not 1 <= microbatch <= 1 << 20:
        raise LayoutCheckError(f"{name}: its header's microbatch {microbatch!r} is not a whole number of sequences")
    if rate and (not isinstance(tflops, (int, float)) or isinstance(tflops, bool) or
                 not TFLOPS_RANGE[0] <= tflops <= TFLOPS_RANGE[1]):
        raise LayoutCheckError(f"{name}: its header's tflops {tflops!r} is not a rate between {TFLOPS_RANGE[0]:g} "
                               f"and {TFLOPS_RANGE[1]:g}")
    if checkpointing not in CHECKPOINTING:
        raise LayoutCheckError(f"{name}: its header's checkpointing {checkpointing!r} is not one of "
                               f"{', '.join(CHECKPOINTING)}")
    return microbatch, float(tflops), checkpointing
