"""`proxy MODEL --layout SPEC`: a parallel layout replayed on 4 spawned gloo ranks end to end (the header and
every record carry the layout), and layouts or options that cannot run: one line, exit 2."""
from __future__ import annotations

import pytest
from conftest import commbench

from commbench import cli
from commbench.results import read_records


def test_a_layout_replays_end_to_end_with_records(tmp_path):
    out = tmp_path / "p.jsonl"
    run = commbench("proxy", "llama-tiny", "--layout", "tp2,dp2", "-N", "4", "--tflops", "0.01", "--steps", "2",
                    "--warmup-steps", "1", "--json", str(out), timeout=240)
    assert run.returncode == 0, run.stderr
    records = read_records(str(out))
    header, steps, summary = records[0], [r for r in records if r["record"] == "step"], records[-1]
    assert header["layout"]["layout"] == "tp2,ddp2" and header["layout"]["tp"] == 2
    assert len(steps) == 3 and all(s["layout"] == "tp2,ddp2" for s in steps)
    assert all(s["step_us"] >= s["compute_us"] > 0 for s in steps)
    assert set(steps[-1]["exposed_by_dim_us"]) == {"tp", "dp"}
    assert summary["record"] == "proxy" and summary["status"] == "ok" and summary["layout"]["dp"] == 2
    # samples: a micro-batch of one sequence on each of the 2 data-parallel ranks (not 4 ranks)
    assert summary["samples_per_s"] == pytest.approx(2 / (summary["step_us_p50"] * 1e-6))
    assert "layout tp2,ddp2 on 4 ranks" in run.stdout


@pytest.mark.parametrize("extra, message", [
    (["--layout", "tp3,dp2", "--tflops", "1"], "tp3,ddp2: tp x pp x cp x dp = 3 x 1 x 1 x 2 = 6 GPUs, not 4"),
    (["--layout", "ep2,dp4", "--tflops", "1"], "ep 2 on a model without experts"),
    (["--layout", "pp4,dp1", "--tflops", "1", "--pp-schedule", "interleaved", "--virtual-stages", "2"],
     "8 pipeline stages for the model's 4 layers"),
    (["--layout", "pp2,dp2", "--tflops", "1", "--pp-schedule", "interleaved"],  # was replayed as 1F1B
     "--pp-schedule interleaved needs --virtual-stages 2 or more (1 is 1F1B)"),
    (["--layout", "tp2,dp2", "--tflops", "1", "--batch", "4"], "give --microbatch"),
    (["--layout", "tp2,dp2", "--tflops", "1", "--microbatches", "0"], "--microbatches 0: must be at least 1"),
    # issue 48: 10^30 sequences a micro-batch were accepted here and failed on the ranks in tracebacks
    (["--layout", "tp2,dp2", "--tflops", "1", "--microbatch", str(10**30)], f"--microbatch {10**30}: must be at most "
                                                                            "65,536"),
    (["--layout", "pp2,dp2", "--tflops", "1", "--microbatches", "10000000"], "--microbatches 10000000: must be at "
                                                                              "most 4,096"),
    (["--layout", "tp2,dp2", "--tflops", "1", "--backend", "shm"], "--layout replays on --backend torch"),
    (["--layout", "tp2,bogus", "--tflops", "1"], "layout part 'bogus'"),
    (["--layout", "tp2,bogus:2", "--tflops", "1"], "unknown setup 'bogus'"),
    (["--layout", "hsdp2x2", "--tflops", "1"], "a sized HSDP shard group is predict-scaling's"),
])
def test_a_layout_that_cannot_run_is_one_line_and_exit_2(capsys, extra, message):
    """In process (cli.main, as `python -m commbench` runs it); the last test runs the real command's refusal."""
    code = cli.main(["proxy", "llama-tiny", "-N", "4", *extra])
    out, err = capsys.readouterr()
    assert code == 2, out + err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in err


def test_a_model_without_a_transformer_shape_is_refused():
    run = commbench("proxy", "resnet50", "-N", "4", "--layout", "tp2,dp2", "--tflops", "1", timeout=120)
    assert run.returncode == 2 and "needs a transformer's shape" in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1 and "Traceback" not in run.stderr
