"""backends/dist_group.py: a rank's torch.distributed group as one object a backend owns (the rendezvous,
the gloo control plane, the timed loop), and the backends that need only its control plane own one rather
than inherit the torch backend."""
from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys

import pytest
from conftest import clean_env

from commbench.backends.torch_dist import TorchBackend

RANK = """
import json, os, sys
import torch.distributed as dist
from commbench.backends.dist_group import DistGroup
from commbench.launchers import LaunchInfo

rank, world, port = map(int, sys.argv[1:])
group = DistGroup(LaunchInfo.local(rank, world, port, launcher="spawn"), "cpu", "gloo", timeout_s=60)
calls = []
times_us = group.time_iterations(lambda: calls.append(1), 5)
hosts = group.control.all_gather_objects(f"rank{rank}")
group.barrier()
group.synchronize()
group.close()
print(json.dumps({"calls": len(calls), "times_us": times_us.tolist(), "hosts": hosts,
                  "initialized": dist.is_initialized()}), flush=True)
# as a job's rank ends (job.py): in the interpreter's own teardown torch's threads once aborted a rank here
# ("terminate called without an active exception", a fresh-clone CI run of 2026-11-27)
os._exit(0)
"""


def test_ranks_join_exchange_time_and_leave(port):
    ranks = [subprocess.Popen([sys.executable, "-c", RANK, str(rank), "2", str(port)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=clean_env()) for rank in range(2)]
    outs = [proc.communicate(timeout=120) for proc in ranks]
    assert [proc.returncode for proc in ranks] == [0, 0], [err for _, err in outs]
    for out, _ in outs:
        seen = json.loads(out.splitlines()[-1])
        assert seen["calls"] == 5 and len(seen["times_us"]) == 5 and all(t >= 0 for t in seen["times_us"])
        assert seen["hosts"] == ["rank0", "rank1"]  # the control plane: every rank's object, in rank order
        assert seen["initialized"] is False  # closed: the default group destroyed


@pytest.mark.parametrize("name", ["shm", "hybrid"])
def test_the_shared_memory_backends_own_a_group_rather_than_inherit_the_torch_backend(name):
    """Before, ShmBackend (and hybrid, its subclass) inherited TorchBackend for the rendezvous and the control
    plane; now it owns a DistGroup (`group`) and names the timed loop and the close it takes from it."""
    from commbench.backends import backend_class

    cls = backend_class(name)
    assert TorchBackend not in cls.__mro__
    assert {"time_iterations", "synchronize", "close"} <= set(vars(backend_class("shm")))


def test_gpu_timing_takes_the_stream_once_and_times_every_call(monkeypatch):
    """On a GPU each call sits between two events on the current stream, looked up once before the loop (the
    H100 run of 2026-11-27 found commbench's torch loop 17-20 us a call slower than a bare one: docs/gpu.md)."""
    import torch

    from commbench.backends import dist_group

    lookups, recorded = [], []

    class Event:
        def __init__(self, enable_timing):
            self.at = None

        def record(self, stream=None):
            recorded.append(stream)
            self.at = len(recorded)

        def elapsed_time(self, end):  # ms: one per record between them
            return (end.at - self.at) * 1.0

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: lookups.append(1) or "the stream")
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    group = object.__new__(dist_group.DistGroup)
    group.device = "cuda"
    calls = []
    times = group.time_iterations(lambda: calls.append(1), 5)
    assert len(calls) == 5 and list(times) == [1000.0] * 5
    assert lookups == [1] and recorded == ["the stream"] * 10


def test_the_local_rendezvous_falls_back_to_the_classic_store_where_libuv_refuses_its_socket(monkeypatch):
    """torch 2.4 to 2.6's default store server (libuv) refuses a socket handed to it: every rank-starting command
    failed at the rendezvous on torch 2.6.0 (README, "Which torch"). There the classic server takes a fresh
    socket; where libuv takes it (torch 2.14.1), it serves the rendezvous as before."""
    import torch.distributed

    from commbench.backends import dist_group

    made, sockets, state = [], iter([97, 98, 99]), {"refuse": True}

    class Store:
        def __init__(self, host, port, world, is_master, timeout, **kwargs):
            made.append((is_master, kwargs))
            if state["refuse"] and is_master and kwargs.get("use_libuv", True):
                raise RuntimeError("The libuv TCPStore backend does not support initialization with an listen fd.")

    monkeypatch.setattr(torch.distributed, "TCPStore", Store)  # dist_group.dist is torch.distributed, lazily
    monkeypatch.setattr(dist_group, "_listen_on_loopback", lambda port: next(sockets))
    url = "commbench-loopback://127.0.0.1:29555?rank={}&world_size=2"
    for refuse, rank, wanted in ((True, 0, [(True, {"master_listen_fd": 97}),
                                            (True, {"master_listen_fd": 98, "use_libuv": False})]),
                                 (True, 1, [(False, {})]), (False, 0, [(True, {"master_listen_fd": 99})])):
        made.clear()
        state["refuse"] = refuse
        store, got_rank, world = next(dist_group._loopback_rendezvous(url.format(rank), datetime.timedelta(seconds=1)))
        assert (got_rank, world) == (rank, 2) and made == wanted


def test_rank_0s_store_serves_on_the_socket_its_spawner_bound_and_takes_it_once(monkeypatch):
    """launch.spawn_local binds the store's port and hands rank 0 the socket: its store serves on that socket (a
    fresh bind of the port fails while it serves), the variable is taken so a second store binds its own, and
    a variable that names no socket on the port is passed over (the descriptor left as it was: not ours)."""
    import torch.distributed

    from commbench.backends import dist_group
    from commbench.launch import STORE_FD_VAR, loopback_socket

    held = loopback_socket(reuse=False)  # as launch.spawn_local binds it
    port = held.getsockname()[1]
    monkeypatch.setenv(STORE_FD_VAR, str(held.detach()))
    store = dist_group._store(port, 1, 0, datetime.timedelta(seconds=5))
    assert STORE_FD_VAR not in dist_group.os.environ
    with pytest.raises(OSError):  # the store serves on the held socket: the port cannot be bound again
        loopback_socket(port).close()
    client = torch.distributed.TCPStore("127.0.0.1", port, 1, False, datetime.timedelta(seconds=5))
    client.set("k", "v")
    assert store.get("k") == b"v"
    other = loopback_socket().detach()
    monkeypatch.setenv(STORE_FD_VAR, str(other))  # a socket, but on another port: not served, and not closed
    assert dist_group._spawners_socket(port) is None
    os.fstat(other)
    os.close(other)
    monkeypatch.setenv(STORE_FD_VAR, "not a number")
    assert dist_group._spawners_socket(port) is None
