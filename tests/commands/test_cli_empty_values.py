"""One rule for empty and degenerate values across commands (issue 32, item 8): an empty value, an empty
item of a comma list, a flag that has nothing to act on, or a rank out of range is one line and exit 2,
before anything runs; none is taken as "not given" with the default run in its place."""
from __future__ import annotations

import pytest

from commbench import cli, job


@pytest.fixture(autouse=True)
def no_ranks(monkeypatch):
    monkeypatch.setattr(job, "run", lambda *args, **kwargs: pytest.fail("validation let the run start"))


@pytest.mark.parametrize("args,message", [
    # `sweep --hw ''` ran and ignored it while `predict --hw ''` was refused; `--gpus ''` ran the defaults
    (["sweep", "--backend", "sim", "--hw", "", "--sizes", "1K"], "--hw '': an empty value"),
    (["predict", "--hw", "", "-T", "1x2"], "--hw '': an empty value"),
    (["predict-scaling", "resnet50", "--hw", "dgx-a100", "--gpus", ""], "--gpus '': an empty value"),
    (["predict-scaling", "resnet50", "--hw", "dgx-a100", "--gpus", "  "], "--gpus '': an empty value"),
    (["proxy", "resnet18", "--backend", "sim", "--hw", "", "--tflops", "1"], "--hw '': an empty value"),
    (["sweep", "--sizes", "1K", "-c", "allreduce", "-c", ""], "--collective '': an empty value"),
    (["profiles", "show", ""], "argument MODEL '': an empty value"),
    (["nccl-tests", "all_reduce_perf", "-b", ""], "-b '': an empty value"),
    # an empty item of a comma list
    (["sweep", "--backend", "sim", "--sizes", "1K,"], "bad --sizes '1K,': an empty item in the comma list"),
    (["sweep", "--backend", "sim", "--sizes", "1K,,2K"], "bad --sizes '1K,,2K': an empty item in the comma list"),
    (["predict", "--hw", "dgx-a100", "-T", "1x2", "--sizes", ",1K"], "an empty item in the comma list"),
    (["predict-scaling", "resnet50", "--hw", "dgx-a100", "--gpus", "8,,16"],
     "bad --gpus '8,,16': an empty item in the comma list"),
    # a flag with nothing to act on
    (["sweep", "--backend", "sim", "--sizes", "1K", "--append"],
     "--append adds to an output file, and none is given: add --json or --csv FILE"),
    (["predict", "--hw", "dgx-a100", "-T", "1x2", "--append"],
     "--append adds to an output file, and none is given: add --json FILE"),
    # out of range, whichever collective runs
    (["sweep", "--backend", "sim", "--sizes", "1K", "--root", "99999999999999999999"],
     "--root 99999999999999999999: must be a rank in 0..1"),
    (["sweep", "--backend", "sim", "--sizes", "1K", "--root", "-1"], "--root -1: must be a rank in 0..1"),
    # a number that is not finite, on every float option (issue 48: tune --timeout nan was a ValueError)
    (["tune", "-b", "sim", "--hw", "dgx-h100", "-T", "1x2", "-s", "1K", "-o", "t.json", "--timeout", "nan"],
     "--timeout nan: must be a finite number"),
    (["check", "r.jsonl", "--hw", "dgx-a100", "--max-error", "inf"], "--max-error inf: must be a finite number"),
])
def test_an_empty_or_out_of_range_value_is_one_line_exit_2(capsys, args, message):
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err


def test_every_string_option_of_every_command_refuses_empty():
    """The rule is on every parameter, so a command added later has it too."""
    import click

    def commands(group):
        for command in group.commands.values():
            yield from commands(command) if isinstance(command, click.Group) else [command]

    for command in commands(cli.cli):
        for param in command.params:
            assert param.callback is not None and param.callback.__qualname__.startswith("_refusing_empty"), \
                (command.name, param.name)
