"""`proxy MODEL --layout SPEC --compute measured`: the replay's compute timed on each rank's own pieces of the
model (proxies/layouts/compute.py), not FLOPs at one rate; what cannot be measured here is one line, exit 2."""
from __future__ import annotations

import pytest
from conftest import commbench

from commbench import cli
from commbench.results import read_records


def test_a_layout_replays_with_its_compute_measured_on_each_rank(tmp_path):
    """Before, --compute measured beside --layout was refused (exit 2): the replay knew FLOPs at a rate only."""
    out = tmp_path / "p.jsonl"
    run = commbench("proxy", "llama-tiny", "--layout", "tp2,dp2", "-N", "4", "--compute", "measured", "--steps", "1",
                    "--warmup-steps", "1", "--json", str(out), timeout=240)
    assert run.returncode == 0, run.stderr
    records = read_records(str(out))
    header, steps, summary = records[0], [r for r in records if r["record"] == "step"], records[-1]
    measured = header["layout_compute_us"]
    # one stage: the rank holds the embedding and the head; no CP: no ring block
    assert all(measured[k] > 0 for k in ("layer_forward_us", "layer_backward_us", "embed_forward_us",
                                         "head_forward_us", "head_backward_us", "optimizer_us"))
    assert measured["block_forward_us"] == 0
    # a step computes what was measured: 4 layers forward and backward, embedding, head, optimizer
    per_step = 4 * (measured["layer_forward_us"] + measured["layer_backward_us"]) + measured["optimizer_us"] + \
        sum(measured[f"{piece}_{phase}_us"] for piece in ("embed", "head") for phase in ("forward", "backward"))
    assert all(s["compute_us"] == pytest.approx(per_step) for s in steps)
    assert summary["status"] == "ok" and summary["compute"].startswith("measured")
    assert "compute emulated (measured" in run.stdout


@pytest.mark.parametrize("model, layout, message", [
    ("mixtral-8x7b", "ep8", "MoE layers are not measured"),
    ("deepseek-v3", "ep8", "MoE layers are not measured"),
    ("llama3.1-70b", "tp8", "TFLOP a step on each CPU rank"),
])
def test_what_cannot_be_measured_here_is_one_line_and_exit_2(capsys, model, layout, message):
    code = cli.main(["proxy", model, "-N", "8", "--layout", layout, "--compute", "measured", "--device", "cpu"])
    out, err = capsys.readouterr()
    assert code == 2, out + err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "--tflops" in lines[0]
