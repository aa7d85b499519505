"""Parallel layouts: replay (`proxy --layout`) and prediction (analysis/predict_layout.py) against real
training (`train --layout`), step time per layout, on local CPU ranks over gloo (or an emulated cluster).

For each layout, in turn: `commbench train llama-tiny --layout L` (transformers' Llama, TP by parallelize_module,
torch.distributed.pipelining, FSDP2), then `commbench proxy llama-tiny --layout L` with the compute emulated at
one rate. The rate is fitted once, on the first layout (the calibration row, whose replay error is then ~0 by
construction): its replay at a nominal rate gives the FLOPs per rank and step and the time that is not compute,
and the rate is the FLOPs over what the training step leaves for compute. Every other layout is predicted
from that one rate. The prediction (`--hw FIT`, a `commbench fit` of this machine's sweep) uses the same rate.
Beside them, `commbench proxy llama-tiny --layout L --compute measured`: the replay with each rank's compute
timed on its own pieces of the model (proxies/layouts/compute.py), no rate and no calibration (its error on the
first layout counts like the others'; the medians leave it out for both replays, so they compare).
Error = replay (or prediction) / training - 1, of the median step (the slowest rank's per step).

    python benchmarks/layouts_accuracy.py --hw fit4.json                      # 4 local ranks
    python benchmarks/layouts_accuracy.py --hw fit4.json --emulate 2x2        # 2 emulated nodes x 2 ranks
    python benchmarks/layouts_accuracy.py --hw fit4.json --compute hw.json    # and from a compute block

The block columns (--compute: a `commbench compute` of llama-tiny's layouts on this host): the replay with each
operator's measured time spun on the ranks (`proxy --compute block`), and the prediction from the same times on
--hw's links: no rate, no calibration, so every layout's error counts, the first's too.

Prints a Markdown table; every run's JSON Lines are kept in --out.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import replace

LAYOUTS = ("fsdp4", "tp2,fsdp2", "pp2,fsdp2", "pp2,fsdp2@interleaved", "tp2,pp2", "cp2,fsdp2")
NOMINAL_TFLOPS = 0.01


def schedule_of(entry: str) -> tuple[str, list[str]]:
    """`LAYOUT` or `LAYOUT@interleaved` (1F1B with 2 virtual stages a rank): the layout and its schedule options."""
    layout, _, schedule = entry.partition("@")
    if schedule not in ("", "1f1b", "gpipe", "interleaved"):
        raise SystemExit(f"{entry!r}: a layout's schedule is @1f1b, @gpipe or @interleaved")
    if not schedule:
        return layout, []
    return layout, ["--pp-schedule", schedule, *(["--virtual-stages", "2"] if schedule == "interleaved" else [])]


def commbench(kind: str, entry: str, args: argparse.Namespace, *extra: str) -> dict:
    """Run `commbench KIND llama-tiny --layout LAYOUT`; its summary record (or {"failed": its last line})."""
    layout, schedule = schedule_of(entry)
    tag = entry.replace(",", "_").replace("@", "_")
    name = f"{kind}-{tag}{''.join(extra).replace('-', '').replace('.', 'p')}.jsonl"
    out = os.path.join(args.out, name)
    cmd = [sys.executable, "-m", "commbench", kind, args.model, "--layout", layout, *schedule,
           *(["--emulate", args.emulate] if args.emulate else ["-N", str(args.nprocs)]), "--steps", str(args.steps),
           "--warmup-steps", str(args.warmup_steps), "--json", out, "--force", *extra]
    pipelined = "pp" in layout
    cmd += ["--microbatch", str(args.sequences // args.microbatches if pipelined else args.sequences)]
    if pipelined:
        cmd += ["--microbatches", str(args.microbatches)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        return {"failed": (proc.stderr.strip().splitlines() or ["?"])[-1]}
    with open(out, encoding="utf-8") as handle:
        records = [json.loads(line) for line in handle]
    summary = records[-1]
    steps = [r for r in records if r.get("record") == "step" and not r.get("warmup")]
    summary["compute_us_p50"] = statistics.median(s["compute_us"] or 0.0 for s in steps)
    return summary


def fit_rate(train_step_us: float, nominal: dict) -> float:
    """The compute rate (TFLOP/s) that makes the calibration layout's replay step equal its training step:
    FLOPs per rank and step over the training step less the replay's time outside compute."""
    flop = nominal["compute_us_p50"] * NOMINAL_TFLOPS * 1e6
    left_us = train_step_us - (nominal["step_us_p50"] - nominal["compute_us_p50"])
    if left_us <= 0:
        raise SystemExit(f"the replay's time outside compute ({nominal['step_us_p50'] - nominal['compute_us_p50']:.0f} "
                         f"us) exceeds the training step ({train_step_us:.0f} us): no rate fits")
    return flop / left_us / 1e6


def predicted_us(entry: str, rate: float, args: argparse.Namespace, block: bool = False) -> float | None:
    """analysis/predict_layout.py's step for the layout at `rate` (with `block`: each operator from --compute's
    compute block, no rate and no calibration), costed by the fitted hardware."""
    if not args.hw or (block and not args.compute):
        return None
    from commbench.analysis.predict_layout import Job, predict_layout
    from commbench.costmodel import load_hardware
    from commbench.proxies.layouts.parallelism import parse_layout
    from commbench.proxies.profile import load_profile

    profile = load_profile(args.model)
    layout, schedule = schedule_of(entry)
    par = parse_layout(layout, "ddp", args.nprocs, pp_schedule=schedule[1] if schedule else "1f1b",
                       virtual_stages=2 if "interleaved" in schedule else 1)
    par = replace(par, microbatches=args.microbatches if par.pp > 1 else 1)
    per_node = int(args.emulate.split("x")[1]) if args.emulate else args.nprocs
    microbatch = args.sequences // par.microbatches
    job = Job(profile.transformer, profile, load_hardware(args.hw), per_node, microbatch, rate, "none", args.algorithm,
              ranks_per_host=args.nprocs if not args.emulate else int(args.emulate.split("x")[0]) * per_node)
    if block:
        compute = load_hardware(args.compute).compute
        job = replace(job, compute=compute, compute_dtype=compute.meta.get("dtype", "float32"))
    return predict_layout(job, par).step_us


def _columns(layout: str, rate: float, args: argparse.Namespace) -> dict:
    """Each column's step for `layout` (microseconds), a run's failure (its last line), or None (not run)."""
    def step(run: dict):
        return run["failed"] if "failed" in run else run["step_us_p50"]

    out = {"replay": step(commbench("proxy", layout, args, "--tflops", f"{rate:.6g}")),
           "measured-compute replay": step(commbench("proxy", layout, args, "--compute", "measured")),
           "predicted": predicted_us(layout, rate, args)}
    if args.compute:
        out["block replay"] = step(commbench("proxy", layout, args, "--compute", "block", "--hw", args.compute))
        out["block-predicted"] = predicted_us(layout, rate, args, block=True)
    return out


def table(layouts: list[str], trained: dict, rate: float, args: argparse.Namespace) -> None:
    """Each layout trained (unless done), replayed and predicted: a Markdown row each, then the medians. The
    block columns calibrate nothing, so their errors count on every layout, the first's too."""
    names = ["replay", "measured-compute replay", "predicted"] + (["block replay", "block-predicted"]
                                                                   if args.compute else [])
    print("| layout | train step (ms) | " + " | ".join(f"{n} (ms) | its error" for n in names) + " |")
    print("|---|---|" + "---|---|" * len(names))
    errors: dict[str, list[float]] = {n: [] for n in names}
    steps: dict[str, dict[str, float]] = {n: {} for n in ["train", *names]}
    for layout in layouts:
        train = trained.get(layout) or commbench("train", layout, args)
        columns = _columns(layout, rate, args)
        if "failed" in train or isinstance(columns["replay"], str):
            print(f"| `{layout}` | {train.get('failed', '')} | {columns['replay']} |" + " |" * (2 * len(names) - 1))
            continue
        t = train["step_us_p50"]
        steps["train"][layout] = t
        cells = [f"{t / 1e3:.2f}"]
        for name in names:
            value = columns[name]
            if value is None or isinstance(value, str):
                cells += [value or "", ""]
                continue
            steps[name][layout] = value
            cells += [f"{value / 1e3:.2f}", f"{100 * (value / t - 1):+.1f}%"]
            if name.startswith("block") or layout != layouts[0]:
                errors[name].append(abs(value / t - 1))
        print(f"| `{layout}`{' (calibration)' if layout == layouts[0] else ''} | " + " | ".join(cells) + " |",
              flush=True)
    summary(errors, steps)


def summary(errors: dict, steps: dict) -> None:
    """The medians of each column's errors and each column's ranking."""
    for what, values in errors.items():
        if values:
            which = "none calibrated" if what.startswith("block") else "besides the calibration"
            print(f"# {what}: median |error| {100 * statistics.median(values):.1f}%, max {100 * max(values):.1f}% "
                  f"over {len(values)} layout(s) ({which})")
    for what, by_layout in steps.items():
        if by_layout:
            print(f"# ranking, fastest first, {what}: {' < '.join(sorted(by_layout, key=by_layout.get))}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama-tiny")
    parser.add_argument("--layouts", default=";".join(LAYOUTS),
                        help="Layouts separated by ';' (the first calibrates the rate); LAYOUT@interleaved runs "
                             "interleaved 1F1B with 2 virtual stages a rank (@gpipe, @1f1b: those schedules).")
    parser.add_argument("--nprocs", type=int, default=4)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup-steps", type=int, default=3)
    parser.add_argument("--microbatches", type=int, default=4, help="Micro-batches per step with a pipeline.")
    parser.add_argument("--sequences", type=int, default=4,
                        help="Sequences per data-parallel rank and step (a pipeline's: --microbatches of them).")
    parser.add_argument("--emulate", default=None, metavar="NODESxRANKS")
    parser.add_argument("--hw", default=None, help="A fit of this machine's sweep, for the prediction column.")
    parser.add_argument("--compute", default=None,
                        help="A hardware file with a compute block (`commbench compute`) for the block-predicted "
                             "column: each layout's operators from it, on --hw's links, nothing calibrated.")
    parser.add_argument("--algorithm", default="ring", help="The prediction's collective algorithm.")
    parser.add_argument("--out", default="runs/layouts-accuracy")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    layouts = [x.strip() for x in args.layouts.split(";") if x.strip()]
    started = time.time()
    trained = {layouts[0]: commbench("train", layouts[0], args)}
    nominal = commbench("proxy", layouts[0], args, "--tflops", str(NOMINAL_TFLOPS))
    for run in (trained[layouts[0]], nominal):
        if "failed" in run:
            raise SystemExit(f"{layouts[0]}: {run['failed']}")
    rate = fit_rate(trained[layouts[0]]["step_us_p50"], nominal)
    print(f"# rate fitted on {layouts[0]}: {rate:.5f} TFLOP/s per rank; {args.nprocs} ranks"
          + (f", emulated {args.emulate}" if args.emulate else "") + f"; {args.sequences} sequence(s) per "
          f"data-parallel rank and step ({args.microbatches} micro-batches with a pipeline); load "
          f"{os.getloadavg()[0]:.1f}")
    table(layouts, trained, rate, args)
    print(f"# {time.strftime('%Y-%m-%d %H:%M', time.gmtime(started))}-{time.strftime('%H:%M', time.gmtime())} UTC, "
          f"load average {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
