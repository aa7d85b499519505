"""What a layout's step issues, as torch issues it: every collective and point-to-point call a rank makes.

A TorchDispatchMode sees both paths torch takes to a process group: the c10d ops that DDP, FSDP2,
torch.distributed's Python calls and torch.distributed.pipelining issue (allreduce_, _allgather_base_,
_reduce_scatter_base_, broadcast_, alltoall_base_, send, recv_), and the functional collectives that
DTensor's redistributions issue (_c10d_functional.all_reduce, all_gather_into_tensor,
reduce_scatter_tensor, all_to_all_single). Each call is one `Call`: the collective, the larger
per-rank buffer in bytes (nccl-tests' size, as tests/unit/proxies/test_setups_torch.py records it),
the bytes this rank sends and receives, the dtype, and the group by its mesh dimension's label.
"""
from __future__ import annotations

from dataclasses import dataclass

NAMES = {"allreduce_": "allreduce", "_allgather_base_": "allgather", "allgather_into_tensor_coalesced_": "allgather",
         "_reduce_scatter_base_": "reduce_scatter", "broadcast_": "broadcast", "alltoall_base_": "alltoall",
         "send": "send", "recv_": "recv", "all_reduce": "allreduce", "all_reduce_": "allreduce",
         "all_gather_into_tensor": "allgather", "reduce_scatter_tensor": "reduce_scatter",
         "all_to_all_single": "alltoall", "broadcast": "broadcast"}
SKIPPED = {"wait_tensor", "_wrap_tensor_autograd", "barrier", "monitored_barrier_"}


@dataclass(frozen=True)
class Call:
    """One call of a rank: `nbytes` is the larger per-rank buffer; send/recv bytes are what leaves and
    arrives at this rank's buffers (an all-to-all's differ by rank when its splits do)."""
    collective: str
    nbytes: int
    send_nbytes: int
    recv_nbytes: int
    dtype: str
    group: str

    @property
    def key(self) -> tuple:
        return (self.collective, self.nbytes, self.dtype, self.group)


def _nbytes(value) -> int:
    import torch
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (list, tuple)):
        return sum(_nbytes(v) for v in value)
    return 0


def _tensors(value) -> list:
    import torch
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []


def _group_of(args, labels: dict) -> str:
    """The label of the call's group, found by its ranks: DTensor's cached redistributions may name an
    earlier mesh's group of the same ranks."""
    import torch
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import _resolve_process_group

    for arg in args:
        group = None
        if isinstance(arg, str):  # a functional collective's group name, or its reduce op ("sum")
            try:
                group = _resolve_process_group(arg)
            except (RuntimeError, ValueError, KeyError):
                continue
        elif isinstance(arg, torch.ScriptObject) and "ProcessGroup" in str(arg._type()):
            group = torch._C._distributed_c10d.ProcessGroup.unbox(arg)
        if group is not None:
            ranks = frozenset(dist.get_process_group_ranks(group))
            return labels.get(ranks, f"{len(ranks)} rank(s)")
    return "?"


def _call(name: str, args, result, labels: dict) -> Call:
    """The call's buffers: in-place c10d ops hold input and output among their arguments; functional
    collectives return their output."""
    buffers = [a for a in args if _tensors(a)]
    dtype = str(_tensors(buffers[0])[0].dtype).replace("torch.", "")
    group = _group_of(args, labels)
    if name == "send":
        sent = _nbytes(buffers[0])
        return Call(name, sent, sent, 0, dtype, group)
    if name == "recv":
        got = _nbytes(buffers[0])
        return Call(name, got, 0, got, dtype, group)
    if result is not None:  # functional: input -> output
        sent, received = _nbytes(buffers[0]), _nbytes(result)
    elif name == "alltoall":  # c10d: output, input
        received, sent = _nbytes(buffers[0]), _nbytes(buffers[1])
    else:  # in place (allreduce_, broadcast_) or c10d's (output, input) of gather and scatter
        received = _nbytes(buffers[0])
        sent = _nbytes(buffers[1]) if len(buffers) > 1 else received
    return Call(name, max(sent, received), sent, received, dtype, group)


def trace_mode(calls: list, labels: dict):
    """A TorchDispatchMode appending a `Call` to `calls` for each call a rank makes; `labels` maps a process
    group's ranks (a frozenset of global ranks) to its label (the mesh dimension: tp, pp, cp, dp, ep, edp)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class Trace(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            result = func(*args, **(kwargs or {}))
            if func.namespace in ("c10d", "_c10d_functional") and func._opname not in SKIPPED:
                name = NAMES.get(func._opname, func._opname)
                functional = func.namespace == "_c10d_functional"
                calls.append(_call(name, [*args, *(kwargs or {}).values()], result if functional else None, labels))
            return result
    del torch
    return Trace()


def mesh_labels(mesh, extra: dict | None = None) -> dict:
    """A 4-D mesh's groups (of more than one rank) by their ranks -> dimension label, and any extra
    {label: ProcessGroup}; the labels `trace_mode` takes."""
    import torch.distributed as dist

    groups = {name: mesh.get_group(name) for name in mesh.mesh_dim_names if mesh[name].size() > 1}
    groups.update(extra or {})
    return {frozenset(dist.get_process_group_ranks(group)): label for label, group in groups.items()}


def totals(calls: list[Call]) -> dict[tuple[str, str], tuple[int, int]]:
    """(group label, collective) -> (calls, bytes summed) of one step: the form of
    proxies/layouts/calls.step_bytes, keyed by the group's label rather than the plan's dimension."""
    out: dict[tuple[str, str], tuple[int, int]] = {}
    for call in calls:
        count, nbytes = out.get((call.group, call.collective), (0, 0))
        out[(call.group, call.collective)] = (count + 1, nbytes + call.nbytes)
    return out
