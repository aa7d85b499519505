"""`commbench tune`: measure every algorithm of a schedule backend, paired, and write the tuning
table `auto` follows (commbench/tuning.py).

Each round sweeps every algorithm once (`commbench sweep --algorithm NAME`, one job each), in
table order on even rounds and reversed on odd ones (A B, B A: a machine that speeds up or slows
down during the run favours none). Per size, each algorithm's time is divided by the fastest
time of its own round, and the algorithm with the lowest median ratio wins; consecutive sizes
with one winner become one row of the table (the last row has no upper bound).
"""
from __future__ import annotations

import datetime
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

import click
import numpy as np

from commbench.commands.helpers.common import UsageFault, check_outputs, output_options
from commbench.commands.helpers.hw_option import hw_option
from commbench.errors import EXIT_FAULT
from commbench.lifetime import end_session


@dataclass(frozen=True)
class TuneOptions:
    """tune's command line, built once from click (as sweep's and proxy's options are)."""
    backend: str
    nprocs: int | None
    sizes: str
    collective: str
    algorithm_names: str | None
    rounds: int
    placement: str
    topology: str | None
    cuda_mode: str | None
    hw: str | None
    graph: bool
    iters: int | None
    warmup: int | None
    min_time: float | None
    timeout_s: float
    output: str
    json_path: str | None
    force: bool


class TuneTimeout(click.ClickException):
    exit_code = EXIT_FAULT  # as a job past its --timeout


def _sweep_args(o: TuneOptions, algorithm: str, path: str, timeout_s: float) -> list[str]:
    args = ["sweep", "--backend", o.backend, "-c", o.collective, "--sizes", o.sizes, "--algorithm", algorithm,
            "--placement", o.placement, "--json", path, "--timeout", f"{timeout_s:.1f}"]
    for flag, value in (("-N", o.nprocs), ("--topology", o.topology), ("--cuda-mode", o.cuda_mode), ("--hw", o.hw),
                        ("--iters", o.iters), ("--warmup", o.warmup), ("--min-time", o.min_time)):
        if value is not None:
            args += [flag, str(value)]
    return args + (["--graph"] if o.graph else [])


def _run_sweep(options: TuneOptions, algorithm: str, path: str, timeout_s: float) -> tuple[list[dict], str | None]:
    """(result records, None) of one sweep given `timeout_s` (what is left of the tune's), or ([], its last
    error line)."""
    from commbench.launch import rank_argv
    from commbench.results import read_records

    # As a rank starts (`python -P -m`): `-m` alone would put the working directory first on the
    # import path, and a `uuid.py` there would run in every sweep (issue 48).
    # its own session, so that the tune's deadline (a sweep's --timeout bounds a hang, not a long run) or the
    # tune's own end ends the sweep's ranks too: SIGTERM ends a sweep as Ctrl-C does, its ranks with it
    proc = subprocess.Popen([*rank_argv("commbench"), *_sweep_args(options, algorithm, path, timeout_s)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _, stderr = proc.communicate(timeout=timeout_s + 5)
    except subprocess.TimeoutExpired:
        end_session(proc)
        return [], f"the sweep was still running at the tune's --timeout ({timeout_s:.0f} s left for it)"
    except BaseException:  # Ctrl-C or SIGTERM of the tune: its sweep ends with it
        end_session(proc)
        raise
    if proc.returncode != 0:
        lines = [line for line in stderr.splitlines() if line.strip()]
        return [], lines[-1] if lines else f"exit {proc.returncode}"
    return [r for r in read_records(path) if r["record"] == "result"], None


def _keep(o: TuneOptions, names: list[str], records: list[dict], rounds: list, ran_out: bool) -> None:
    """Every sweep's records into --json, whatever ended the tune; TuneTimeout when --timeout came before the
    first round ended (nothing to table)."""
    if o.json_path and records:
        with open(o.json_path, "w", encoding="utf-8") as handle:
            handle.writelines(json.dumps(r) + "\n" for r in records)
    if ran_out and not rounds:
        kept = f"; its sweeps' records are in {o.json_path}" if o.json_path and records else ""
        raise TuneTimeout(f"--timeout {o.timeout_s:g} s reached before one round of {len(names)} sweeps ended: "
                          f"no table written{kept} (give more time, fewer --sizes or --algorithms)")


def winners(rounds: list[dict[str, dict[int, float]]]) -> dict[int, tuple[str, dict[str, float]]]:
    """Per size: (winner, each algorithm's median ratio to its round's fastest) from rounds of
    {algorithm: {nbytes: time_us}}."""
    sizes = sorted({n for rnd in rounds for times in rnd.values() for n in times})
    out = {}
    for nbytes in sizes:
        ratios: dict[str, list[float]] = {}
        for rnd in rounds:
            times = {alg: t[nbytes] for alg, t in rnd.items() if t.get(nbytes)}
            if times:
                best = min(times.values())
                for alg, time_us in times.items():
                    ratios.setdefault(alg, []).append(time_us / best)
        medians = {alg: float(np.median(r)) for alg, r in ratios.items()}
        if medians:
            out[nbytes] = (min(medians, key=lambda alg: (medians[alg], alg)), medians)
    return out


@click.command("tune")
@click.option("--backend", "-b", default="shm", show_default=True, help="A backend that runs commbench's algorithms.")
@click.option("--nprocs", "-N", type=int, default=None, help="Ranks (as sweep's -N).")
@click.option("--sizes", "-s", default="1K-16M", show_default=True, help="Sizes to measure (as sweep's --sizes).")
@click.option("--collective", "-c", default="allreduce", show_default=True,
              help="The one collective to tune (a name as sweep's -c takes it).")
@click.option("--algorithms", "algorithm_names", default=None, help="Comma-separated; default: every one it has.")
@click.option("--rounds", type=click.IntRange(1, 100), default=2, show_default=True,
              help="Sweeps of every algorithm; even rounds in table order, odd ones reversed.")
@click.option("--placement", type=click.Choice(["in-place", "out-of-place"]), default="in-place", show_default=True,
              help="The buffers measured (as sweep's --placement): their times pick each size's winner.")
@click.option("--topology", "-T", default=None, metavar="NODESxRANKS",
              help="Nodes x ranks per node the algorithms are tuned for (as sweep's -T); the table's rows are "
                   "for this layout [default: one node].")
@click.option("--cuda-mode", default=None, help="cuda: as sweep's --cuda-mode.")
@hw_option("sim: the hardware file that times the calls (from `commbench fit`, or a preset).", name="hw")
@click.option("--graph", is_flag=True, default=False, help="cuda: time under a CUDA graph.")
@click.option("--iters", type=int, default=None,
              help="Timed iterations per point of every sweep (as sweep's --iters) [default: adaptive, to fill "
                   "--min-time].")
@click.option("--warmup", type=int, default=None,
              help="Warm-up iterations per point of every sweep (as sweep's --warmup) [default: adaptive].")
@click.option("--min-time", "min_time", type=float, default=None, metavar="SECONDS",
              help="Adaptive iterations: the time budget of each point's timed calls (as sweep's --min-time) "
                   "[default: sweep's, 0.2].")
@click.option("--timeout", "timeout_s", type=float, default=1800.0, show_default=True,
              help="The whole tune, seconds: each sweep gets what is left; past it the tune stops (exit 3), "
                   "its sweeps' records kept in --json and the table written from the rounds it completed.")
@click.option("--output", "-o", "output", required=True, help="The tuning file to write (JSON).")
@click.option("--json", "json_path", default=None, help="Also keep every sweep's records here (JSON Lines).")
@output_options(append=False)
def tune_command(**given) -> None:
    """Sweep every algorithm of a schedule backend, paired, and write the tuning table `auto` follows
    (use it with sweep/proxy/predict --tuning FILE)."""
    o = TuneOptions(**given)
    from commbench.algorithms import chosen_by
    from commbench.commands.helpers.backend_options import backend_class_of
    from commbench.topology import Topology
    from commbench.tuning import TuningTable, rows_from_winners

    cls = backend_class_of(o.backend)
    if not cls.runs_schedules:
        raise UsageFault(f"--backend {o.backend} runs a library's algorithms: tune a backend that runs "
                         f"commbench's (shm, p2p, hybrid, cuda, sim)")
    table = cls.algorithm_table(o.collective)
    names = list(table) if o.algorithm_names is None else o.algorithm_names.split(",")
    unknown = [n for n in names if n not in table]
    if unknown or not names:
        raise UsageFault(f"--algorithms {','.join(unknown)}: {o.collective} on --backend "
                         f"{o.backend} has {', '.join(table) or 'none'}")
    check_outputs(("--output", o.output), ("--json", o.json_path), force=o.force)
    rounds, records, skipped, ran_out = _measure(o, names)
    _keep(o, names, records, rounds, ran_out)
    if not records:
        raise UsageFault("no algorithm ran: " + "; ".join(f"{n}: {why}" for n, why in skipped.items()))
    first = records[0]
    world, nodes = int(first["world_size"]), int(first["nnodes"])
    won = winners(rounds)
    rows = rows_from_winners(o.collective, world, nodes, [(n, w) for n, (w, _) in won.items()])
    when = datetime.datetime.now(datetime.timezone.utc)
    name = f"tune-{first['library']}-{world}-ranks-{when:%Y-%m-%d}"
    source = (f"commbench tune {' '.join(sys.argv[2:]) if sys.argv[1:2] == ['tune'] else ''}".strip()
              + f"; {socket.gethostname()}, {when:%Y-%m-%d %H:%M} UTC, {len(rounds)} paired round(s)")
    result = TuningTable(name, o.backend, first["library"], source, rows)
    with open(o.output, "w", encoding="utf-8") as handle:
        handle.write(result.to_json())
    topo = Topology(nodes, world // max(nodes, 1))
    click.echo(f"# commbench tune: {o.backend} ({first['library']}), {world} ranks on {nodes} node(s), "
               f"{len(rounds)} round(s); time over the round's fastest, median")
    click.echo("#" + "size (B)".rjust(13) + "".join(n.rjust(10) for n in names) + "    winner   rule's")
    for nbytes, (winner, medians) in won.items():
        rule = chosen_by(o.collective, topo, nbytes)[0]
        click.echo(f"{nbytes:>14}" + "".join(f"{medians[n]:>10.2f}" if n in medians else f"{'-':>10}" for n in names)
                   + f"  {winner:>8} {rule:>8}")
    for name_, why in skipped.items():
        click.echo(f"# {name_} did not run: {why}")
    click.echo(f"# wrote {o.output} ({len(rows)} row(s)); use it with --tuning {o.output}")
    if ran_out:
        raise TuneTimeout(f"--timeout {o.timeout_s:g} s reached after {len(rounds)} of {o.rounds} round(s): the "
                          "table is from those")


def _measure(options: TuneOptions, names: list[str]) -> tuple[list[dict[str, dict[int, float]]], list[dict], dict,
                                                               bool]:
    """The completed rounds of {algorithm: {nbytes: time_us}}, every result record, {algorithm: why it did not
    run}, and whether the tune's --timeout ended it first (a round cut short is not paired: left out). Each
    sweep is said on stderr as it starts, with the time the rest should take."""
    rounds, records, skipped = [], [], {}
    deadline = time.monotonic() + options.timeout_s
    started, done, total = time.monotonic(), 0, options.rounds * len(names)
    with tempfile.TemporaryDirectory(prefix="commbench-tune-") as folder:
        for index in range(options.rounds):
            order = names if index % 2 == 0 else names[::-1]
            times: dict[str, dict[int, float]] = {}
            for algorithm in (a for a in order if a not in skipped):
                left = deadline - time.monotonic()
                if left < 1:
                    return rounds, records, skipped, True
                eta = f", about {(time.monotonic() - started) / done * (total - done):.0f} s left" if done else ""
                click.echo(f"# tune: sweep {done + 1} of {total}: round {index + 1}, {algorithm}{eta}", err=True)
                path = os.path.join(folder, f"{index}-{algorithm}.jsonl")
                results, error = _run_sweep(options, algorithm, path, left)
                done += 1
                if error and deadline - time.monotonic() < 1:  # ended by the tune's --timeout, not its own fault
                    return rounds, records, skipped, True
                if error:
                    skipped[algorithm] = error
                    continue
                records += results
                times[algorithm] = {int(r["nbytes"]): float(r["time_us"]) for r in results
                                    if r["time_us"] is not None and r["placement"] == options.placement}
            rounds.append(times)
    return rounds, records, skipped, False
