"""`commbench predict-scaling`: a model's data-parallel step time, throughput and linearity from 1 to N GPUs,
predicted by the cost model (nothing measured): its options, the curves it compares, and the table it prints.

commbench.analysis is imported inside the functions: analysis.predict_scaling pulls scipy (~0.4 s), which
`commbench --help` and every other command would pay for at the top."""
from __future__ import annotations

import click

from commbench.algorithms import LIBRARY, TABLE
from commbench.commands import scale as L
from commbench.commands.helpers import options as O
from commbench.commands.helpers.common import UsageFault, check_outputs, note_lines, output_options, write_records
from commbench.commands.helpers.hw_option import hw_option, load_hw
from commbench.commands.helpers.setup_flags import settle_setup, setup_options
from commbench.commands.predict_layouts import LAYOUT_PARAMS, layout_options, layouts_command, only_data_parallel
from commbench.proxies.profile import ProfileError, load_profile
from commbench.proxies.setups import DEFAULT_SETUP, SETUPS
from commbench.results import new_run_id

DEFAULT_GPUS = "1,8,16,32,64,128,256,512,1000"
TFLOPS = O.Range(1e-9, 1e9)  # 1 kFLOP/s to 1 EFLOP/s a GPU: below it a step lasts past any figure printed
MAX_GPUS = 1 << 20  # predict-scaling's layouts and closed forms stay exact and fast up to here


@click.command("predict-scaling", epilog="""
\b
Examples:
  commbench predict-scaling resnet50 --hw dgx1-v100-4ib --gpus 1,8,16 --batch 32 --throughput-1gpu 329 --ddp-ms 3
  commbench predict-scaling bert-large --hw dgx-a100 --gpus 8,64,512,1000 --gpus-per-node 8 --batch 4 \\
      --precision amp --baseline nccl --candidate hier --json scaling.jsonl
  commbench predict-scaling resnet50 --hw dgx-a100 --nodes 1,2,4,8 --gpus-per-node 8 --tflops 100   # 8..64 GPUs
""")
@click.argument("model")
@hw_option("Hardware JSON (from fit) or a preset.", required=True)
@click.option("--gpus", default=None, metavar="N,N,...",
              help=f"GPU counts to predict [default: {DEFAULT_GPUS}, unless --nodes or --topology says the scale].")
@click.option("--nodes", default=None, metavar="N,N,...",
              help="Node counts to predict instead of --gpus: N x --gpus-per-node GPUs each.")
@click.option("--gpus-per-node", type=int, default=None, help="[default: the hardware's ranks per node]")
@click.option("--topology", "-T", default=None, metavar="NODESxRANKS",
              help="One layout: short for --nodes NODES --gpus-per-node RANKS.")
@click.option("--batch", type=int, default=None, help="Samples per GPU per step [default: the profile's].")
@click.option("--throughput-1gpu", type=float, default=None, metavar="SAMPLES/S",
              help="Measured 1-GPU training throughput at --batch: sets the compute time per step. Measured in DDP "
                   "on 1 GPU it holds DDP's own work; measured without DDP, give that work as --ddp-ms.")
@click.option("--ddp-ms", type=float, default=0.0, show_default=True, metavar="MS",
              help="DDP's own work per step, measured at 1 GPU: its step in DDP minus without (proxy's header says "
                   "it on this host). Half stretches the backward, half follows the last allreduce.")
@click.option("--jitter-from", type=click.Path(dir_okay=False), default=None, metavar="RUN.jsonl",
              help="A 1-rank proxy or train run's step records: every step of N GPUs waits for the slowest of N "
                   "ranks drawn from their distribution (stragglers; docs/model.md).")
@click.option("--tflops", type=float, default=None,
              help="Achieved device rate (1e12 FLOP/s) for the profile's FLOPs: one rate for every operator, "
                   "in place of the hardware file's compute block (commbench compute).")
@click.option("--precision", type=click.Choice(["fp32", "amp"]), default="fp32", show_default=True,
              help="Which of the hardware's device_tflops to use when neither rate is given and the hardware "
                   "file holds no compute block for the model (a peak: optimistic).")
@click.option("--algorithm", "-A", default="nccl", show_default=True,
              help="nccl (what DDP's NCCL runs: ring or tree, LL/LL128/Simple and channels by NCCL 2.20.3's own "
                   "tuning model), nccl-ring (the library's ring, one channel per NIC) or one of commbench's "
                   f"allreduce schedules: {', '.join(TABLE['allreduce'])} (predict's default auto is the "
                   "schedule commbench's backends pick; there is no nccl in predict).")
@click.option("--bucket-mb", type=float, default=None, help="DDP bucket_cap_mb [default: DDP's own].")
@click.option("--baseline", default=None, metavar="ALGORITHM",
              help="With --candidate: acc_ratio = candidate / baseline.")
@click.option("--candidate", default=None, metavar="ALGORITHM")
@setup_options
@click.option("--baseline-setup", default=None, metavar="NAME",
              help="With --candidate-setup: acc_ratio between two training setups (each with the knobs given).")
@click.option("--candidate-setup", default=None, metavar="NAME")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
              help="One JSON line per GPU count and algorithm (record: scaling, kind: predicted); with --layout, "
                   "one per layout (record: layout).")
@layout_options
@output_options(append=True)
def predict_scaling_command(model, hw_spec, gpus, nodes, gpus_per_node, topology, batch, throughput_1gpu, ddp_ms,
                            jitter_from, tflops, precision, algorithm, bucket_mb, baseline, candidate,
                            json_path, setup, baseline_setup, candidate_setup, force, append, **knobs) -> None:
    """Predict a model's data-parallel step time, throughput and linearity from 1 to N GPUs.

    The proxy's overlap timeline (DDP buckets, allreduce overlapped with the backward)
    with every allreduce costed by the model of --hw: no ranks, nothing measured.
    """
    flags = {name: knobs.pop(name) for name in LAYOUT_PARAMS}
    O.check({"--tflops": (TFLOPS, tflops)})  # both ways: nan, inf, 0 and 1e-300 one line
    scale, gpus_per_node = _scaling_scale(gpus, nodes, gpus_per_node, topology)
    check_outputs(("--json", json_path), force=force, append=append)
    if flags["layouts"]:
        only_data_parallel({"--batch": batch, "--throughput-1gpu": throughput_1gpu, "--ddp-ms": ddp_ms or None,
                             "--jitter-from": jitter_from, "--bucket-mb": bucket_mb, "--baseline": baseline,
                             "--candidate": candidate, "--baseline-setup": baseline_setup,
                             "--candidate-setup": candidate_setup,
                             **{"--" + k.replace("_", "-"): v for k, v in knobs.items()}})
        return layouts_command(model, hw_spec, scale, gpus_per_node, tflops, precision, algorithm, setup, flags,
                                json_path, append)
    O.check({"--bucket-mb": (O.Range(0, 1 << 20, low_open=True), bucket_mb)})
    curves = _curves(setup, algorithm, baseline, candidate, baseline_setup, candidate_setup,
                     {**knobs, "bucket_mb": bucket_mb})
    run = _scaling_run(model, hw_spec, scale, gpus_per_node, batch, throughput_1gpu, tflops, precision, curves,
                       ddp_ms, jitter_from)
    records = run.records(new_run_id())
    for line in _scaling_table(run, records):
        click.echo(line)
    if json_path:
        write_records(json_path, records, append)


def _scaling_scale(gpus: str | None, nodes: str | None, gpus_per_node: int | None, topology: str | None):
    """(scale, GPUs per node or None) from the three ways to say it: scale is ("gpus", counts) or ("nodes",
    counts), the GPUs of a node count made once the hardware's node size is known. --nodes or --topology
    beside --gpus, or a --topology that --nodes/--gpus-per-node contradict, is one line."""
    if gpus is not None and (nodes is not None or topology is not None):
        raise UsageFault(f"--gpus and {'--nodes' if nodes is not None else '--topology'} both say the scale: give "
                         f"one (--nodes N,... counts nodes of --gpus-per-node GPUs)")
    node_counts = _counts("--nodes", nodes, "node", MAX_GPUS) if nodes is not None else None
    if node_counts and len(node_counts) > 1 and topology is not None:
        raise UsageFault(f"--topology {topology} and --nodes {nodes} disagree: say the scale once ({L.SHORT_FORM})")
    said = L.settle(topology, node_counts[0] if node_counts else None, gpus_per_node)
    if topology is not None:
        node_counts = [said.nodes]
    if node_counts is not None:
        return ("nodes", node_counts), said.per_node
    return ("gpus", _counts("--gpus", gpus or DEFAULT_GPUS, "GPU", MAX_GPUS)), said.per_node


def _curves(setup: str, algorithm: str, baseline: str | None, candidate: str | None, baseline_setup: str | None,
            candidate_setup: str | None, knobs: dict):
    """The (setup, algorithm) pairs to predict and the curves acc_ratio compares: --baseline/--candidate pick two
    algorithms, --baseline-setup/--candidate-setup two setups (both: two setup/algorithm pairs)."""
    if (baseline is None) != (candidate is None):
        raise UsageFault("--baseline and --candidate go together (acc_ratio = candidate / baseline)")
    if (baseline_setup is None) != (candidate_setup is None):
        raise UsageFault("--baseline-setup and --candidate-setup go together (acc_ratio = candidate / baseline)")
    if baseline_setup and setup != DEFAULT_SETUP:
        raise UsageFault("--setup with --baseline-setup/--candidate-setup: give the two setups only")
    names = [baseline_setup, candidate_setup] if baseline_setup else [setup]
    algorithms = [baseline, candidate] if baseline else [algorithm]
    if baseline_setup and baseline:
        pairs = [(names[0], algorithms[0]), (names[1], algorithms[1])]
    else:
        pairs = [(n, a) for n in names for a in algorithms]
    for knob, value in knobs.items():  # a knob none of them takes is one line (settle_setup names what they take)
        if value is not None and not any(_takes(n, knob) for n, _ in pairs):
            settle_setup(pairs[0][0], {knob: value})
    chosen = [settle_setup(n, {k: v for k, v in knobs.items() if _takes(n, k)}) for n, _ in pairs]
    from commbench.analysis.predict_scaling import Curves, curve_label  # scipy: this module's docstring

    setups, algs = [n for n, _ in pairs], [a for _, a in pairs]
    labels = [curve_label(n, a, setups, algs) for n, a in pairs]
    two = len(pairs) == 2 and (baseline or baseline_setup)
    return Curves(tuple(zip(chosen, algs)), labels[0] if two else None, labels[1] if two else None)


def _takes(setup: str, knob: str) -> bool:
    return setup in SETUPS and knob in SETUPS[setup].knobs


def _scaling_run(model, hw_spec, scale, gpus_per_node, batch, throughput, tflops, precision, curves, ddp_ms=0.0,
                 jitter_from=None):
    """predict-scaling's options checked (UsageFault: one line, exit 2), then the prediction."""
    from commbench.analysis import predict_scaling as S  # scipy: this module's docstring
    from commbench.analysis.scaling import ScalingError, StepQuestion
    from commbench.costmodel import ALLREDUCE_ALGORITHMS
    from commbench.proxies.setups import Compute

    try:
        profile = load_profile(model)
    except ProfileError as exc:
        raise UsageFault(str(exc)) from exc
    hw = load_hw(hw_spec)
    O.check({"--batch": (O.COUNT, batch), "--gpus-per-node": (O.Range(1, 1 << 20, integer=True), gpus_per_node),
             "--throughput-1gpu": (O.Range(0, 1e12, low_open=True), throughput),
             "--tflops": (TFLOPS, tflops), "--ddp-ms": (O.Range(0, 86400e3), ddp_ms)})
    ratios = None
    if jitter_from:
        from commbench.analysis.stragglers import JitterError, load_ratios

        try:
            ratios = load_ratios(jitter_from)
        except JitterError as exc:
            raise UsageFault(str(exc)) from exc
    block = None
    if not throughput and not tflops and profile.traced is None and profile.transformer is not None and hw.compute:
        from commbench.commands.predict_layouts import compute_block

        found = compute_block(hw, profile.transformer)  # what it lacks is a warning, and one rate instead
        block = found if found[0] is not None else None
    if not throughput and not tflops and not block and not S.peak_tflops(hw, precision) and profile.traced is None:
        raise UsageFault(f"{hw.name} gives no device_tflops for {precision}: pass --throughput-1gpu or --tflops")
    for name in dict.fromkeys(curves.algorithms):
        if name not in ALLREDUCE_ALGORITHMS:
            raise UsageFault(f"unknown allreduce algorithm {name!r}; choose from {', '.join(ALLREDUCE_ALGORITHMS)}")
    per_node = gpus_per_node or hw.ranks_per_node
    kind, counts = scale
    if kind == "nodes":
        counts = [n * per_node for n in counts]
        if max(counts) > MAX_GPUS:
            raise UsageFault(f"--nodes {max(counts) // per_node} x {per_node} GPUs: at most {MAX_GPUS:,d} GPUs")
    batch = batch or profile.default_batch
    try:
        forward, backward, label = S.compute_us(profile, hw, batch, throughput, tflops, precision, block=block,
                                               ranks_per_node=per_node)
        question = StepQuestion(profile, batch, Compute(forward, backward, own_us=ddp_ms * 1e3),
                                compute_label=label)  # each curve its own setup choice and algorithm
        return S.scaling_run(question, hw, counts, per_node, curves, ratios)
    except (ScalingError, ValueError) as exc:  # ValueError: an algorithm costed past its full schedule's reach
        raise UsageFault(str(exc)) from exc


def _counts(flag: str, text: str, what: str, most: int) -> list[int]:
    """A comma list of `what` (GPU, node) counts, each at least 1 and at most `most`, or one line."""
    from commbench.sizes import SizeError, split_list

    try:
        counts = [int(part) for part in split_list(text, flag)]
    except SizeError as exc:
        raise UsageFault(str(exc)) from exc
    except ValueError as exc:
        raise UsageFault(f"{flag} {text!r}: expected a comma list of {what} counts, e.g. 1,8,16") from exc
    if not counts or min(counts) < 1:
        raise UsageFault(f"{flag} {text!r}: {what} counts must be at least 1")
    if max(counts) > most:
        raise UsageFault(f"{flag} {text!r}: at most {most:,d} {what}s")
    return counts


def _scaling_table(run, records) -> list[str]:
    """The table printed on stdout, one line per record; with a fitted hardware file, the step's 80%
    interval beside the step."""
    intervals = any(r.step_interval_us or r.linearity_interval for r in records)
    setups = _shows_setups(records)
    swidth = max([5, *(len(r.setup) for r in records)])
    cells = [_interval_ms(r.step_interval_us) + _FROM.get(r.interval_source, "") for r in records]
    width = max([len("step 80%(ms)"), *map(len, cells)])
    lines = [*note_lines(f"# predict-scaling {run.profile.name} on {run.hw.name} (predicted by the cost model, "
                         f"nothing measured): batch {run.batch} per GPU, compute from {run.compute_label}"),
             "# " + (f"{'setup':>{swidth}} " if setups else "")
             + f"{'algorithm':>9} {'gpus':>6} {'nodes':>6} {'step(ms)':>9} "
             + (f"{'step 80%(ms)':>{width}} " if intervals else "") + f"{'raw step(ms)':>12} "
             + f"{'comm(ms)':>9} {'exposed(ms)':>11} {'samples/s':>11} {'per GPU':>8} {'speedup':>8} {'linearity':>9}"
             + f" {'raw linearity':>13}" + (f" {'acc_ratio':>9}" if run.baseline else "")]
    for r, cell in zip(records, cells):
        lines.append("  " + (f"{r.setup:>{swidth}} " if setups else "")
                     + f"{r.algorithm:>9} {r.gpus:>6} {r.nodes:>6} {r.step_us / 1e3:>9.2f} "
                     + (f"{cell:>{width}} " if intervals else "") + f"{r.raw_step_us / 1e3:>12.2f} "
                     + f"{r.comm_us / 1e3:>9.2f} {r.exposed_comm_us / 1e3:>11.2f} {r.samples_per_s:>11.1f} "
                     f"{r.samples_per_s / r.gpus:>8.1f} {r.speedup:>8.2f} {r.linearity:>9.3f} {r.raw_linearity:>13.3f}"
                     + (f" {r.acc_ratio:>9.3f}" if r.acc_ratio is not None else ""))
    return lines + [wrapped for line in _scaling_notes(run, records, intervals, setups, swidth)
                    for wrapped in note_lines(line)]  # each at most 120 characters (the step terms' was 472)


def _scaling_notes(run, records, intervals: bool, setups: bool, swidth: int) -> list[str]:
    """The `#` notes under the table: what its columns are, the intervals, the terms applied, NCCL's choices."""
    lines = [_estimate_note(records)]
    lines += _interval_notes(run, records) if intervals or _fitted(run.hw) else []
    lines += [f"# {term}" for term in run.terms]
    lines.append(_step_terms_line(run.hw))
    lines.append(f"# DDP's own work: {run.ddp_us / 1e3:.2f} ms per step" + (" (--ddp-ms)" if run.ddp_us else
                 " (none given: --ddp-ms, or a 1-GPU throughput measured in DDP)"))
    for r in records:
        if r.setup != DEFAULT_SETUP or setups:
            knobs = ", ".join(f"{k} {v}" for k, v in (r.knobs or {}).items() if v is not None)
            line = f"# setup {r.setup}: {knobs or 'defaults'} (docs/setups.md)"
            if line not in lines:
                lines.append(line)
    if run.stragglers:
        lines.append("# stragglers (--jitter-from): each step waits for the expected slowest of N ranks: "
                     + ", ".join(f"{r.gpus} GPUs +{r.straggler_us / 1e3:.2f} ms" for r in records
                                 if r.algorithm == records[0].algorithm)
                     + " (a lower bound where N exceeds the steps measured: none longer than the longest)")
    chosen = [r for r in records if getattr(r, "nccl_choices", None)]
    if chosen:
        lines.append("# nccl: what NCCL 2.20.3's tuning model runs per bucket size (size x buckets "
                     "algorithm/protocol channels), docs/model.md")
    for r in chosen:  # each row labelled as the table's are: with two setups, two blocks of the same GPU counts
        lines.append(f"#   {_labelled(r, setups, swidth)}{r.gpus:>6} GPUs: " + "; ".join(
            f"{c['nbytes'] / (1 << 20):.4g} MiB x{c['buckets']} {c['algorithm']}/{c['protocol']} {c['channels']}ch"
            for c in r.nccl_choices))
    return lines


def _step_terms_line(hw) -> str:
    """The step terms applied (commbench/step_terms.py), each with its value and source."""
    from commbench.analysis.predict_scaling import applied_terms

    applied = applied_terms(hw)
    return "# step terms: " + (applied.said() if applied else "none (a fitted file without a step_terms block: its "
                                                              "figures are measured; docs/model.md, Step terms)")


def _estimate_note(records) -> str:
    """What the step and linearity columns are: the calibrated estimate, and the raw columns the model's own; and
    the rows where the calibration's median error takes the linearity to 0, which show the raw figure."""
    clipped = _clipped(records)
    at_zero = (f"; at {_gpus_said(clipped, records)} the corpus's median error takes the linearity to 0 (no finite "
               f"step), so those rows show the raw figure, the interval's upper end raised to hold it"
               if clipped else "")
    if any(r.estimate == "calibrated" for r in records):
        return ("# step(ms), samples/s, speedup, linearity: the calibrated estimate (the raw prediction moved by the "
                "corpus calibration's median error, inside its interval); raw: the cost model's own figure, before it"
                + at_zero)
    if clipped:
        return "# raw: the cost model's own figure, the estimate shown" + at_zero
    return "# raw: the cost model's own figure; no calibration applies here, so the estimate is the raw figure"


def _clipped(records) -> list:
    """Rows with the corpus's interval whose calibrated linearity is 0: their estimate stays the raw figure."""
    return [r for r in records if r.interval_source == "corpus calibration" and r.estimate != "calibrated"]


def _gpus_said(rows, records) -> str:
    """`8 GPUs, 64 GPUs` (each labelled with its setup where the table has a setup column)."""
    setups = _shows_setups(records)
    return ", ".join(dict.fromkeys(f"{_labelled(r, setups)}{r.gpus} GPUs" for r in rows))


def _shows_setups(records) -> bool:
    """Whether the table has a setup column: two setups, or one that is not the default."""
    return len({r.setup for r in records}) > 1 or any(r.setup != DEFAULT_SETUP for r in records)


def _labelled(record, setups: bool, width: int = 0) -> str:
    """The setup's name before a row's figures where the table has a setup column (two setups, or not ddp)."""
    return f"{record.setup:<{width}} " if setups else ""


def _interval_ms(interval) -> str:
    return f"[{interval[0] / 1e3:.2f}-{interval[1] / 1e3:.2f}]" if interval else "-"


_FROM = {"fit resamples": " fit", "corpus calibration": " corpus"}  # the interval's provenance, beside it


def _but_at_zero(records) -> str:
    """Where the centred linearity is 0, the estimate shown is the raw figure: said beside "the estimate shown"."""
    clipped = _clipped(records)
    return f", but at {_gpus_said(clipped, records)}: 0, so the raw figure is shown" if clipped else ""


def _fitted(hw) -> bool:
    return hw.meta.get("uncertainty") is not None


def _interval_notes(run, records) -> list[str]:
    """What the interval column means, and why a row of a fitted file has none."""
    lines = []
    if any(r.interval_source == "fit resamples" for r in records):
        lines.append("# step 80%(ms) fit: the step's 80% interval, its communication costed on the fit without "
                     "each of its points, spread by that point's error (jackknife+), compute as given "
                     "(docs/model.md, Uncertainty)")
    corpus = [r for r in records if r.interval_source == "corpus calibration"]
    if corpus and run.calibration:
        low, high = run.calibration.bounds()
        setups = _shows_setups(records)
        each = ", ".join(f"{_labelled(r, setups)}{r.gpus} GPUs [{r.linearity_interval[0]:.3f}-"
                         f"{r.linearity_interval[1]:.3f}]" for r in corpus)
        lines.append(f"# step 80%(ms) corpus: corpus calibration, not a fit: split conformal on the linearity errors "
                     f"of {len(run.calibration.residuals)} published rows from {len(set(run.calibration.sources))} "
                     f"sources (analysis/corpus/, docs/model.md): linearity {100 * low:+.1f} to {100 * high:+.1f} "
                     f"points around the raw prediction, centred by their median {100 * run.calibration.centre():+.1f} "
                     f"points (the estimate shown{_but_at_zero(records)}); linearity 80%: {each}")
    if any(r.algorithm == LIBRARY and not r.step_interval_us and r.gpus > 1 for r in records):
        lines.append(f"# {LIBRARY}: no interval: NCCL's tuning model times its calls with NCCL's own latency "
                     f"constants, which no fit measured (give -A ring or hier for an interval from the fit)")
    levels = run.hw.meta.get("levels_fitted") or {}
    unmeasured = [name for name in ("intra", "inter") if not levels.get(name)]
    if any(r.step_interval_us is None and r.algorithm != LIBRARY and r.gpus > 1 for r in records) and unmeasured \
            and _fitted(run.hw):
        lines.append(f"# -: no interval where the layout crosses the {' and '.join(unmeasured)} level, which the fit "
                     f"did not measure")
    if run.hw.meta.get("uncertainty") and any(r.gpus == 1 for r in records):
        lines.append("# 1 GPU: no interval (no communication to spread: its step is the compute as given)")
    return lines
