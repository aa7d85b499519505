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


def _cache_dir(root, entries):
    for name, (level, kind, size) in entries.items():
        folder = root / name
        folder.mkdir(parents=True)
        (folder / "level").write_text(f"{level}\n")
        (folder / "type").write_text(f"{kind}\n")
        (folder / "size").write_text(f"{size}\n")
    return str(root)


def test_the_last_level_cache_is_the_highest_data_level(tmp_path):
    from commbench.environment import last_level_cache_bytes

    sysfs = _cache_dir(tmp_path / "a", {"index0": (1, "Data", "48K"), "index1": (1, "Instruction", "32K"),
                                        "index2": (2, "Unified", "1024K"), "index3": (3, "Unified", "32768K")})
    assert last_level_cache_bytes(sysfs) == 32 << 20
    only_instructions = _cache_dir(tmp_path / "b", {"index0": (1, "Data", "48K"), "index1": (2, "Instruction", "2M")})
    assert last_level_cache_bytes(only_instructions) == 48 << 10
    assert last_level_cache_bytes(_cache_dir(tmp_path / "c", {"index0": (3, "Unified", "lots")})) is None
    assert last_level_cache_bytes(str(tmp_path / "missing")) is None
    assert "llc_bytes" in local_environment("cpu")
