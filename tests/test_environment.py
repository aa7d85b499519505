"""The run header records, per rank, the variables that change how collectives run."""
from __future__ import annotations

from commbench.environment import communication_variables, local_environment


def test_only_communication_variables_are_recorded():
    environ = {"NCCL_IB_HCA": "mlx5_0", "GLOO_SOCKET_IFNAME": "eth0", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
               "OMP_NUM_THREADS": "1", "HOME": "/root", "AWS_SECRET_ACCESS_KEY": "x", "PATH": "/bin"}
    assert communication_variables(environ) == {"GLOO_SOCKET_IFNAME": "eth0", "NCCL_IB_HCA": "mlx5_0",
                                                "OMP_NUM_THREADS": "1", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}


def test_the_header_of_a_rank_carries_them(monkeypatch):
    monkeypatch.setenv("NCCL_DEBUG", "INFO")
    assert local_environment("cpu")["env"]["NCCL_DEBUG"] == "INFO"
