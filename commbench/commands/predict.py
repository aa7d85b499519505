"""`commbench predict`: collective times and bandwidths from the cost model, printed as a sweep's table
(and written as records of kind predicted); no ranks, no GPU."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import click

from commbench import collectives as C
from commbench import tuning
from commbench.algorithms import TABLE
from commbench.commands import scale as L
from commbench.commands.helpers.common import UsageFault, check_outputs, note_lines, output_options
from commbench.commands.helpers.hw_option import hw_option, load_hw, warn_poor
from commbench.costmodel import HardwareError
from commbench.results import CORPUS_PROVENANCE, FIT_PROVENANCE, OutputError, ResultSink
from commbench.sizes import SizeError, parse_sizes
from commbench.table import Table
from commbench.topology import Topology, TopologyError


@dataclass(frozen=True)
class PredictOptions:
    """`predict`'s command line as one frozen value, built once from click's parameters: each field is the
    option's destination name, with click's default."""
    hw_spec: str
    collective_names: tuple[str, ...] = ("allreduce",)
    sizes: str = "1K-1G"
    factor: float | None = None
    dtype: str = "float32"
    nodes: int | None = None
    gpus_per_node: int | None = None
    topology: str | None = None
    algorithm: str = "auto"
    root: int = 0
    tuning_path: str | None = None
    json_path: str | None = None
    force: bool = False
    append: bool = False

    @classmethod
    def from_click(cls, params: dict[str, Any]) -> PredictOptions:
        """The options from click's parameters (a TypeError names an option without a field)."""
        return cls(**params)


@click.command("predict", epilog="""
\b
Examples:
  commbench predict --hw dgx-a100 -c allreduce --sizes 1K-1G --topology 16x8 --algorithm ring
  commbench predict --hw shm-hw.json --sizes 1K-256M --topology 1x2 --algorithm auto --json pred.jsonl
  commbench predict --hw dgx-a100 --nodes 4 --gpus-per-node 8    # = --topology 4x8; --nodes 4 alone: 4 x 8 too
""")
@hw_option("Hardware JSON (from fit) or a preset.", required=True)
@click.option("--collective", "-c", "collective_names", multiple=True, default=("allreduce",), show_default=True,
              metavar="NAME", help="allreduce, allgather, reduce_scatter, broadcast, reduce or alltoall (those "
                                   "commbench has schedules for, which the model costs). Repeatable, or "
                                   "comma-separated.")
@click.option("--sizes", "-s", default="1K-1G", show_default=True, metavar="RANGE|LIST",
              help="Message sizes in bytes, as sweep takes them: a range START-END (binary K/M/G/T suffixes) or a "
                   "comma list (1K,4K,1M).")
@click.option("--factor", "-f", type=float, default=None,
              help="In a range of --sizes: multiply the size by this between steps [default: 2].")
@click.option("--dtype", "-d", default="float32", show_default=True,
              help="Element type (float32, float16, bfloat16, float64, int32, int8, uint8, int64): how many "
                   "elements a size holds, rounded down per collective as nccl-tests does.")
@click.option("--nodes", type=int, default=None, help="Nodes to predict [default: 1 with --gpus-per-node].")
@click.option("--gpus-per-node", type=int, default=None,
              help="Ranks per node [default with --nodes: the hardware's ranks per node].")
@click.option("--topology", "-T", default=None, metavar="NODESxRANKS",
              help="Short for --nodes NODES --gpus-per-node RANKS. One of the two forms is required.")
@click.option("--algorithm", "-A", default="auto", show_default=True,
              help="The schedule of commbench's to cost (" + "; ".join(
                  f"{name}: {', '.join(table)}" for name, table in TABLE.items()) + "), or auto: the one "
                   "commbench's own backends pick for each size (--tuning's table, else the built-in rule; "
                   "docs/algorithms.md). Not predict-scaling's default nccl, NCCL's own choice of ring or tree, "
                   "protocol and channels by its tuning model: predict costs commbench's schedules only.")
@click.option("--root", type=int, default=0, show_default=True,
              help="Root rank of broadcast and reduce (a rank of the topology).")
@click.option("--tuning", "tuning_path", default=None, metavar="FILE",
              help="The tuning table `auto` follows (commbench tune writes one); default: the built-in rule.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
              help="Write the predictions as JSON Lines (kind: predicted).")
@output_options(append=True)
def predict_command(**params) -> None:
    """Predict collective times and bandwidths from the cost model (no ranks needed)."""
    o = PredictOptions.from_click(params)
    said = L.settle(o.topology, o.nodes, o.gpus_per_node)
    if not said.given:
        raise UsageFault("give the scale to predict: --topology NODESxRANKS, or --nodes N --gpus-per-node G")
    hw, topo, names, dt, results = _predict(o, said)
    table = Table(["in-place"], show_algorithm=True)
    ranks = f"{topo.world} rank{'s' if topo.world != 1 else ''}"
    table.comment(f"commbench predict: {hw.name} on {topo} ({ranks}), predicted by the cost model")
    for note in _notes(hw, o.hw_spec, topo, results):
        for line in note_lines(f"# {note}"):  # each at most 120 characters (the corpus's note was 405)
            table.comment(line[2:])
    try:
        with ResultSink(o.json_path, append=o.append) as sink:  # a full disk: the rows and lines before it stay
            for name in names:
                table.header(name)
                for result in (r for r in results if r.collective == name):
                    table.row({"in-place": result}, dt.nccl_name)
                    sink.result(result)
                table.footer(checked=False)
    except OutputError as exc:
        raise UsageFault(str(exc)) from exc


def _predict(o: PredictOptions, said: L.Scale):
    """The options checked (UsageFault: one line, exit 2), then the prediction at the layout `said`:
    (hardware, topology, collective names, dtype, results)."""
    # analysis inside the function: its modules add ~40 ms to every `commbench --help` (commands/fit.py)
    from commbench.analysis.hosts import oversubscription
    from commbench.analysis.intervals import uncertainty
    from commbench.analysis.predict import predict

    try:
        hw = load_hw(o.hw_spec, say_poor=False)
        uncertainty(hw)  # its intervals' block, checked: one line, not a traceback per row
        warn_poor(hw, o.hw_spec)  # after the block is known good: a refusal stays one line
        size_list = parse_sizes(o.sizes, o.factor)
        names = C.resolve_collectives(o.collective_names)
        dt = C.resolve_dtype(o.dtype)
        said = L.complete(said, None, hw.ranks_per_node)
        topo = Topology(said.nodes, said.per_node)
        if not 0 <= o.root < topo.world:
            raise ValueError(f"--root {o.root}: must be a rank in 0..{topo.world - 1}")
        refused = oversubscription(hw, topo.ranks_per_node)  # CPU ranks beyond the fitted host's cores
        if refused:
            raise UsageFault(refused)
        check_outputs(("--json", o.json_path), force=o.force, append=o.append)
        table = tuning.load(o.tuning_path) if o.tuning_path else None
        results = predict(hw, names, size_list, dt, topo, o.algorithm, root=o.root, tuning=table)
    except KeyError as exc:
        raise UsageFault(str(exc).strip("'\"")) from exc
    except (HardwareError, SizeError, TopologyError, ValueError) as exc:
        raise UsageFault(str(exc)) from exc
    return hw, topo, names, dt, results


def _notes(hw, hw_spec: str, topo: Topology, results) -> list[str]:
    """The table's notes: what the hardware file does not say or did not measure, what the intervals are."""
    from commbench.analysis.corpus import collectives as collective_corpus
    from commbench.analysis.predict import row_us

    notes = []
    if hw.meta.get("fitted_from") and "measured_on" not in hw.meta:
        notes.append(f"note: {hw_spec} does not say which host it was fitted on (a fit from before meta.measured_on): "
                     f"CPU ranks beyond that host's cores are predicted as if each had its own (docs/model.md)")
    levels = hw.meta.get("levels_fitted")
    crossed = [level for level, used in (("intra", topo.ranks_per_node > 1), ("inter", topo.nodes > 1))
               if used and isinstance(levels, dict) and not levels.get(level)]
    if crossed:  # a fit's level it did not measure: copied from the other, or taken from --base
        notes.append(f"note: {topo} crosses the {' and '.join(crossed)} level, which {hw_spec} did not measure: "
                     f"its figures there were copied or given (meta.notes), so these times rest on no measurement "
                     f"and their interval is the published corpus's, as without a fit")
    if any(r.interval_source == FIT_PROVENANCE for r in results):
        from commbench.analysis.intervals import wide_note

        notes.append("[low-high] fit after a row: its 80% interval in us, from the fit's resamples (jackknife+: the "
                     "fit without each point, spread by that point's error; docs/model.md)")
        notes += [note for note in [wide_note(hw)] if note]
    if any(r.interval_source == CORPUS_PROVENANCE for r in results):
        low, high = collective_corpus.shipped_bounds(row_us)
        corpus = collective_corpus.load_collectives()
        rows = corpus.calibrated_rows
        notes.append(f"[low-high] corpus after a row: its 80% interval in us, no fit resamples: split-conformal on "
                     f"{len(rows)} published nccl-tests figures ({len({r.source for r in rows})} sources) predicted "
                     f"from their systems' descriptions, x{math.exp(low):.2f} to x{math.exp(high):.2f} the raw time; "
                     f"the time shown is the calibrated estimate, the raw time x"
                     f"{math.exp(collective_corpus.shipped_centre(row_us)):.2f} (their median error), and `raw` after "
                     f"the interval is the cost model's own figure (analysis/corpus/collectives.json, docs/model.md)")
    return notes
