"""Local ranks for the benchmark scripts: a target run in fresh spawned processes, its messages yielded.

Every script that runs its own ranks without a launcher (harness_overhead.py, sweep_repeat.py's bare
runs, paired.py without MPI, shm_waits.py, shm_steps.py, model_terms.py, training_phases.py) starts
them here, so a rank that dies or hangs ends the run the same way everywhere: RankFailure, one line.
"""
from __future__ import annotations

import multiprocessing
import os
import queue
import time
from collections.abc import Iterator
from typing import Any, Callable

from commbench.launch import free_port

WORLD = 2


class RankFailure(RuntimeError):
    """A local rank died, or sent nothing for too long; one line for the user."""


def run_local_ranks(target: Callable[..., None], args: tuple, world: int = WORLD,
                    timeout_s: float = 300.0) -> Iterator[Any]:
    """Run target(rank, world, port, outbox, *args) in `world` fresh processes; yield what they put in outbox.

    The ranks rendezvous on loopback at `port`. Each rank gets OMP_NUM_THREADS=1 unless the
    caller set it (as torchrun and `commbench sweep` do). Ends when rank 0 puts None; raises
    RankFailure if a rank exits with an error or nothing arrives for `timeout_s`.
    """
    context = multiprocessing.get_context("spawn")
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # inherited by the ranks before they import torch
    outbox = context.Queue()
    port = free_port()
    procs = [context.Process(target=target, args=(rank, world, port, outbox, *args), daemon=True)
             for rank in range(world)]
    for proc in procs:
        proc.start()
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                message = outbox.get(timeout=0.2)
            except queue.Empty:
                _check_alive(procs, deadline, timeout_s)
                continue
            if message is None:
                break
            deadline = time.monotonic() + timeout_s
            yield message
        for proc in procs:
            proc.join(timeout=30)
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.terminate()
                proc.join()


def _check_alive(procs: list, deadline: float, timeout_s: float) -> None:
    for rank, proc in enumerate(procs):
        if proc.exitcode not in (None, 0):
            raise RankFailure(f"rank {rank} exited with code {proc.exitcode}")
    if all(proc.exitcode == 0 for proc in procs):
        raise RankFailure("the ranks exited without reporting their results")
    if time.monotonic() > deadline:
        raise RankFailure(f"no result for {timeout_s:g} s: a rank hung")
