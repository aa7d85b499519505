"""The torch.distributed call of each collective name, written once for the backend and every replay (issue 46:
the switch was written four times and the copies disagreed: replay_layout called the newer *_single names that
torch before they were added lacks).

torch names the tensor all-gather and reduce-scatter `all_gather_single` / `reduce_scatter_single` where it has
them (the older `*_into_tensor` / `reduce_scatter_tensor` names warn there) and only the older names before
(torch 2.11, setup.py's floor, has only the older ones): `shard_calls` picks, once. `issue` makes the
asynchronous call of one collective on buffers shaped as the caller's (recv in place for allreduce, broadcast
and reduce).
"""
from __future__ import annotations

from typing import Any

COLLECTIVES = ("allreduce", "allgather", "reduce_scatter", "broadcast", "reduce", "alltoall")


def shard_calls(dist) -> tuple[Any, Any]:
    """(all-gather, reduce-scatter) of whole tensors: the newer names where this torch has them, else the older."""
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    return gather, scatter


def issue(dist, collective: str, send, recv, group=None, root: int = 0):
    """Start `collective` (async_op=True) on `group`; its Work. KeyError for a name not in COLLECTIVES."""
    if collective == "allreduce":
        return dist.all_reduce(recv, group=group, async_op=True)
    if collective in ("allgather", "reduce_scatter"):
        call = shard_calls(dist)[collective == "reduce_scatter"]
        return call(recv, send, group=group, async_op=True)
    if collective == "broadcast":
        return dist.broadcast(recv, root, group=group, async_op=True)
    if collective == "reduce":
        return dist.reduce(recv, root, group=group, async_op=True)
    if collective == "alltoall":
        return dist.all_to_all_single(recv, send, group=group, async_op=True)
    raise KeyError(collective)
