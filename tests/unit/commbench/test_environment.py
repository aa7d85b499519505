"""The run header records, per rank, the variables that change how collectives run."""
from __future__ import annotations

import pytest

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


# ---------------------------------------------------------------- GPUs and versions (issue 36), with fakes


def _fake_cupy():
    import types

    class Device:
        def __init__(self, index=0):
            self.id, self.pci_bus_id = index, f"0000:{0x18 + index:02X}:00.0"

    props = lambda i: {"name": b"NVIDIA H200", "totalGlobalMem": 150_754_820_096, "major": 9, "minor": 0}  # noqa: E731
    runtime = types.SimpleNamespace(getDeviceProperties=props, runtimeGetVersion=lambda: 13000)
    nccl = types.SimpleNamespace(available=True, get_version=lambda: 22809)
    return types.SimpleNamespace(__version__="14.2.0", cuda=types.SimpleNamespace(Device=Device, runtime=runtime,
                                                                                  nccl=nccl))


def test_each_rank_names_its_gpus_and_the_libraries_loaded(monkeypatch):
    import sys

    from commbench.environment import software_versions

    monkeypatch.setitem(sys.modules, "cupy", _fake_cupy())
    gpus = local_environment("cuda", [0, 1])["gpus"]
    assert [g["bus_id"] for g in gpus] == ["0000:18:00.0", "0000:19:00.0"]
    assert gpus[0] == {"index": 0, "model": "NVIDIA H200", "memory_bytes": 150_754_820_096,
                       "bus_id": "0000:18:00.0", "compute_capability": "9.0"}
    versions = software_versions()
    assert versions["cupy"] == "14.2.0" and versions["cuda_runtime"] == "13.0" and versions["nccl"] == "2.28.9"
    assert "driver" in versions
    assert "gpus" not in local_environment("cpu")


def test_torch_on_a_gpu_names_it_too(monkeypatch):
    import sys
    import types

    import torch

    from commbench.environment import software_versions

    monkeypatch.delitem(sys.modules, "cupy", raising=False)
    props = types.SimpleNamespace(name="NVIDIA H200", total_memory=150_754_820_096, major=9, minor=0,
                                  pci_bus_id=0x18, pci_domain_id=0, pci_device_id=0)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: props)
    monkeypatch.setattr(torch.cuda.nccl, "version", lambda: (2, 28, 9))
    (gpu,) = local_environment("cuda")["gpus"]
    assert gpu["model"] == "NVIDIA H200" and gpu["bus_id"] == "0000:18:00.0" and gpu["compute_capability"] == "9.0"
    assert software_versions()["nccl"] == "2.28.9"


def test_torch_is_spelled_in_full_whether_imported_or_not(monkeypatch):
    """The cuda backend never imports torch: its header said 2.11.0 (the distribution's version)
    where the others said 2.11.0+cu130 (torch.__version__)."""
    import sys

    import torch

    from commbench.environment import torch_version

    imported = torch.__version__
    monkeypatch.delitem(sys.modules, "torch")
    assert torch_version() == imported


def test_the_commit_is_commbench_own_checkout_only(tmp_path):
    """An exported tree inside an unrelated repository has no commit; a checkout of its own has."""
    import subprocess

    from commbench.environment import _git_commit

    def git(folder, *args):
        subprocess.run(["git", "-C", str(folder), *args], check=True, capture_output=True)

    outer, own = tmp_path / "outer", tmp_path / "own"
    for root in (outer / "export", own):
        (root / "commbench").mkdir(parents=True)
        (root / "commbench" / "__init__.py").write_text("")
    for repo in (outer, own):
        git(repo, "init", "-q")
        git(repo, "add", ".")
        git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x")
    assert _git_commit(str(outer / "export" / "commbench")) is None
    assert _git_commit(str(own / "commbench"))

# ---------------------------------------------------------------- a host's cores, not one rank's (issue 32)


def test_a_rank_bound_to_one_core_records_the_hosts_cores_and_its_affinity(monkeypatch):
    """mpirun binds each rank to one core: the header said `cpus: 1` for each, and the sweep printed "2 ranks on a
    host of 1 cores (oversubscribed)" on a 2-core host."""
    import os

    from commbench.environment import oversubscribed

    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    entries = []
    for core in (0, 1):
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid, core=core: {core})
        entries.append(local_environment("cpu"))
    assert [(e["cpus"], e["cpu_affinity"]) for e in entries] == [(2, "0"), (2, "1")]
    assert oversubscribed(entries) is None
    assert oversubscribed([entries[0], entries[0]]) == "2 ranks on 1 of the host's 2 cores, by their CPU affinity"


def test_a_hosts_cores_are_its_ranks_affinities_together():
    from commbench.environment import host_cores

    def ranks(*affinities, cpus=8, host="a"):
        return [{"host": host, "cpus": cpus, "cpu_affinity": a} for a in affinities]

    assert host_cores(ranks("0", "1", "2-3")) == {"a": (4, 8)}  # bound one rank a core, or two
    assert host_cores(ranks("0-7", "0-7")) == {"a": (8, 8)}  # not bound: every core
    assert host_cores(ranks("0-1", "0-1")) == {"a": (2, 8)}  # a container's cpuset, or taskset
    assert host_cores(ranks("0", "0", "0")) == {"a": (1, 8)}  # all on one core: they take turns
    assert host_cores(ranks("0") + ranks("0", host="b")) == {"a": (1, 8), "b": (1, 8)}
    assert host_cores(ranks("0-3,2-5", "5,7", "1-2", cpus=16)) == {"a": (7, 16)}  # overlaps counted once
    assert host_cores(ranks("0-65535", cpus=2)) == {"a": (2, 2)}  # never more than the host has
    old = [{"host": "a", "cpus": 2}, {"host": "a", "cpus": 1}]  # before cpu_affinity: cpus was the rank's affinity
    assert host_cores(old) == {"a": (1, None)}
    assert host_cores([{"host": "a"}]) == {"a": (None, None)}


@pytest.mark.parametrize("text", ["0-99999999999", "3-1", "x", "", "1,,2", "0-", "-1", 7, None, "٣"])
def test_an_affinity_a_header_cannot_mean_is_not_expanded(text):
    """A results file is not trusted: a range of 10**11 CPUs would be a set of 10**11 numbers."""
    from commbench.environment import host_cores, parse_affinity

    assert parse_affinity(text) is None
    assert host_cores([{"host": "a", "cpus": 2, "cpu_affinity": text}]) == {"a": (2, None)}


def test_affinity_text_is_tasksets_list():
    from commbench.environment import affinity_text, parse_affinity

    cpus = frozenset({0, 1, 2, 3, 8, 10, 11})
    assert affinity_text(cpus) == "0-3,8,10-11" and parse_affinity("0-3,8,10-11") == [(0, 3), (8, 8), (10, 11)]
    assert affinity_text(None) is None
