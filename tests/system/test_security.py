"""What commbench exposes and what it runs: a local spawn listens on loopback only, and a profile
file is data (the code its `source.spec` names is imported only with --trust-profile-code)."""
import ipaddress
import json
import os
import socket
import subprocess
import sys
import time

import pytest
from conftest import REPO, clean_env, commbench

from commbench.proxies.catalog import ModelError, runs_foreign_code
from commbench.proxies.profile import load_profile
from commbench.proxies.train import model_for

SOURCES = [str(REPO / folder) for folder in ("commbench", "proxies", "analysis")]


# ---------------------------------------------------------------- a local spawn's sockets


def _listening() -> dict[str, tuple[str, int]]:
    """Socket inode -> (address, port) of every listening TCP socket on this host (/proc/net)."""
    out = {}
    for table in ("tcp", "tcp6"):
        with open(f"/proc/net/{table}", encoding="ascii") as handle:
            next(handle)
            for line in handle:
                fields = line.split()
                if fields[3] == "0A":  # TCP_LISTEN
                    address, port = fields[1].split(":")
                    out[fields[9]] = (_address(address), int(port, 16))
    return out


def _address(hex_address: str) -> str:
    """/proc/net's address: 32-bit words in the host's byte order."""
    raw = bytes.fromhex(hex_address)
    if sys.byteorder == "little":
        raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return socket.inet_ntop(socket.AF_INET if len(raw) == 4 else socket.AF_INET6, raw)


def _is_loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    return ip.is_loopback or (ip.version == 6 and ip.ipv4_mapped is not None and ip.ipv4_mapped.is_loopback)


def _children(pid: int) -> list[int]:
    kids = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as handle:
                if int(handle.read().rsplit(")", 1)[1].split()[1]) == pid:
                    kids.append(int(entry))
        except (OSError, IndexError, ValueError):
            continue
    return kids


def _sockets_of(pid: int) -> set[str]:
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.startswith("socket:["):
                inodes.add(target[len("socket:["):-1])
    except OSError:  # the rank ended meanwhile
        pass
    return inodes


def _master_port(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            env = dict(item.split(b"=", 1) for item in handle.read().split(b"\0") if b"=" in item)
        return int(env[b"MASTER_PORT"])
    except (OSError, KeyError, ValueError):
        return None


def _other_interface() -> str | None:
    """An interface other than loopback that has an IPv4 address (Linux's SIOCGIFADDR), if any."""
    import fcntl
    import struct

    for _, name in socket.if_nameindex():
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            try:
                fcntl.ioctl(probe.fileno(), 0x8915, struct.pack("256s", name[:15].encode()))
            except OSError:
                continue
        if not name.startswith("lo"):
            return name
    return None


def _outward_address() -> str | None:
    """This host's address on its default route, if it has one (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))
            address = probe.getsockname()[0]
        except OSError:
            return None
    return None if ipaddress.ip_address(address).is_loopback else address


def plant_modules(folder, marker):
    """Modules named as the standard library's that a rank imports (uuid: launch.py's job ids), each
    writing `marker` when imported: the trap of issue 26 (`python -m` puts the cwd first)."""
    for name in ("uuid", "selectors", "secrets"):
        (folder / f"{name}.py").write_text(f"open({str(marker)!r}, 'a').write({name!r} + '\\n')\n")


@pytest.mark.skipif(sys.version_info < (3, 11), reason="python -P exists from 3.11 (older ones start ranks without it)")
def test_ranks_import_nothing_from_the_working_directory(tmp_path):
    """A `uuid.py` where the user runs commbench does not run in the ranks; the sweep succeeds. The
    parent runs with -P here, as the `commbench` script does, so that only the ranks are tested."""
    work, marker = tmp_path / "work", tmp_path / "ran"
    work.mkdir()
    plant_modules(work, marker)
    proc = subprocess.run([sys.executable, "-P", "-m", "commbench", "sweep", "--nprocs", "2", "--sizes", "1K",
                           "--iters", "2", "--warmup", "1", "--timeout", "60", "--json", str(tmp_path / "r.jsonl")],
                          cwd=work, capture_output=True, text=True, timeout=180, env=clean_env())
    assert not marker.exists(), marker.read_text()
    assert proc.returncode == 0, proc.stderr


@pytest.mark.skipif(not os.path.exists("/proc/net/tcp"), reason="reads Linux's /proc/net")
def test_local_spawn_listens_on_loopback_only(tmp_path):
    """Every socket the two ranks listen on, sampled through the run, is on 127.0.0.1, the store's
    included, even with GLOO_SOCKET_IFNAME naming another interface; from this host's outward
    address the store cannot be reached."""
    outward = _outward_address()
    other = _other_interface()
    env = clean_env(**({"GLOO_SOCKET_IFNAME": other} if other else {}))
    proc = subprocess.Popen([sys.executable, "-m", "commbench", "sweep", "--nprocs", "2", "--sizes", "1K-4M",
                             "--iters", "20", "--warmup", "1", "--json", str(tmp_path / "r.jsonl")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    seen, ports, reached = {}, set(), []
    deadline = time.monotonic() + 120
    while proc.poll() is None and time.monotonic() < deadline:
        table = _listening()
        for pid in _children(proc.pid):
            ports.add(_master_port(pid))
            seen.update({(pid, inode): table[inode] for inode in _sockets_of(pid) if inode in table})
        store = [port for _, port in seen.values() if port in ports]
        if store and outward and not reached:
            with socket.socket() as attempt:
                attempt.settimeout(2)
                reached.append(attempt.connect_ex((outward, store[0])) == 0)
        time.sleep(0.02)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert {pid for pid, _ in seen} and len({pid for pid, _ in seen}) == 2, seen  # both ranks listened
    assert any(port in ports for _, port in seen.values()), (seen, ports)  # rank 0's store was seen
    assert all(_is_loopback(address) for address, _ in seen.values()), seen
    assert not any(reached)


# ---------------------------------------------------------------- a profile's source.spec


MODULE = '''import os
open(os.path.join({folder!r}, "imported." + str(os.getpid())), "w").close()
INPUT = {{"shape": [8], "unit": "samples", "default_batch": 2}}


def build():
    import torch

    return torch.nn.Linear(8, 2)


def example_inputs(batch, device="cpu"):
    import torch

    return (torch.randn(batch, 8, device=device),)
'''


@pytest.fixture
def code_profile(tmp_path):
    """A profile whose source.spec names a module that leaves a file behind when imported."""
    (tmp_path / "sideeffect_model.py").write_text(MODULE.format(folder=str(tmp_path)))
    data = load_profile("tts_angular").to_dict()
    data["name"], data["source"] = "sideeffect", {"spec": "sideeffect_model:build", "package": "sideeffect_model"}
    path = tmp_path / "code.json"
    path.write_text(json.dumps(data))
    return path


def _imports(folder) -> int:
    return len([name for name in os.listdir(folder) if name.startswith("imported.")])


def test_a_profile_with_a_source_spec_imports_nothing(code_profile):
    folder = code_profile.parent
    env = clean_env(PYTHONPATH=str(folder))
    for args in (["train", str(code_profile), "--nprocs", "2"], ["proxy", str(code_profile), "--nprocs", "2"],
                 ["proxy", str(code_profile), "--compute", "measured", "--nodes", "2", "--hw", "dgx-a100"]):
        proc = commbench(*args, env=env, timeout=60)
        assert proc.returncode == 2, proc.stderr
        assert "source.spec 'sideeffect_model:build'" in proc.stderr and "--trust-profile-code" in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    for args in (["profiles", "show", str(code_profile)],
                 ["predict-scaling", str(code_profile), "--hw", "dgx-a100", "--gpus", "1,8", "--tflops", "100"]):
        proc = commbench(*args, env=env, timeout=60)
        assert proc.returncode == 0, proc.stderr
    assert _imports(folder) == 0
    with pytest.raises(ModelError, match="--trust-profile-code"):
        model_for(load_profile(str(code_profile)))
    assert _imports(folder) == 0


def test_trust_profile_code_builds_it_in_every_rank(code_profile):
    folder = code_profile.parent
    proc = commbench("train", str(code_profile), "--trust-profile-code", "--nprocs", "2", "--batch", "2", "--steps",
                     "1", "--warmup-steps", "0", env=clean_env(PYTHONPATH=str(folder)), timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert _imports(folder) == 2


@pytest.mark.parametrize("spec,foreign", [
    ("torchvision:resnet50", False), ("timm:convnext_tiny.fb_in22k", False),
    ("transformers:BertForMaskedLM:hidden_size=1024,num_hidden_layers=24", False),
    ("commbench.proxies.models.unet:build_bilinear", False), ("commbench.proxies.models.tts_angular:build", False),
    ("os:getcwd", True), ("this:__doc__", True), ("commbench.proxies.models.unet:UNet", True),
    ("timm:hf-hub:someone/model", True), ("timm:local-dir:/tmp/x", True), ("torchvision:../x", True),
    ("transformers:BertModel:attn_implementation=kernels-community/x", True), ("nocolon", True),
])
def test_which_specs_run_foreign_code(spec, foreign):
    assert runs_foreign_code(spec) is foreign


def test_no_eval_exec_pickle_or_shell_in_the_sources():
    """What reads user input never evaluates it: no eval/exec, no pickle.load, no shell=True."""
    banned = ("eval(", "exec(", "pickle.load", "shell=True", "yaml.load(")
    hits = []
    for root in SOURCES:
        for folder, _, files in os.walk(root):
            for name in (f for f in files if f.endswith(".py")):
                with open(os.path.join(folder, name), encoding="utf-8") as handle:
                    for number, line in enumerate(handle, 1):
                        code = line.split("#", 1)[0]
                        if any(word in code and f".{word}" not in code for word in banned):
                            hits.append(f"{name}:{number}: {line.strip()}")
    assert not hits, hits
