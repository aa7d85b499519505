"""Shared helpers: run the real `commbench` command as users do, and find its rank processes."""
import contextlib
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from commbench.launch import free_port
from commbench.results import read_records

REPO = Path(__file__).resolve().parent.parent  # the checkout: docs/, benchmarks/, the package's folders
DATA = REPO / "tests" / "data"  # recorded runs some tests read

LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                 "TORCHELASTIC_RUN_ID", "SLURM_PROCID", "SLURM_STEP_ID", "OMPI_COMM_WORLD_RANK", "PMI_RANK",
                 "COMMBENCH_SPAWN_ID")


def pytest_collection_modifyitems(config, items):
    """Every test in tests/system/ is a system test (`-m "not system"` leaves them out)."""
    system = REPO / "tests" / "system"
    for item in items:
        if system in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.system)


def gpu_count(backend: str) -> int:
    """GPUs `backend` (cuda, cupy) can use here; 0 without a GPU or CuPy."""
    from commbench.backends import BackendError
    from commbench.backends.cuda.device import require_gpu

    try:
        return require_gpu(backend)
    except BackendError:
        return 0


def default_sigint():
    """Popen preexec_fn: SIGINT at its default, as in a terminal's foreground job.

    A job that a non-interactive shell put in the background (`pytest ... &`) inherits
    SIGINT ignored, and Python then installs no KeyboardInterrupt handler: the Ctrl-C
    tests would see the signal ignored and the run finish with exit 0.
    """
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def clean_env(**extra):
    """This environment without any launcher's variables (pytest itself may run under one)."""
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS}
    env.update(extra)
    return env


def commbench(*args, timeout=180, env=None, **kwargs):
    """Run `python -m commbench ARGS` to completion; CompletedProcess with text output."""
    return subprocess.run([sys.executable, "-m", "commbench", *args], capture_output=True, text=True,
                          timeout=timeout, env=env or clean_env(), **kwargs)


# the spawner's first line and a log's progress lines (commbench/job.py, commbench/table.py): not what a run says
PROGRESS_LINE = re.compile(r"^commbench: (\w[\w-]*: starting \d+ rank|\d+/\d+ \w+, )")


def notes_joined(stdout: str, width: int = 120) -> list[str]:
    """The lines of `stdout` with each `#` note that commands/helpers/common.py note_lines broke at `width` joined back
    into one line (a line is a continuation when it is indented two past its note's first line and its first
    word did not fit on the line before), so a test can find a note's words wherever the breaks fell."""
    joined: list[str] = []
    lead, last = -1, ""
    for line in stdout.splitlines():
        text = line[1:].lstrip(" ")
        indent = len(line) - len(text)
        if (joined and line.startswith("#") and last.startswith("#") and text and indent == lead + 2
                and len(last) + 1 + len(text.split()[0]) > width):
            joined[-1] += " " + text
        else:
            joined.append(line)
            lead = indent
        last = line
    return joined


def said_lines(stderr: str) -> list[str]:
    """The lines of `stderr` that say something (errors, notes), without the progress lines."""
    return [line for line in stderr.strip().splitlines() if not PROGRESS_LINE.match(line)]


def results_of(path):
    records = read_records(str(path))
    return [r for r in records if r["record"] == "result"], records


def rank_pid(parent_pid, rank, timeout=60):
    """PID of local rank `rank` spawned by the commbench process `parent_pid`."""
    psutil = pytest.importorskip("psutil")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for child in psutil.Process(parent_pid).children():
            try:
                if child.environ().get("RANK") == str(rank):
                    return child.pid
            except psutil.Error:
                continue
        time.sleep(0.1)
    raise TimeoutError(f"rank {rank} of {parent_pid} did not start")


def wait_for_results(path, count, proc, timeout=120):
    """Block until `path` holds `count` result records (or the process ended)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if path.exists() and len(results_of(path)[0]) >= count:
            return
        time.sleep(0.1)
    raise AssertionError(f"never saw {count} results in {path}")


@pytest.fixture
def port():
    return free_port()


def shm_segments(prefix: str = "cb_"):
    """commbench's shared-memory segments in /dev/shm now (cb_<job>_...) whose names start with `prefix`."""
    from commbench.launch import SHM_DIR

    return sorted(n for n in os.listdir(SHM_DIR) if n.startswith(prefix)) if os.path.isdir(SHM_DIR) else []


@contextlib.contextmanager
def own_segments():
    """Run the body under a job tag of its own (COMMBENCH_JOB_TAG, which starts the name of every segment its
    jobs make, spawned ranks' included) and fail if a segment under that tag is left when it ends. Only the
    tag's segments are looked at: another commbench run on the machine, the suite's own or anyone's, can make
    and keep segments meanwhile."""
    from commbench.launch import JOB_TAG_VAR

    tag, saved = f"t{uuid.uuid4().hex[:8]}", os.environ.get(JOB_TAG_VAR)
    os.environ[JOB_TAG_VAR] = tag
    try:
        yield tag
    finally:
        if saved is None:
            os.environ.pop(JOB_TAG_VAR, None)
        else:
            os.environ[JOB_TAG_VAR] = saved
    left = shm_segments(f"cb_{tag}")
    assert not left, f"commbench left shared-memory segments behind: {left}"


@pytest.fixture
def clean_shm():
    """The test leaves none of its own shared-memory segments behind (own_segments)."""
    with own_segments() as tag:
        yield tag


def torch_import_vm_bytes() -> int:
    """Peak virtual memory of a process that has imported torch and torch.distributed (for address-space
    limits that leave room for torch and not for the buffers a test asks for)."""
    code = ("import torch, torch.distributed\n"
            "print(open('/proc/self/status').read().split('VmPeak:')[1].split()[0])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    return int(out.stdout.strip()) * 1024


C10D_NAMES = {"allreduce_": "allreduce", "_allgather_base_": "allgather", "_reduce_scatter_base_": "reduce_scatter",
              "broadcast_": "broadcast", "alltoall_base_": "alltoall", "send": "send", "recv_": "recv"}


def c10d_trace(calls, labels, unlabelled=lambda group: f"{group.size()} rank(s)"):
    """A TorchDispatchMode that appends each c10d call a rank issues to `calls` (DDP's from its C++ Reducer
    too), as (collective, bytes: its larger per-rank buffer, nccl-tests' size, dtype, group: its label in
    `labels` by group name, else `unlabelled(the process group)`). A collective without a name in C10D_NAMES
    keeps c10d's operator name."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class Trace(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.namespace == "c10d":
                buffers, group = [], None
                for arg in args:
                    tensors = [arg] if isinstance(arg, torch.Tensor) else \
                        [t for t in arg if isinstance(t, torch.Tensor)] if isinstance(arg, list) else []
                    if tensors:
                        buffers.append((sum(t.numel() * t.element_size() for t in tensors), str(tensors[0].dtype)))
                    elif isinstance(arg, torch.ScriptObject) and group is None and "ProcessGroup" in str(arg._type()):
                        pg = torch._C._distributed_c10d.ProcessGroup.unbox(arg)
                        group = labels[pg.group_name] if pg.group_name in labels else unlabelled(pg)
                nbytes, dtype = max(buffers)
                calls.append((C10D_NAMES.get(func._opname, func._opname), nbytes, dtype.replace("torch.", ""), group))
            return func(*args, **(kwargs or {}))
    return Trace()


def spawn_ranks(target, world: int, *args, timeout=240) -> dict:
    """Run `target(rank, world, port, *args, queue)` in `world` spawned processes (each a rank of a local job on
    loopback) and return {rank: the report it put on the queue}. A rank ends with end_rank."""
    import multiprocessing

    context, job_port = multiprocessing.get_context("spawn"), free_port()
    queue = context.Queue()
    procs = [context.Process(target=target, args=(r, world, job_port, *args, queue)) for r in range(world)]
    for proc in procs:
        proc.start()
    reports = dict(queue.get(timeout=timeout) for _ in procs)
    for proc in procs:
        proc.join(timeout=60)
    return reports


def end_rank(backend, queue, rank: int, report) -> None:
    """A spawned rank's end: its report in the pipe (os._exit does not flush a queue's feeder thread), every rank
    done before any tears its process group down, then out without torch's exit-time teardown."""
    queue.put((rank, report))
    queue.close()
    queue.join_thread()
    backend.gather_objects(None)
    backend.close()
    os._exit(0)
