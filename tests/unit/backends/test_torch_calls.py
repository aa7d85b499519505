"""One name -> torch.distributed call switch for the backend and every replay, with torch's older names where
the newer are missing (setup.py accepts torch 2.1, which has only all_gather_into_tensor/reduce_scatter_tensor)."""
from types import SimpleNamespace

import pytest

from commbench.backends.torch_calls import COLLECTIVES, issue, shard_calls


def _dist(newer: bool):
    calls = []

    def record(name):
        return lambda *args, **kwargs: calls.append((name, args, kwargs)) or name

    names = ["all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor", "broadcast", "reduce",
             "all_to_all_single"] + (["all_gather_single", "reduce_scatter_single"] if newer else [])
    return SimpleNamespace(**{n: record(n) for n in names}), calls


@pytest.mark.parametrize("newer", [True, False])
def test_each_collective_is_its_torch_call_with_the_names_this_torch_has(newer):
    dist, calls = _dist(newer)
    expected = {"allreduce": "all_reduce", "allgather": "all_gather_single" if newer else "all_gather_into_tensor",
                "reduce_scatter": "reduce_scatter_single" if newer else "reduce_scatter_tensor",
                "broadcast": "broadcast", "reduce": "reduce", "alltoall": "all_to_all_single"}
    for collective in COLLECTIVES:
        assert issue(dist, collective, "send", "recv", group="g", root=3) == expected[collective]
        name, args, kwargs = calls[-1]
        assert kwargs["group"] == "g" and kwargs["async_op"] is True
        assert args[0] == "recv" and (args[1] in ("send", 3) if len(args) > 1 else collective == "allreduce")
    assert [n for n, _, _ in calls] == [expected[c] for c in COLLECTIVES]
    assert shard_calls(dist)[0] is getattr(dist, expected["allgather"])
    with pytest.raises(KeyError):
        issue(dist, "gather", "s", "r")


def test_this_torch_has_one_of_each():
    dist = pytest.importorskip("torch.distributed")
    gather, scatter = shard_calls(dist)
    assert callable(gather) and callable(scatter)
