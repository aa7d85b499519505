"""commbench on an emulated cluster (issue 14, docs/emulation.md): link fidelity, flat against
hierarchical allreduce across nodes, the ACSpeed experiment (proxy throughput, linearity and
acc_ratio at 1, 2 and 4 nodes) and the cost model's prediction of it, in one script.

    python benchmarks/emulated_cluster.py link          # raw TCP and gloo through 2 nodes' links, per rate
    python benchmarks/emulated_cluster.py flat-vs-hier  # torch / p2p ring / hybrid hier on 2x2 and 4x1, A B C C B A
    python benchmarks/emulated_cluster.py acspeed       # proxy resnet50, bert-base, vgg16 at 1x1 .. 4x1, 2x2
    python benchmarks/emulated_cluster.py predict       # fit flat-vs-hier's sweeps, predict acspeed's runs
    python benchmarks/emulated_cluster.py all --out runs/emulated

Needs root (network namespaces, tc): without it, one line and exit 2. Every run is a
`commbench ... --emulate` (or `commbench emulate up` for the raw TCP probe) with `--timeout 60`
and a wall-clock limit; its traffic stays on 198.18.0.0/15 inside the namespaces it creates.
Each mode writes its JSON Lines under --out and a summary MODE.json, and prints a Markdown
table; `predict` reads the files flat-vs-hier and acspeed wrote. Exit 0 when the runs ran
(targets that miss say FAIL in the tables), 2 on bad options or missing privileges.
Mode `link` and its probes are in emulated_link.py; the bounded runs in emulated_commands.py.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

from emulated_commands import COMMBENCH, records, run, size_label
from emulated_link import RATES, link_mode

MODELS = "resnet50:2,bert-base:4,vgg16:16"  # MODEL:TFLOPS, each a step of ~300-400 ms of compute
SETUPS = {"torch": ["--backend", "torch"], "p2p-ring": ["--backend", "p2p", "--algorithm", "ring"],
          "hybrid-hier": ["--backend", "hybrid", "--algorithm", "hier"]}


# ---------------------------------------------------------------------------- 2. flat vs hier

def nic_bytes(algorithm: str, nodes: int, ranks_per_node: int, nbytes: int) -> int:
    """Bytes the busiest node's NIC sends per allreduce of `nbytes` under the schedule (gloo's
    allreduce is costed as the ring it runs)."""
    from commbench.algorithms import build
    from commbench.topology import Topology

    topo, count = Topology(nodes, ranks_per_node), nbytes // 4
    schedule = build("allreduce", algorithm, topo, count, nbytes)
    sent = [0] * nodes
    for rnd in schedule.rounds:
        for t in rnd:
            if topo.node_of(t.src) != topo.node_of(t.dst):
                sent[topo.node_of(t.src)] += t.count * 4
    return max(sent)


def flat_vs_hier_mode(args: argparse.Namespace) -> dict:
    order = ["torch", "p2p-ring", "hybrid-hier"]
    order = order + order[::-1]
    found: dict[str, dict[str, dict[int, list[float]]]] = {}
    for layout in args.layouts.split(","):
        for index, setup in enumerate(order):
            path = os.path.join(args.out, f"fvh-{layout}-{setup}-{index}.jsonl")
            code, last = run([*COMMBENCH, "sweep", "--emulate", layout, "--link", args.link, *SETUPS[setup],
                              "--sizes", args.sizes, "-f", "4", "--placement", "out-of-place", "--timeout", "60",
                              "--json", path, "--force"], 900)
            print(f"# {layout} {setup} run {index}: exit {code} {last}", flush=True)
            for r in records(path, "result"):
                found.setdefault(layout, {}).setdefault(setup, {}).setdefault(r["nbytes"], []).append(r["time_us"])
    print(f"\n## 2. Flat vs hierarchical allreduce, link {args.link}, runs A B C C B A\n")
    print("time: median of the runs (min-max); busbw from the median time; hier/flat: hybrid-hier busbw over "
          "torch (gloo ring) and over p2p ring; predicted: the busiest NIC's bytes per call, ring / hier "
          "(schedules of commbench/algorithms.py)\n")
    summary = {}
    for layout, setups in found.items():
        nodes, ranks = map(int, layout.split("x"))
        world = nodes * ranks
        predicted = {n: nic_bytes("ring", nodes, ranks, n) / nic_bytes("hier", nodes, ranks, n)
                     for n in setups.get("torch", {})}
        print(f"### {layout}\n\n| size | " + " | ".join(f"{s} time (ms) | {s} busbw (GB/s)" for s in order[:3])
              + " | hier/torch | hier/p2p ring | predicted |\n" + "|---" * 10 + "|")
        for nbytes in sorted(predicted):
            cells, busbw = [], {}
            for setup in order[:3]:
                times = setups.get(setup, {}).get(nbytes, [])
                if not times:
                    cells += ["-", "-"]
                    continue
                mid = statistics.median(times)
                busbw[setup] = nbytes / mid / 1e3 * 2 * (world - 1) / world
                cells += [f"{mid / 1e3:.1f} ({min(times) / 1e3:.1f}-{max(times) / 1e3:.1f})", f"{busbw[setup]:.3f}"]
            ratio = [busbw["hybrid-hier"] / busbw[s] if "hybrid-hier" in busbw and s in busbw else None
                     for s in ("torch", "p2p-ring")]
            cells += [f"{x:.2f}" if x else "-" for x in ratio] + [f"{predicted[nbytes]:.2f}"]
            print(f"| {size_label(nbytes)} | " + " | ".join(cells) + " |")
            times = {s: setups.get(s, {}).get(nbytes, []) for s in order[:3]}
            summary.setdefault(layout, {})[nbytes] = {"times_us": times, "busbw_gbps": busbw,
                                                      "predicted_ratio": predicted[nbytes]}
        print()
    return summary


# ---------------------------------------------------------------------------------- 3. acspeed

def acspeed_runs(args: argparse.Namespace) -> list[tuple[str, float, str, str]]:
    """(model, tflops, layout, setup) in the order they run: per model and layout, torch and
    hybrid-hier alternate which goes first."""
    runs, flip = [], False
    for item in args.models.split(","):
        model, tflops = item.split(":")
        for layout in args.acspeed_layouts.split(","):
            pair = ["torch"] if layout == "1x1" else ["torch", "hybrid-hier"]  # 1 rank: nothing to reduce
            runs += [(model, float(tflops), layout, s) for s in (pair[::-1] if flip else pair)]
            flip = not flip
    return runs


def acspeed_mode(args: argparse.Namespace) -> dict:
    results = {}
    for model, tflops, layout, setup in acspeed_runs(args):
        path = os.path.join(args.out, f"acspeed-{model}-{layout}-{setup}.jsonl")
        if os.path.exists(path):
            os.unlink(path)
        code, last = run([*COMMBENCH, "proxy", model, "--emulate", layout, "--link", args.link, *SETUPS[setup],
                          "--compute", "flops", "--tflops", str(tflops), "--steps", str(args.steps),
                          "--warmup-steps", "2", "--timeout", "60", "--json", path], 900)
        proxy = next(iter(records(path, "proxy")), None)
        # a run that did not end ok, or without a rate (no step measured), is a failed row
        ok = proxy and proxy.get("status") == "ok" and proxy.get("samples_per_s")
        results[f"{model}/{layout}/{setup}"] = ok and {k: proxy[k] for k in (
            "step_us_p50", "step_us_p90", "samples_per_s", "compute_us_p50", "comm_us_p50", "exposed_comm_us_p50",
            "other_us_p50", "world_size", "nnodes", "batch", "gradient_bytes")}
        print(f"# {model} {layout} {setup}: exit {code} "
              + (f"step {proxy['step_us_p50'] / 1e3:.0f} ms" if proxy else last), flush=True)
    print_acspeed(results, args)
    return results


def print_acspeed(results: dict, args: argparse.Namespace, predicted: dict | None = None) -> None:
    print(f"\n## 3. ACSpeed: proxy on the emulated cluster, link {args.link}, --compute flops, median step of "
          f"{args.steps}\n")
    print("linearity: samples/s at N ranks / (N x samples/s of the same model's 1x1 torch run); acc_ratio: "
          "hybrid-hier's samples/s / torch's on the same layout; other: the step's time beyond compute and exposed "
          "communication (a descheduled rank: the compute spins on a CPU)\n")
    print("| model | layout | setup | step (ms) | compute (ms) | comm (ms) | exposed (ms) | other (ms) | samples/s "
          "| linearity | acc_ratio hier/torch |\n" + "|---" * 11 + "|")
    for key, value in results.items():
        if not value:
            print(f"| {' | '.join(key.split('/'))} | failed |" + " |" * 7)
            continue
        model, layout, setup = key.split("/")
        one = results.get(f"{model}/1x1/torch")
        linear = value["samples_per_s"] / (value["world_size"] * one["samples_per_s"]) if one else None
        torch_run = results.get(f"{model}/{layout}/torch")
        acc = value["samples_per_s"] / torch_run["samples_per_s"] if setup != "torch" and torch_run else None
        print(f"| {model} | {layout} | {setup} | {value['step_us_p50'] / 1e3:.0f} | "
              f"{(value['compute_us_p50'] or 0) / 1e3:.0f} | {(value['comm_us_p50'] or 0) / 1e3:.0f} | "
              f"{(value['exposed_comm_us_p50'] or 0) / 1e3:.0f} | {(value.get('other_us_p50') or 0) / 1e3:.0f} | "
              f"{value['samples_per_s']:.1f} | "
              f"{'-' if linear is None else f'{linear:.2f}'} | {'-' if acc is None else f'{acc:.2f}'} |")


# ---------------------------------------------------------------------------------- 4. predict

def predict_mode(args: argparse.Namespace) -> dict:
    """Fit gloo (the 4x1 torch sweeps) and hybrid hier (the 2x2 sweeps) from flat-vs-hier's files,
    then `proxy --backend sim --hw FIT` for each acspeed run, and `predict-scaling` for torch at
    1, 2, 4 nodes of 1 rank; predicted against measured."""
    fits = {}
    for setup, layout in (("torch", "4x1"), ("hybrid-hier", "2x2")):
        files = sorted(os.path.join(args.out, f) for f in os.listdir(args.out)
                       if f.startswith(f"fvh-{layout}-{setup}-") and f.endswith(".jsonl"))
        if not files:  # flat-vs-hier ran without this layout: its runs stay unpredicted (check predicts them)
            print(f"# fit {setup}: no {layout} sweeps in {args.out} (flat-vs-hier --layouts); its runs not predicted",
                  flush=True)
            continue
        header = next(iter(records(files[0], "header")), {})
        first = next(iter(records(files[0], "result")), {})
        spec = f"{header.get('backend')}/{header.get('library')}/{first.get('algorithm') or '-'}"
        out = os.path.join(args.out, f"fit-{setup}.json")
        code, last = run([*COMMBENCH, "fit", *files, "--setup", spec, "--sizes", args.sizes, "-o", out, "--force"], 120)
        print(f"# fit {spec} on the {layout} sweeps: exit {code} {last}", flush=True)
        fits[setup] = out
    with open(os.path.join(args.out, "acspeed.json"), encoding="utf-8") as handle:
        measured = json.load(handle)
    tflops = dict(item.split(":") for item in args.models.split(","))
    rows: dict[str, dict | None] = {}
    for key in measured:
        model, layout, setup = key.split("/")
        path = os.path.join(args.out, f"predict-{model}-{layout}-{setup}.jsonl")
        if os.path.exists(path):
            os.unlink(path)
        if setup not in fits:
            rows[key] = None
            continue
        run([*COMMBENCH, "proxy", model, "--backend", "sim", "--hw", fits[setup], "-T", layout, "--algorithm",
             "ring" if setup == "torch" else "hier", "--compute", "flops", "--tflops", tflops[model],
             "--steps", "3", "--warmup-steps", "1", "--json", path], 300)
        guess = next(iter(records(path, "proxy")), None)
        rows[key] = guess and guess.get("samples_per_s") and {k: guess[k] for k in ("step_us_p50", "samples_per_s",
                                                                                    "world_size")}
    scaling = {}
    for model in tflops if "torch" in fits else []:
        path = os.path.join(args.out, f"scaling-{model}.jsonl")
        if os.path.exists(path):
            os.unlink(path)
        run([*COMMBENCH, "predict-scaling", model, "--hw", fits["torch"], "--nodes", "1,2,4", "--gpus-per-node", "1",
             "--tflops", tflops[model], "--algorithm", "ring", "--json", path], 120)
        for r in records(path, "scaling"):
            scaling[f"{model}/{r['nodes']}x1/torch"] = {"step_us": r["step_us"], "linearity": r["linearity"]}
    print_predicted(measured, rows, scaling)
    return {"fits": fits, "proxy_sim": rows, "predict_scaling": scaling}


def print_predicted(measured: dict, rows: dict, scaling: dict) -> None:
    print("\n## 4. Predicted (cost model fitted on the same cluster) against measured\n")
    print("proxy --backend sim --hw FIT (ring for torch, hier for hybrid); predict-scaling --algorithm ring for "
          "torch at N x 1; error = predicted / measured - 1\n")
    print("| model | layout | setup | measured step (ms) | proxy sim (ms) | error | predict-scaling (ms) | error "
          "| measured linearity | proxy sim linearity | predict-scaling linearity |\n" + "|---" * 11 + "|")
    for key, value in measured.items():
        model, layout, setup = key.split("/")
        guess, one, guess_one = rows.get(key), measured.get(f"{model}/1x1/torch"), rows.get(f"{model}/1x1/torch")
        scaled = scaling.get(key)
        if not value:
            print(f"| {model} | {layout} | {setup} | failed |" + " |" * 7)
            continue
        step = value["step_us_p50"]
        lin = [v["samples_per_s"] / (v["world_size"] * o["samples_per_s"]) if v and o else None
               for v, o in ((value, one), (guess, guess_one))] + [scaled and scaled["linearity"]]
        cells = [f"{step / 1e3:.0f}", _ms(guess and guess["step_us_p50"]), _error(guess and guess["step_us_p50"], step),
                 _ms(scaled and scaled["step_us"]), _error(scaled and scaled["step_us"], step)]
        cells += ["-" if x is None else f"{x:.2f}" for x in lin]
        print(f"| {model} | {layout} | {setup} | " + " | ".join(cells) + " |")


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value / 1e3:.0f}"


def _error(predicted: float | None, measured: float) -> str:
    return "-" if predicted is None else f"{predicted / measured - 1:+.0%}"


# -------------------------------------------------------------------------------------- main

def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["link", "flat-vs-hier", "acspeed", "predict", "all"])
    parser.add_argument("--out", default="runs/emulated", help="JSON Lines and summaries [default: %(default)s]")
    parser.add_argument("--rates", default=RATES, help="link: rates to try [default: %(default)s]")
    parser.add_argument("--repeats", type=int, default=2, help="link: raw TCP runs per direction and rate")
    parser.add_argument("--link-max", default="64M", help="link: largest sweep size above 100mbit")
    parser.add_argument("--link", default="1gbit", help="flat-vs-hier, acspeed: the links' rate")
    parser.add_argument("--layouts", default="2x2,4x1", help="flat-vs-hier: NODESxRANKS,...")
    parser.add_argument("--sizes", default="64K-256M", help="flat-vs-hier: sweep sizes (factor 4)")
    parser.add_argument("--models", default=MODELS, help="acspeed, predict: MODEL:TFLOPS,... [default: %(default)s]")
    parser.add_argument("--acspeed-layouts", default="1x1,2x1,4x1,2x2", help="acspeed: layouts")
    parser.add_argument("--steps", type=int, default=5, help="acspeed: measured steps per run")
    args = parser.parse_args()
    from commbench.emulate import EmulateError, require_privileges
    try:
        require_privileges()
    except EmulateError as exc:
        print(f"emulated_cluster.py: {exc}", file=sys.stderr)
        return 2
    os.makedirs(args.out, exist_ok=True)
    print(f"# emulated cluster benchmarks, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
          f"{os.cpu_count()} CPUs", flush=True)
    modes = ["link", "flat-vs-hier", "acspeed", "predict"] if args.mode == "all" else [args.mode]
    for mode in modes:
        summary = {"link": link_mode, "flat-vs-hier": flat_vs_hier_mode, "acspeed": acspeed_mode,
                   "predict": predict_mode}[mode](args)
        with open(os.path.join(args.out, f"{mode}.json"), "w", encoding="utf-8") as handle:
            json.dump(summary, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
