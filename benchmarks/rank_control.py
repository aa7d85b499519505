"""The control plane of paired.py's ranks, outside every timed loop: a barrier, the max over ranks (one
value or an array) and a broadcast, through MPI (`MpiControl`, under mpirun) or through the gloo process
group the ranks already hold (`TorchControl`, local ranks without MPI)."""
from __future__ import annotations

from typing import Any

import numpy as np


class MpiControl:
    """Barrier and max-over-ranks through MPI (outside every timed loop)."""

    def __init__(self):
        from mpi4py import MPI

        self.mpi, self.comm = MPI, MPI.COMM_WORLD
        self.rank, self.world = self.comm.rank, self.comm.size

    def barrier(self) -> None:
        self.comm.Barrier()

    def max(self, value: float) -> float:
        return self.comm.allreduce(value, op=self.mpi.MAX)

    def max_each(self, values: np.ndarray) -> np.ndarray:
        out = np.empty_like(values)
        self.comm.Allreduce(values, out, op=self.mpi.MAX)
        return out

    def bcast(self, value: Any) -> Any:
        return self.comm.bcast(value, root=0)


class TorchControl:
    """The same through the gloo process group (local ranks without MPI)."""

    def __init__(self, rank: int, world: int):
        self.rank, self.world = rank, world

    def barrier(self) -> None:
        import torch.distributed as dist

        dist.barrier()

    def max(self, value: float) -> float:
        return float(self.max_each(np.array([value], dtype=np.float64))[0])

    def max_each(self, values: np.ndarray) -> np.ndarray:
        import torch
        import torch.distributed as dist

        tensor = torch.from_numpy(np.ascontiguousarray(values, dtype=np.float64).copy())
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        return tensor.numpy()
