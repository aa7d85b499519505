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
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time

COMMBENCH = [sys.executable, "-m", "commbench"]
RATES = "100mbit,1gbit,2gbit,5gbit,10gbit"
# Largest payload a TCP segment carries per Ethernet frame tbf counts: 1448 B of 1514 (MTU 1500,
# TCP timestamps on): the best goodput a link of rate R gives is R x 0.956.
GOODPUT = 1448 / 1514
FIDELITY_TARGET = 0.90
MODELS = "resnet50:2,bert-base:4,vgg16:16"  # MODEL:TFLOPS, each a step of ~300-400 ms of compute
SETUPS = {"torch": ["--backend", "torch"], "p2p-ring": ["--backend", "p2p", "--algorithm", "ring"],
          "hybrid-hier": ["--backend", "hybrid", "--algorithm", "hier"]}


def run(argv: list[str], limit_s: float) -> tuple[int, str]:
    """One bounded command; its exit code and its last stderr line (all of it beside its --json, .stderr)."""
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=limit_s)
    except subprocess.TimeoutExpired:
        return 124, f"killed after {limit_s:.0f} s"
    if "--json" in argv:
        with open(argv[argv.index("--json") + 1] + ".stderr", "w", encoding="utf-8") as handle:
            handle.write(proc.stderr or "")
    lines = (proc.stderr or "").strip().splitlines()
    return proc.returncode, lines[-1] if lines else ""


def records(path: str, kind: str) -> list[dict]:
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as handle:
        return [r for r in map(json.loads, handle) if r.get("record") == kind]


def rate_bps(text: str) -> float:
    from commbench.emulate import parse_rate
    return parse_rate(text)


# ------------------------------------------------------------------------------- raw TCP probe

def probe_serve(address: str, port: int) -> None:
    """Inside node 1: accept one connection, then receive (and, for 'bi', send) N bytes."""
    listener = socket.create_server((address, port))
    listener.settimeout(60)
    conn, _ = listener.accept()
    nbytes, mode = conn.recv(64).decode().split()
    conn.sendall(b"go")
    _transfer(conn, int(nbytes), send=mode == "bi", receive=True)
    conn.sendall(b"done")
    conn.close()


def probe_connect(address: str, port: int, nbytes: int, mode: str) -> float:
    """Inside node 0: send N bytes (and receive N for 'bi'); bit/s in each direction."""
    conn = socket.create_connection((address, port), timeout=60)
    conn.sendall(f"{nbytes} {mode}".ljust(64).encode())
    conn.recv(2)
    start = time.perf_counter()
    _transfer(conn, nbytes, send=True, receive=mode == "bi")
    conn.recv(4)  # the receiver has everything
    return nbytes * 8 / (time.perf_counter() - start)


def _transfer(conn: socket.socket, nbytes: int, send: bool, receive: bool) -> None:
    def pump() -> None:
        chunk, sent = memoryview(bytes(1 << 20)), 0
        while sent < nbytes:
            sent += conn.send(chunk[:min(len(chunk), nbytes - sent)])

    def drain() -> None:
        view, got = memoryview(bytearray(1 << 20)), 0
        while got < nbytes:
            got += conn.recv_into(view, min(len(view), nbytes - got)) or nbytes
    threads = [threading.Thread(target=f) for f, on in ((pump, send), (drain, receive)) if on]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def raw_probe(rate: str, repeats: int) -> dict[str, list[float]]:
    """A kept 2x1 cluster at `rate` (`commbench emulate up`): TCP from node 0 to node 1, one way
    (uni) and both ways at once (bi); then gloo's send/recv in both orders, under the cluster's own
    torchrun launch (emulate.torchrun_argv). Bit/s per direction, per run."""
    from commbench import emulate

    code, _ = run([*COMMBENCH, "emulate", "up", "2x1", "--link", rate], 60)
    kept = [c for c in emulate.clusters() if c.owner_pid is None and c.rate_bps == rate_bps(rate) and c.nodes == 2]
    if code != 0 or not kept:
        return {}
    cluster = max(kept, key=lambda c: c.created)
    bps = rate_bps(rate)
    nbytes = (32 << 20) if bps <= 1e8 else (128 << 20) if bps <= 1e9 else (512 << 20)  # ~1-3 s per run
    found: dict[str, list[float]] = {}
    try:
        for _ in range(repeats):
            for mode in ("uni", "bi"):
                server = subprocess.Popen(["ip", "netns", "exec", cluster.node(1), sys.executable, __file__,
                                           "_serve", cluster.address(1)])
                time.sleep(0.5)
                client = subprocess.run(["ip", "netns", "exec", cluster.node(0), sys.executable, __file__,
                                         "_connect", cluster.address(1), str(nbytes), mode],
                                        capture_output=True, text=True, timeout=90)
                server.wait(timeout=30)
                if client.returncode == 0:
                    found.setdefault(mode, []).append(float(client.stdout.split()[-1]))
        for key, value in gloo_orders(cluster, nbytes // 4).items():
            found.setdefault(key, []).extend(value)
    finally:
        run([*COMMBENCH, "emulate", "down", cluster.tag], 60)
    return found


def gloo_orders(cluster, nbytes: int) -> dict[str, list[float]]:
    """Rank 0's bit/s per direction for gloo's send alone, isend then irecv, irecv then isend."""
    from commbench import emulate

    env = emulate.node_env(cluster)
    procs = [subprocess.Popen(emulate.torchrun_argv(cluster, i, 60, [__file__, "_gloo_order", str(nbytes)]),
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
             for i in range(cluster.nodes)]
    try:
        out = procs[0].communicate(timeout=120)[0]
        procs[1].wait(timeout=30)
    except subprocess.TimeoutExpired:
        out = ""
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    found: dict[str, list[float]] = {}
    for line in out.splitlines():
        if line.startswith("gloo:"):
            _, name, value = line.split()
            found.setdefault(name, []).append(float(value))
    return found


def gloo_order_rank(nbytes: int) -> None:
    """One rank of gloo_orders: the same bytes both ways, posted in each order, 3 calls each."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    peer = 1 - dist.get_rank()
    send, recv = torch.ones(nbytes // 4), torch.zeros(nbytes // 4)

    def one_way() -> None:
        if peer == 1:
            dist.send(send, peer)
        else:
            dist.recv(recv, peer)

    def send_first() -> None:
        for request in [dist.isend(send, peer), dist.irecv(recv, peer)]:
            request.wait()

    def recv_first() -> None:
        for request in [dist.irecv(recv, peer), dist.isend(send, peer)]:
            request.wait()
    for name, call in (("gloo-one-way", one_way), ("gloo-isend-irecv", send_first), ("gloo-irecv-isend", recv_first)):
        call()
        dist.barrier()
        start = time.perf_counter()
        for _ in range(3):
            call()
        dist.barrier()
        if peer == 1:
            print(f"gloo: {name} {nbytes * 8 * 3 / (time.perf_counter() - start):.0f}", flush=True)
    dist.destroy_process_group()


# ------------------------------------------------------------------------------------ 1. link

def link_sweep(rate: str, top: str, out: str) -> tuple[int, str, dict[tuple[str, int], dict]]:
    path = os.path.join(out, f"link-{rate}.jsonl")
    code, last = run([*COMMBENCH, "sweep", "--emulate", "2x1", "--link", rate, "-c", "sendrecv,allreduce",
                      "--sizes", f"64K-{top}", "-f", "4", "--placement", "out-of-place", "--timeout", "60",
                      "--json", path, "--force"], 600)
    return code, last, {(r["collective"], r["nbytes"]): r for r in records(path, "result")}


def link_mode(args: argparse.Namespace) -> dict:
    from commbench.emulate import MAX_RATE_BPS, host_ceiling_bps, rate_text

    ceilings = [host_ceiling_bps() for _ in range(5)]
    print(f"\n## 1. Link fidelity, 2x1; host_ceiling_bps(): median {statistics.median(ceilings) / 1e9:.1f} Gbit/s "
          f"(min {min(ceilings) / 1e9:.1f}, max {max(ceilings) / 1e9:.1f}, 5 runs)\n")
    print("achieved / configured rate, per direction. raw TCP: one connection node 0 -> node 1 (uni) or both ways "
          "at once (bi); gloo: send alone, isend then irecv, irecv then isend (each way at once); sendrecv "
          "(commbench sweep): busbw = algbw (S each way per link); allreduce (gloo, 2 ranks): busbw = algbw x "
          "2(n-1)/n = the bytes each NIC sends (and receives) per call / time. Medians (min-max) of runs. "
          f"Best possible: {GOODPUT:.3f} (TCP/IP/Ethernet headers). Target >= {FIDELITY_TARGET:.0%}.\n")
    reference = rate_text(MAX_RATE_BPS)  # tbf far above what the host moves: the links' own floor
    _, _, floor = link_sweep(reference, args.link_max, args.out)
    print("| link | raw uni | raw bi | gloo send | gloo isend,irecv | gloo irecv,isend | sendrecv 1M | sendrecv max "
          "| allreduce 1M | allreduce max | verdict (allreduce max) | load avg |\n" + "|---" * 12 + "|")
    rows = []
    for rate in args.rates.split(","):
        raw = raw_probe(rate, args.repeats)
        top = "16M" if rate_bps(rate) <= 1e8 else args.link_max
        code, last, points = link_sweep(rate, top, args.out)
        share = {key: r["busbw_gbps"] * 8e9 / rate_bps(rate) for key, r in points.items() if r.get("busbw_gbps")}
        biggest = {c: max((n for (k, n) in share if k == c), default=None) for c in ("sendrecv", "allreduce")}
        row = {"rate": rate, "exit": code, "note": last, "load": os.getloadavg(),
               "raw": {k: [v / rate_bps(rate) for v in values] for k, values in raw.items()},
               "sweep": {f"{c}:{n}": v for (c, n), v in share.items()},
               "above_floor": {f"{c}:{n}": _above_floor(points[(c, n)], floor.get((c, n)), rate_bps(rate))
                               for (c, n) in points}}
        cells = [_median_cell(row["raw"].get(k, [])) for k in
                 ("uni", "bi", "gloo-one-way", "gloo-isend-irecv", "gloo-irecv-isend")]
        cells += [_cell(share.get(("sendrecv", 1 << 20))), _cell(share.get(("sendrecv", biggest["sendrecv"]))),
                  _cell(share.get(("allreduce", 1 << 20))), _cell(share.get(("allreduce", biggest["allreduce"])))]
        top_share = share.get(("allreduce", biggest["allreduce"]))
        verdict = "n/a" if top_share is None else "pass" if top_share >= FIDELITY_TARGET else "FAIL"
        print(f"| {rate} | {' | '.join(cells)} | {verdict} | {row['load'][0]:.1f} |", flush=True)
        rows.append(row)
    print(f"\nsmall and large messages: the rate the link gives the time above the unshaped floor (the same "
          f"sweep at {reference}), as a share of the configured rate: bytes each NIC sends x 8 / (t - t_floor) / "
          f"rate (over 1: the bucket let a message through faster than the rate)\n")
    sizes = sorted({n for row in rows for key in row["above_floor"] for n in [int(key.split(":")[1])]})
    print("| link | collective | " + " | ".join(_size(n) for n in sizes) + " |\n" + "|---" * (len(sizes) + 2) + "|")
    for row in rows:
        for collective in ("sendrecv", "allreduce"):
            cells = [_cell(row["above_floor"].get(f"{collective}:{n}")) for n in sizes]
            print(f"| {row['rate']} | {collective} | " + " | ".join(cells) + " |")
    floor_us = {f"{c}:{n}": r["time_us"] for (c, n), r in floor.items()}
    return {"host_ceiling_bps": ceilings, "floor_rate": reference, "floor_time_us": floor_us, "rows": rows}


def _above_floor(point: dict, floor: dict | None, bps: float) -> float | None:
    """Configured-rate share of the rate implied by the time a point took above the unshaped floor."""
    if floor is None or point["time_us"] <= floor["time_us"]:
        return None
    wire_bytes = point["busbw_gbps"] * 1e9 * point["time_us"] / 1e6  # busbw x time: the bytes each NIC sends
    return wire_bytes * 8 / ((point["time_us"] - floor["time_us"]) / 1e6) / bps


def _cell(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _median_cell(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):.1%} ({min(values):.0%}-{max(values):.0%})"


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
            print(f"| {_size(nbytes)} | " + " | ".join(cells) + " |")
            times = {s: setups.get(s, {}).get(nbytes, []) for s in order[:3]}
            summary.setdefault(layout, {})[nbytes] = {"times_us": times, "busbw_gbps": busbw,
                                                      "predicted_ratio": predicted[nbytes]}
        print()
    return summary


def _size(nbytes: int) -> str:
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if nbytes >= 1 << shift and nbytes % (1 << shift) == 0:
            return f"{nbytes >> shift}{unit}"
    return str(nbytes)


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
        results[f"{model}/{layout}/{setup}"] = proxy and {k: proxy[k] for k in (
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
        rows[key] = guess and {k: guess[k] for k in ("step_us_p50", "samples_per_s", "world_size")}
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
    if len(sys.argv) > 1 and sys.argv[1] in ("_serve", "_connect", "_gloo_order"):  # probes, inside a node
        if sys.argv[1] == "_serve":
            probe_serve(sys.argv[2], 5201)
        elif sys.argv[1] == "_gloo_order":
            gloo_order_rank(int(sys.argv[2]))
        else:
            print(f"{probe_connect(sys.argv[2], 5201, int(sys.argv[3]), sys.argv[4]):.0f}")
        return 0
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
