"""Numbers on the command line that cannot be honoured end in one line and exit 2 before any
rank starts: non-finite values, values past what the libraries take, more local ranks than
the host carries, buffers larger than its memory, work that grows past reach."""
from __future__ import annotations

import pytest

from commbench import cli, job
from commbench.commands import options as O


@pytest.fixture(autouse=True)
def no_ranks(monkeypatch):
    """A case that passed validation would start ranks: fail loudly instead."""
    monkeypatch.setattr(job, "run", lambda *args, **kwargs: pytest.fail("validation let the run start"))


@pytest.mark.parametrize("args,needle", [
    (["sweep", "--sizes", "1K", "--timeout", "inf"], "--timeout inf: must be a finite number"),
    (["sweep", "--sizes", "1K", "--timeout", "1e30"], "--timeout 1e+30: must be at most 604800"),
    (["sweep", "--sizes", "1K", "--timeout", "1e-9"], "--timeout 1e-09: must be at least 1"),
    (["sweep", "--sizes", "1K", "--min-time", "inf"], "--min-time inf: must be a finite number"),
    (["sweep", "--sizes", "1K", "--min-time", "nan"], "--min-time nan: must be a finite number"),
    (["sweep", "--sizes", "99999999999999999999999"], "at most 4 TiB per rank"),
    (["sweep", "--sizes", "9" * 400], "at most 4 TiB per rank"),
    (["sweep", "--sizes", ""], "empty --sizes"),
    (["sweep", "--sizes", "1K", "--step", "1K"], "not to a single size"),
    (["sweep", "--backend", "sim", "-N", "100000", "--sizes", "1K"], "at most 1024"),
    (["sweep", "--nprocs", "1000", "--sizes", "1K"], "add --oversubscribe"),
    (["sweep", "--sizes", "1T"], "this host has"),
    (["proxy", "resnet18", "--timeout", "inf"], "--timeout inf: must be a finite number"),
    (["proxy", "resnet18", "--tflops", "nan"], "--tflops nan: must be a finite number"),
    (["proxy", "resnet18", "--nprocs", "1000", "--tflops", "1"], "add --oversubscribe"),
    (["proxy", "resnet18", "--backend", "shm", "--algorithm", "warp", "--tflops", "1"], "no algorithm 'warp'"),
    (["proxy", "resnet18", "--backend", "sim", "--hw", "dgx-a100", "--tflops", "100", "--nodes", "2",
      "--algorithm", "1e309"], "no algorithm '1e309'"),
    (["proxy", "resnet18", "--backend", "sim", "--hw", "dgx-a100", "--tflops", "100", "--nodes", "300",
      "--algorithm", "rhd"], "at most 256 GPUs"),
    (["train", "resnet18", "--nprocs", "100"], "add --oversubscribe"),
    (["predict", "--hw", "dgx-a100", "--topology", "100000x100000", "--sizes", "1K"], "at most 1,024 ranks"),
])
def test_out_of_reach_numbers_are_one_line_exit_2(capsys, args, needle):
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and needle in err, err


def test_oversubscribe_lets_the_ranks_start(monkeypatch):
    started = []
    monkeypatch.setattr(job, "run", lambda name, cfg, plan, argv: started.append(plan.world) or 0)
    assert cli.main(["sweep", "--nprocs", "9", "--sizes", "1K", "--oversubscribe"]) == 0
    assert started == [9]


def test_a_range_names_its_bound():
    with pytest.raises(Exception, match=r"--x 0: must be positive"):
        O.POSITIVE.check("--x", 0)
    with pytest.raises(Exception, match=r"--x 11: must be at most 10"):
        O.Range(1, 10).check("--x", 11)
    O.Range(1, 10).check("--x", 10)  # the bound itself is allowed


def test_a_predicted_proxy_lays_ranks_on_the_hardwares_nodes(capsys):
    """32 GPUs of dgx-a100 are 4 nodes of 8, said in a note, not one 32-GPU node in silence."""
    assert cli.main(["proxy", "resnet18", "--backend", "sim", "-N", "32", "--hw", "dgx-a100", "--tflops", "100"]) == 0
    out = capsys.readouterr().out
    assert "predicting 4 x 8 ranks" in out and "on 4x8 (32 ranks)" in out
    assert cli.main(["proxy", "resnet18", "--backend", "sim", "-N", "12", "--hw", "dgx-a100", "--tflops", "1"]) == 2
