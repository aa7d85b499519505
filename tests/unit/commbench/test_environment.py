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


def _group(root, relative, name, text):
    folder = root.joinpath(*[part for part in relative.split("/") if part])
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(text)


def test_the_memory_limit_is_the_memory_groups_when_lower(tmp_path):
    """cgroup v2 (memory.max) and v1 (memory.limit_in_bytes), the group's own limit or a parent's,
    "max" and v1's near-2^63 "unlimited" ignored; the host's RAM otherwise."""
    from commbench.environment import memory_limit_bytes

    host = memory_limit_bytes(str(tmp_path / "none"), str(tmp_path / "none"))
    assert host and host > 1 << 28  # no group to read: the host's RAM
    v2, v1 = tmp_path / "v2", tmp_path / "v1"
    (tmp_path / "v2.cgroup").write_text("0::/job/step\n")
    _group(v2, "/job/step", "memory.max", "max\n")
    _group(v2, "/job", "memory.max", f"{3 << 30}\n")  # the parent's limit holds for its children
    assert memory_limit_bytes(str(v2), str(tmp_path / "v2.cgroup")) == min(3 << 30, host)
    (tmp_path / "v1.cgroup").write_text("4:memory:/process_api/abc\n3:cpuset:/\n")
    _group(v1, "/memory/process_api/abc", "memory.limit_in_bytes", f"{1 << 30}\n")
    _group(v1, "/memory", "memory.limit_in_bytes", "9223372036854771712\n")
    assert memory_limit_bytes(str(v1), str(tmp_path / "v1.cgroup")) == 1 << 30
    (tmp_path / "inside.cgroup").write_text("4:memory:/not/mounted/here\n")  # a container sees its group as /
    _group(tmp_path / "inside", "/memory", "memory.limit_in_bytes", f"{2 << 30}\n")
    assert memory_limit_bytes(str(tmp_path / "inside"), str(tmp_path / "inside.cgroup")) == 2 << 30
