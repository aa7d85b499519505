"""--backend cupy (NCCL through CuPy) on GPUs: every collective through the harness's check,
under a CUDA graph (the comparison with NCCL through torch, a speed target, is in
benchmarks/gpu_bandwidth.py). Without a GPU these skip; the no-GPU message is tested in
test_sched.py (for both backends).
Without a GPU too: how the backend waits for NCCL (polling, abort on a dead peer)."""
import time
import types

import pytest
from conftest import commbench, gpu_count, results_of

from commbench.backends.cuda.nccl import NCCL_DTYPES, NCCL_OPS
from commbench.collectives import DTYPES, OPS
from commbench.launch import peer_wait_s

GPUS = gpu_count("cupy")
needs_gpu = pytest.mark.skipif(GPUS == 0, reason="needs a CUDA device and CuPy")
QUICK = ["--iters", "3", "--warmup", "1"]


def test_every_dtype_and_op_has_an_nccl_name():
    """No GPU needed: the tables cover what commbench sweeps, and name real cupy.cuda.nccl constants."""
    assert set(NCCL_DTYPES) == set(DTYPES) and set(NCCL_OPS) == set(OPS)
    nccl = pytest.importorskip("cupy.cuda.nccl", exc_type=ImportError)
    assert all(isinstance(getattr(nccl, name), int) for name in [*NCCL_DTYPES.values(), *NCCL_OPS.values()])


def _run(tmp_path, name, backend, *args, timeout=900):
    """(exit code, stderr, results, records) of one sweep; what went wrong is kept, not only the first."""
    path = tmp_path / f"{name}.jsonl"
    proc = commbench("sweep", "--backend", backend, "-N", str(GPUS), *args, "--json", str(path), timeout=timeout)
    results, records = results_of(path) if path.exists() else ([], [])
    return proc.returncode, proc.stderr, results, records


def _sweep(tmp_path, name, backend, *args, timeout=900):
    code, stderr, results, records = _run(tmp_path, name, backend, *args, timeout=timeout)
    assert code == 0, stderr
    assert results and all(r["wrong"] == 0 for r in results), [(r["collective"], r["wrong"]) for r in results]
    return results, records


@needs_gpu
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_every_collective_passes_the_check(tmp_path, dtype):
    """Every op runs even after one fails, and the failure names each wrong point (issue 36: the
    first GPU run lost which op and collective failed for the float dtypes)."""
    collectives = "allreduce,allgather,reduce_scatter,broadcast,reduce,alltoall" + (",sendrecv" if GPUS > 1 else "")
    failures = []
    for op in ("sum", "prod", "max", "min", "avg"):
        code, stderr, results, records = _run(tmp_path, op, "cupy", *QUICK, "-c", collectives, "--sizes",
                                              "1K,1048592", "--dtype", dtype, "--op", op)
        known = _known_nccl_defect(op, dtype)  # NVIDIA/nccl#1950: said on stderr, and only the tail is wrong
        if known and stderr.count(known) != 1:
            failures.append(f"--op {op}: the warning {known!r} not said once on stderr: {stderr[-2000:]!r}")
        wrong = [(r["collective"], r["placement"], r["nbytes"], r["wrong"]) for r in results if r["wrong"] != 0
                 and not (known and r["placement"] == "out-of-place" and 0 < r["wrong"] < 32)]
        if code != 0 or wrong or not results:
            failures.append(f"--op {op}: exit {code}, wrong points {wrong}, stderr {stderr.strip()[-2000:]!r}")
        else:
            assert records[0]["library"] == "nccl" and {r["device"] for r in results} == {"cuda"}
    assert not failures, "\n".join(failures)


def _known_nccl_defect(op, dtype):
    from commbench.backends.cuda.nccl import _loaded_nccl_version
    from commbench.backends.nccl_defects import one_rank_avg_defect
    from commbench.collectives import resolve_dtype

    return one_rank_avg_defect(_loaded_nccl_version(), GPUS, op, resolve_dtype(dtype), ["allreduce"], ["allreduce"])


# ---------------------------------------------------------------- waiting for NCCL, without a GPU


class FakeComm:
    """NcclCommunicator's error check, abort and destroy, logged; `error` raised by the check."""

    def __init__(self, error=None):
        self.error, self.calls = error, []

    def check_async_error(self):
        self.calls.append("check")
        if self.error is not None:
            raise self.error

    def abort(self):
        self.calls.append("abort")

    def destroy(self):
        self.calls.append("destroy")


def _backend(comm, timeout_s, stream_done=True):
    """A CupyBackend's waiting and closing parts, without CuPy's GPU side."""
    from commbench.backends.cuda.nccl import CupyBackend

    backend = object.__new__(CupyBackend)
    backend.comm, backend.timeout_s = comm, timeout_s
    backend.stream = types.SimpleNamespace(done=stream_done)
    backend._group = types.SimpleNamespace(close=lambda: None)  # the control plane (backends/dist_group.py)
    return backend


NEVER_DONE = types.SimpleNamespace(done=False)  # an event behind an NCCL kernel waiting for a dead peer


def test_a_wait_on_a_dead_peer_aborts_at_the_timeout():
    comm = FakeComm()
    backend = _backend(comm, timeout_s=0.05)
    started = time.monotonic()
    with pytest.raises(RuntimeError, match=r"NCCL did not finish within --timeout 0.05 s; communicator aborted$"):
        backend._wait(NEVER_DONE)
    assert peer_wait_s(0.05) <= time.monotonic() - started < 5  # within --timeout, the stop margin left over
    assert comm.calls.count("check") > 1 and comm.calls[-1] == "abort" and backend.comm is None
    backend.close()  # already aborted: neither destroyed nor aborted twice
    assert comm.calls.count("abort") == 1 and "destroy" not in comm.calls
    with pytest.raises(RuntimeError, match="aborted after an earlier fault"):
        backend._wait(NEVER_DONE)


def test_an_nccl_error_seen_while_waiting_aborts_and_is_raised():
    comm = FakeComm(RuntimeError("NCCL_ERROR_REMOTE_ERROR: remote process exited or there was a network error"))
    with pytest.raises(RuntimeError, match="remote process exited"):
        _backend(comm, timeout_s=60)._wait(NEVER_DONE)
    assert comm.calls == ["check", "abort"]


def test_finished_work_is_waited_for_without_a_check():
    comm = FakeComm()
    _backend(comm, timeout_s=60)._wait(types.SimpleNamespace(done=True))
    assert comm.calls == []


@pytest.mark.parametrize("stream_done,verb", [(True, "destroy"), (False, "abort")])
def test_close_destroys_after_a_clean_run_and_aborts_with_work_queued(stream_done, verb):
    comm = FakeComm()
    _backend(comm, timeout_s=60, stream_done=stream_done).close()
    assert comm.calls == [verb]


# ---------------------------------------------------------------- on GPUs


@needs_gpu
def test_graph_replay(tmp_path):
    """--graph times one replay of the captured calls: per call no slower than the same calls
    issued eagerly (a graph removes launch overhead), never the whole graph's time."""
    args = [*QUICK, "-c", "allreduce,allgather", "--sizes", "1K,16M"]
    graph, records = _sweep(tmp_path, "graph", "cupy", *args, "--graph")
    eager, _ = _sweep(tmp_path, "eager", "cupy", *args)
    eager_us = {(r["collective"], r["nbytes"], r["placement"]): r["time_us"] for r in eager}
    assert records[0]["config"]["graph"]
    for r in graph:
        assert r["iters"] == 3 and r["time_us"] < 1.5 * eager_us[(r["collective"], r["nbytes"], r["placement"])], r
