"""The torch commbench needs (cli.TORCH_FLOOR, setup.py's floor): an older torch is one line and exit 2 before
anything runs, rather than a rendezvous that fails or tracebacks in the ranks (README, "Which torch")."""
import re

import pytest
from conftest import REPO

from commbench import cli


@pytest.mark.parametrize("version, refused", [
    ("2.1.2+cu121", True), ("2.6.0+cu124", True), ("2.10.1", True), ("2.11.0+cu130", False),
    ("2.14.1+cu130", False), ("3.0.0", False), ("2.15.0a0+gitabc", False), ("custom-build", False), (None, True),
])
def test_a_torch_older_than_the_floor_is_named(version, refused):
    said = cli.torch_below_floor(version)
    assert bool(said) is refused
    if said:
        assert "commbench needs torch >= 2.11" in said and (version or "no torch") in said and "\n" not in said


def test_every_command_but_help_stops_at_an_old_torch(monkeypatch, capsys):
    monkeypatch.setattr(cli, "torch_version", lambda: "2.6.0+cu124")
    assert cli.main(["predict", "--hw", "dgx-h100", "-s", "1K"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("commbench: error: commbench needs torch >= 2.11, and this is torch 2.6")
    assert cli.main(["predict", "--help"]) == 0 and "Usage" in capsys.readouterr().out
    assert cli.main(["--version"]) == 0


def test_setup_py_asks_for_the_same_floor():
    text = (REPO / "setup.py").read_text(encoding="utf-8")
    (floor,) = re.findall(r'"torch>=([\d.]+)"', text)
    assert tuple(map(int, floor.split("."))) == cli.TORCH_FLOOR
