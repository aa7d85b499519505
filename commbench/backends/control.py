"""The control plane: how ranks exchange the few numbers and objects the harness needs
(iteration counts, per-iteration times, error counts, hosts, rendezvous tags). It is never
timed and never shares a stream with the measured traffic.

Every backend holds one (`Backend.control`): a gloo group when ranks are processes
(torch, shm, p2p, hybrid, and beside NCCL or CUDA IPC for cupy and cuda's ipc mode; the
process group the backend owns builds it, backends/dist_group.py), or `LocalControl` when
every rank lives in this process (sim, cuda's virtual and peer modes).
"""
from __future__ import annotations

from typing import Any

import numpy as np


class LocalControl:
    """Every rank in this process: each value is already everyone's."""

    def gather(self, values: np.ndarray) -> np.ndarray:
        return np.asarray(values, dtype=np.float64)[None, :]

    def agree_max(self, values: np.ndarray) -> np.ndarray:
        return np.asarray(values, dtype=np.float64)

    def gather_objects(self, obj: Any) -> list[Any]:
        return [obj]

    def all_gather_objects(self, obj: Any) -> list[Any]:
        return [obj]

    def broadcast_object(self, obj: Any) -> Any:
        return obj

    def barrier(self) -> None:
        pass


class GroupControl:
    """A torch.distributed gloo group on the CPU (`group` None: the default group)."""

    def __init__(self, group: Any, rank: int, world: int):
        self.group, self.rank, self.world = group, rank, world

    def gather(self, values: np.ndarray) -> np.ndarray | None:
        """float64 vectors of equal length from every rank, stacked on rank 0."""
        import torch
        import torch.distributed as dist

        local = torch.from_numpy(np.ascontiguousarray(values, dtype=np.float64))
        out = [torch.empty_like(local) for _ in range(self.world)]
        dist.all_gather(out, local, group=self.group)
        return torch.stack(out).numpy() if self.rank == 0 else None

    def agree_max(self, values: np.ndarray) -> np.ndarray:
        """Element-wise maximum over ranks, on every rank."""
        import torch
        import torch.distributed as dist

        tensor = torch.from_numpy(np.array(values, dtype=np.float64))
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=self.group)
        return tensor.numpy()

    def gather_objects(self, obj: Any) -> list[Any] | None:
        """One picklable object per rank, as a list on rank 0."""
        out = self.all_gather_objects(obj)
        return out if self.rank == 0 else None

    def all_gather_objects(self, obj: Any) -> list[Any]:
        """Every rank's object, on every rank."""
        import torch.distributed as dist

        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj, group=self.group)
        return out

    def broadcast_object(self, obj: Any) -> Any:
        """Rank 0's object, on every rank."""
        import torch.distributed as dist

        box = [obj]
        dist.broadcast_object_list(box, src=0, group=self.group)
        return box[0]

    def barrier(self) -> None:
        import torch.distributed as dist

        dist.barrier(group=self.group)
