"""Mode `link` of emulated_cluster.py: does a 2x1 emulated cluster's link give the rate it was set to?

Raw TCP one way and both ways (probe_serve / probe_connect, run inside the nodes' namespaces),
gloo's send/recv in both posting orders (gloo_order_rank, under the cluster's torchrun launch), and
`commbench sweep --emulate 2x1 -c sendrecv,allreduce` per rate, each achieved rate over the configured
one (target >= 90%); the sweep's time above an unshaped floor for small messages. Inside a node
emulated_cluster.py runs this file: `emulated_link.py _serve ADDRESS`, `_connect ADDRESS BYTES MODE`,
`_gloo_order BYTES`.
"""
from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import threading
import time

from emulated_commands import COMMBENCH, rate_bps, records, run, size_label

RATES = "100mbit,1gbit,2gbit,5gbit,10gbit"
# Largest payload a TCP segment carries per Ethernet frame tbf counts: 1448 B of 1514 (MTU 1500,
# TCP timestamps on): the best goodput a link of rate R gives is R x 0.956.
GOODPUT = 1448 / 1514
FIDELITY_TARGET = 0.90


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
    torchrun launch (emulated_run.torchrun_argv). Bit/s per direction, per run."""
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
    from commbench import emulated_run

    env = emulated_run.node_env(cluster)
    procs = [subprocess.Popen(emulated_run.torchrun_argv(cluster, i, 60, [__file__, "_gloo_order", str(nbytes)]),
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
    from commbench.emulate import MAX_RATE_BPS, rate_text
    from commbench.emulated_run import host_ceiling_bps

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
    print("| link | collective | " + " | ".join(size_label(n) for n in sizes) + " |\n"
          + "|---" * (len(sizes) + 2) + "|")
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


def probe_main(argv: list[str]) -> int:
    """The probes, inside a node: `_serve ADDRESS`, `_connect ADDRESS BYTES MODE`, `_gloo_order BYTES`."""
    if argv[1:] in (["-h"], ["--help"]):
        print(__doc__)
        return 0
    if len(argv) < 3 or argv[1] not in ("_serve", "_connect", "_gloo_order"):
        print("emulated_link.py: run by emulated_cluster.py inside a node (see --help); "
              "run `python benchmarks/emulated_cluster.py link`", file=sys.stderr)
        return 2
    if argv[1] == "_serve":
        probe_serve(argv[2], 5201)
    elif argv[1] == "_gloo_order":
        gloo_order_rank(int(argv[2]))
    else:
        print(f"{probe_connect(argv[2], 5201, int(argv[3]), argv[4]):.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(probe_main(sys.argv))
