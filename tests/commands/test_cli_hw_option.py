"""--hw is one option everywhere: built by commands/helpers/hw_option.py, refused in one line the same way, and a
poor fit said wherever it is read (replay --hw said nothing)."""
import json

import click
import pytest
from conftest import REPO, commbench

from commbench import cli
from commbench.commands.helpers.hw_option import HardwareOption


def test_every_commands_hw_is_the_one_option():
    seen = []

    def walk(command, path):
        if isinstance(command, click.Group):
            for name, sub in command.commands.items():
                walk(sub, f"{path} {name}")
            return
        for param in command.params:
            if "--hw" in getattr(param, "opts", ()):
                seen.append(path)
                assert isinstance(param, HardwareOption), f"{path}: --hw is not commands/helpers/hw_option.hw_option"

    walk(cli.cli, "commbench")
    assert len(seen) >= 9, seen


@pytest.mark.parametrize("argv", [["predict-scaling", "resnet50", "--gpus", "8"], ["check", "x.jsonl"],
                                  ["predict", "-s", "1K"], ["replay", "x.json"],
                                  ["sweep", "--backend", "sim", "-N", "2", "--sizes", "1K"]])
def test_a_bad_hardware_file_is_the_same_one_line_everywhere(capsys, tmp_path, argv):
    bad = tmp_path / "hw.json"
    bad.write_text('{"levels": 3}')
    code = cli.main([*argv, "--hw", str(bad)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "levels must be a JSON object" in err, err


def test_a_poor_fit_is_said_by_replay_too(tmp_path):
    from commbench.costmodel import load_hardware

    data = load_hardware("dgx-h100").to_dict()
    data["meta"]["poor_fit"] = "median error 87% > 25%"
    hw = tmp_path / "poor.json"
    hw.write_text(json.dumps(data))
    traces = [str(REPO / "tests" / "data" / "traces" / f"ddp_2rank_gloo_rank{r}.json.gz") for r in (0, 1)]
    run = commbench("replay", *traces, "--hw", str(hw), "-T", "2x1")
    assert "is a poor fit" in run.stderr, (run.returncode, run.stderr)
