"""`commbench selftest`: what to run on a new machine or cluster node before trusting its numbers.

It checks, on whatever is there, every backend that can run, and prints one line per
check: `passed`, `failed` with the reason, or `skipped` with why (no GPU, no C++
compiler, one GPU where two are needed). Any failure exits 1; a usage error exits 2.

- host-kernels: the kernels of cuda/ built for the CPU (commbench/backends/cuda/host.py), every kernel,
  dtype and op at the counts and offsets that reach each path, against NumPy;
- host-schedules: backends/cuda/plan.py's launches for every allreduce algorithm on 8 virtual ranks,
  run by those kernels, against the schedule's NumPy interpreter;
- sim, shm, gloo: a tiny checked `commbench sweep` of each CPU backend;
- gpu-kernels: the real kernels against CuPy (the checks of tests/unit/backends/cuda/test_sched.py,
  commbench/backends/cuda/checks.py), then `--backend cuda` on virtual ranks;
- nccl: NCCL through CuPy and through torch on the same GPUs, both checked, busbw side by side;
- nvml: GPU telemetry readable (commbench.telemetry.Monitor);
- peer-ipc: `--backend cuda` across the visible GPUs with peer access and with CUDA IPC.

Sweeps run as a user runs them (`python -m commbench sweep ... --json`, launcher variables
removed, so that a selftest started by srun or torchrun still spawns its own ranks), and
their records decide: a non-zero exit or any wrong element fails the check.
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import click

from commbench.commands.helpers.common import UsageFault

EXIT_FAILED = 1
SWEEP_ARGS = ("--iters", "3", "--warmup", "1")
# What launch.detect_launcher reads: a sweep started from here must spawn its own ranks.
LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                 "TORCHELASTIC_RUN_ID", "GROUP_RANK", "NODE_RANK", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_STEP_ID",
                 "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "COMMBENCH_SPAWN_ID")


class Skipped(Exception):
    """The check cannot run here; the message says why."""


class Failed(Exception):
    """The check ran and found something wrong; the message says what."""


@dataclass(frozen=True)
class Check:
    name: str
    run: Callable[[Path, float], str]  # (scratch folder, timeout) -> what passed; raises Skipped or Failed


@dataclass(frozen=True)
class Outcome:
    name: str
    status: str  # passed, failed, skipped
    detail: str
    seconds: float

    def line(self) -> str:
        timing = f" ({self.seconds:.1f} s)" if self.status != "skipped" else ""
        return f"{self.status:<8} {self.name:<15} {self.detail}{timing}"


# ---------------------------------------------------------------- the host build of the kernels


def _host_kernels():
    from commbench.backends.cuda import host as H

    try:
        H.find_compiler()
    except H.HostBuildError as exc:
        raise Skipped(str(exc)) from None
    try:
        return H.HostKernels(H.build())
    except H.HostBuildError as exc:
        raise Failed(str(exc)) from None


def check_host_kernels(scratch: Path, timeout_s: float) -> str:
    import numpy as np

    from commbench.backends.cuda import checks as C
    from commbench.backends.cuda.host import HostBuildError
    from commbench.collectives import DTYPES

    started = time.monotonic()
    device = C.HostDevice(_host_kernels())
    built_s, failures = time.monotonic() - started, []
    try:
        with np.errstate(all="ignore"):
            for dtype in DTYPES:
                for op in ("sum", "prod", "max", "min"):
                    failures += C.check_reduce_copy(device, dtype, op, C.path_counts(dtype, 32), threads=32)
                    failures += C.check_round_inputs(device, dtype, op, 3, 1001, [0, 1, 2, 0])
                    failures += C.check_allreduce_kernels(device, dtype, 3, 1001, op, offsets=[0, 1, 0])
                if DTYPES[dtype].is_float:
                    failures += C.check_scale(device, dtype, C.random_values(np, dtype, 1001, 0), 1 / 3)
    except HostBuildError as exc:  # a kernel faulted (misaligned or stray access)
        raise Failed(str(exc)) from None
    if failures:
        raise Failed(f"{len(failures)} case(s) wrong, first: {failures[0]}")
    compiled = f", compiled in {built_s:.0f} s" if built_s > 1 else ""
    return f"every kernel of cuda/ built for the CPU = NumPy, 8 dtypes x 4 ops{compiled}"


def check_host_schedules(scratch: Path, timeout_s: float) -> str:
    from commbench import algorithms as A
    from commbench.backends.cuda import checks as C
    from commbench.backends.cuda.host import HostBuildError
    from commbench.topology import Topology

    kernels, failures = _host_kernels(), []
    names = list(A.available("allreduce", gpu=True))
    try:
        for name in names:
            topo = Topology(2, 4) if name == "hier" else Topology(1, 8)
            schedule = A.build("allreduce", name, topo, 10_001, 40_004)
            failures += C.check_schedule(kernels, schedule, "float32", "sum")
            failures += C.check_schedule(kernels, schedule, "bfloat16", "avg", streams="per-rank")
    except HostBuildError as exc:
        raise Failed(str(exc)) from None
    if failures:
        raise Failed(f"{len(failures)} case(s) wrong, first: {failures[0]}")
    return f"{len(names)} allreduce algorithms, 8 virtual ranks, CPU kernels = the schedules' reference"


# ---------------------------------------------------------------- sweeps, as a user runs them


def sweep(scratch: Path, name: str, args: list[str], timeout_s: float) -> list[dict]:
    """A checked `commbench sweep` in a child process; its result records, or Failed."""
    from commbench.launch import rank_argv
    from commbench.results import read_records

    path = scratch / f"{name}.jsonl"
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS}
    command = [*rank_argv("commbench"), "sweep", *args, *SWEEP_ARGS, "--timeout", f"{timeout_s:g}",
               "--json", str(path)]
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s + 30, env=env, check=False)
    except subprocess.TimeoutExpired:
        raise Failed(f"`commbench sweep {' '.join(args)}` did not finish in {timeout_s + 30:g} s") from None
    results = [r for r in read_records(str(path)) if r["record"] == "result"] if path.exists() else []
    wrong = [r for r in results if r["wrong"]]
    if wrong:
        r = wrong[0]
        raise Failed(f"{sum(x['wrong'] for x in wrong)} wrong element(s): first {r['collective']} {r['nbytes']} B "
                     f"{r['placement']} ({' '.join(args)})")
    if proc.returncode != 0 or not results:
        lines = [line for line in (proc.stderr or proc.stdout).splitlines() if line.strip()]
        raise Failed(f"`commbench sweep {' '.join(args)}` exited {proc.returncode}: "
                     f"{lines[-1] if lines else 'no output'}")
    return results


def _summary(results: list[dict]) -> str:
    collectives = sorted({r["collective"] for r in results})
    return f"{len(results)} points of {', '.join(collectives)} checked, 0 wrong"


def check_sim(scratch: Path, timeout_s: float) -> str:
    args = ["--backend", "sim", "-N", "8", "-c", "allreduce,allgather,reduce_scatter,broadcast,reduce",
            "--sizes", "1K,1M", "--dtype", "bfloat16"]
    return "sim, 8 virtual ranks: " + _summary(sweep(scratch, "sim", args, timeout_s))


def check_shm(scratch: Path, timeout_s: float) -> str:
    args = ["--backend", "shm", "-N", "2", "-c", "allreduce,allgather", "--sizes", "1K,64K"]
    return "shm, 2 ranks: " + _summary(sweep(scratch, "shm", args, timeout_s))


def check_gloo(scratch: Path, timeout_s: float) -> str:
    args = ["--backend", "torch", "--torch-backend", "gloo", "--device", "cpu", "-N", "2", "--sizes", "1K,64K"]
    return "torch gloo on the CPU, 2 ranks: " + _summary(sweep(scratch, "gloo", args, timeout_s))


# ---------------------------------------------------------------- GPUs


def _gpus(need: int = 1) -> int:
    """Visible GPUs (CuPy), or Skipped naming what is missing."""
    from commbench.backends import BackendError
    from commbench.backends.cuda.device import INSTALL_HINT, require_gpu

    try:
        count = require_gpu("cuda")
    except BackendError as exc:
        reason = str(exc).replace("--backend cuda", "").replace(f": {INSTALL_HINT}", "").strip(" :;")
        raise Skipped(f"no GPU ({reason})") from None
    if count < need:
        raise Skipped(f"needs {need} GPUs, {count} visible")
    return count


def check_gpu_kernels(scratch: Path, timeout_s: float) -> str:
    from commbench.backends.cuda import checks as C
    from commbench.collectives import DTYPES

    _gpus()
    device, failures = C.GpuDevice(), []
    for dtype in DTYPES:
        counts = [*C.path_counts(dtype, 512), ((1 << 20) + 48) // DTYPES[dtype].itemsize]
        for op in ("sum", "prod", "max", "min"):
            failures += C.check_reduce_copy(device, dtype, op, counts)
            failures += C.check_allreduce_kernels(device, dtype, 8, 100_003, op, small=True)
    if failures:
        raise Failed(f"{len(failures)} case(s) wrong, first: {failures[0]}")
    results = sweep(scratch, "cuda-virtual", ["--backend", "cuda", "--cuda-mode", "virtual", "-N", "4", "-c",
                                              "allreduce,allgather,reduce_scatter,broadcast,reduce",
                                              "--sizes", "1K,1M"], timeout_s)
    return f"the kernels = CuPy for 8 dtypes x 4 ops; --backend cuda, 4 virtual ranks: {_summary(results)}"


def check_nccl(scratch: Path, timeout_s: float) -> str:
    gpus = _gpus()
    common = ["-N", str(gpus), "-c", "allreduce,allgather", "--sizes", "1K,16M", "--placement", "out-of-place"]
    cupy = sweep(scratch, "nccl-cupy", ["--backend", "cupy", *common], timeout_s)
    torch = sweep(scratch, "nccl-torch", ["--backend", "torch", "--torch-backend", "nccl", *common], timeout_s)
    busbw = lambda results: max(r["busbw_gbps"] for r in results if r["collective"] == "allreduce")  # noqa: E731
    return (f"{gpus} GPU(s), both checked; allreduce busbw at 16 MiB: CuPy {busbw(cupy):.1f} GB/s, "
            f"torch {busbw(torch):.1f} GB/s")


def check_nvml(scratch: Path, timeout_s: float) -> str:
    from commbench.telemetry import Monitor

    with Monitor(interval_s=0.05) as monitor:
        monitor.mark()
        time.sleep(0.2)
        window = monitor.window()
    if monitor.note is not None:
        _gpus()  # no GPU: skipped, with why
        raise Failed(f"GPUs are visible but NVML is not readable: {monitor.note}")
    value = lambda key: window.get(key, float("nan"))  # noqa: E731 - a metric this GPU does not expose
    return (f"GPU util {value('gpu_util_pct'):.0f}%, memory used {value('gpu_mem_used_mib'):.0f} MiB, "
            f"power {value('gpu_power_w'):.0f} W")


def check_peer_ipc(scratch: Path, timeout_s: float) -> str:
    gpus = _gpus(need=2)
    import cupy

    runtime = cupy.cuda.runtime
    missing = [(a, b) for a in range(gpus) for b in range(gpus) if a != b and not runtime.deviceCanAccessPeer(a, b)]
    if missing:
        raise Failed(f"no peer access from GPU {missing[0][0]} to GPU {missing[0][1]} ({len(missing)} pair(s))")
    done = []
    for mode in ("peer", "ipc"):
        results = sweep(scratch, f"cuda-{mode}", ["--backend", "cuda", "--cuda-mode", mode, "-N", str(gpus),
                                                  "--algorithm", "ring", "--sizes", "1K,1M"], timeout_s)
        done.append(f"{mode}: {_summary(results)}")
    return f"{gpus} GPUs, peer access between every pair; " + "; ".join(done)


CHECKS = (Check("host-kernels", check_host_kernels), Check("host-schedules", check_host_schedules),
          Check("sim", check_sim), Check("shm", check_shm), Check("gloo", check_gloo),
          Check("gpu-kernels", check_gpu_kernels), Check("nccl", check_nccl), Check("nvml", check_nvml),
          Check("peer-ipc", check_peer_ipc))


def run_checks(checks: tuple[Check, ...] = CHECKS, timeout_s: float = 120.0,
               echo: Callable[[str], None] = print) -> list[Outcome]:
    """Run `checks` one after another, echoing one line each as it ends."""
    outcomes = []
    with tempfile.TemporaryDirectory(prefix="commbench-selftest-") as scratch:
        for check in checks:
            started = time.monotonic()
            try:
                status, detail = "passed", check.run(Path(scratch), timeout_s)
            except Skipped as exc:
                status, detail = "skipped", str(exc)
            except Failed as exc:
                status, detail = "failed", str(exc)
            except Exception as exc:  # noqa: BLE001 - a check that crashes is a failure, reported in one line
                status, detail = "failed", f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            outcomes.append(Outcome(check.name, status, detail, time.monotonic() - started))
            echo(outcomes[-1].line())
    return outcomes


@click.command("selftest", epilog="""
\b
Examples:
  commbench selftest                              # everything that can run here
  commbench selftest --only host-kernels,shm      # some checks
  srun -N 4 --ntasks-per-node 1 commbench selftest   # once on every node of an allocation
""")
@click.option("--only", "only", multiple=True, metavar="NAME[,NAME]",
              help=f"Run only these checks (repeatable or comma-separated): {', '.join(c.name for c in CHECKS)}.")
@click.option("--timeout", "timeout_s", type=float, default=120.0, show_default=True, metavar="SECONDS",
              help="Stop a check's sweep after this long.")
def selftest_command(only: tuple[str, ...], timeout_s: float) -> None:
    """Check that every backend that can run here computes correct results (one line per check).

    CPU: the CUDA kernels built for the CPU against NumPy, the sim, shm and gloo backends.
    GPU: the kernels against CuPy, NCCL through CuPy and torch, NVML, peer access and CUDA
    IPC between the visible GPUs. Exit 0 when nothing failed, 1 when a check failed.
    """
    from commbench.sizes import SizeError, split_list

    try:
        names = [name for entry in only for name in split_list(entry, "--only")]
    except SizeError as exc:
        raise UsageFault(str(exc)) from exc
    known = {c.name: c for c in CHECKS}
    unknown = [name for name in names if name not in known]
    if unknown:
        raise UsageFault(f"no check named {unknown[0]!r}; choose from {', '.join(known)}")
    from commbench.commands.helpers import options as O

    O.check({"--timeout": (O.TIMEOUT, timeout_s)})  # nan, inf, 1e308 or 0.001 failed checks with Python's errors
    checks = tuple(known[name] for name in dict.fromkeys(names)) if names else CHECKS
    started = time.monotonic()
    click.echo(f"# commbench selftest: {len(checks)} check(s) on {socket.gethostname()}")
    outcomes = run_checks(checks, timeout_s, click.echo)
    counts = {s: sum(o.status == s for o in outcomes) for s in ("passed", "failed", "skipped")}
    click.echo(f"# {counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped "
               f"in {time.monotonic() - started:.1f} s")
    if any(o.status == "skipped" and o.detail.startswith("no GPU") for o in outcomes):
        from commbench.backends.cuda.device import INSTALL_HINT

        click.echo(f"# the GPU checks need an NVIDIA GPU and {INSTALL_HINT}")
    if counts["failed"]:
        sys.exit(EXIT_FAILED)
