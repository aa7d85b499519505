"""`train MODEL --layout SPEC`: a parallel layout trained for real (proxies/layouts/train/run.py) on 4 spawned
gloo ranks, through the job frame and records of `train` and `proxy --layout` (the header and every record
carry the layout); layouts or options the trainer cannot run: one line, exit 2, before any rank starts."""
from __future__ import annotations

import pytest
from conftest import commbench

from commbench.results import read_records

MIXTRAL_TINY = ("transformers:MixtralForCausalLM:hidden_size=64,intermediate_size=176,num_hidden_layers=4,"
                "num_attention_heads=4,num_key_value_heads=2,vocab_size=1024,max_position_embeddings=64,"
                "tie_word_embeddings=false,num_local_experts=4,num_experts_per_tok=2")


@pytest.fixture(scope="module")
def moe(tmp_path_factory) -> str:
    """llama-tiny's shape with every MLP a mixture of 4 experts (top 2) of its FFN: a Mixtral profile extracted
    on the meta device, the kind of model --layout ep trains."""
    path = tmp_path_factory.mktemp("moe") / "mixtral-tiny.json"
    run = commbench("profiles", "extract", MIXTRAL_TINY, "--input-shape", "64", "--batch", "4", "--unit", "sequences",
                    "-o", str(path), timeout=120)
    assert run.returncode == 0, run.stderr
    return str(path)


def test_a_pipelined_layout_trains_end_to_end_with_records(tmp_path):
    out = tmp_path / "t.jsonl"
    run = commbench("train", "llama-tiny", "--layout", "pp2,fsdp2", "--microbatches", "2", "-N", "4", "--steps",
                    "2", "--warmup-steps", "1", "--json", str(out), timeout=240)
    assert run.returncode == 0, run.stderr
    records = read_records(str(out))
    header, steps, summary = records[0], [r for r in records if r["record"] == "step"], records[-1]
    assert header["kind"] == "train" and header["layout"]["layout"] == "pp2,fsdp2"
    assert header["layout"]["pp"] == 2 and header["layout"]["microbatches"] == 2
    assert len(steps) == 3 and all(s["layout"] == "pp2,fsdp2" and s["step_us"] > 0 for s in steps)
    assert all(s["compute_us"] is None for s in steps)  # real training: the step's time alone
    assert len(steps[-1]["ranks_us"]) == 4
    assert summary["status"] == "ok" and summary["kind"] == "train" and summary["layout"]["dp"] == 2
    # samples: 2 micro-batches of one sequence on each of the 2 data-parallel ranks
    assert summary["samples_per_s"] == pytest.approx(4 / (summary["step_us_p50"] * 1e-6))
    assert "real training of layout pp2,fsdp2 on 4 ranks" in run.stdout


@pytest.mark.parametrize("layout, extra, mixture, said", [
    # DDP beside TP, spelled dpN under the default --setup ddp (refused before: FSDP2 only)
    ("tp2,dp2", [], False, "layout tp2,ddp2 on 4 ranks"),
    # DDP under a pipeline, the interleaved schedule: each rank's two stages wrapped, reduced once a step
    ("pp2,ddp2", ["--pp-schedule", "interleaved", "--virtual-stages", "2", "--microbatches", "2"], False,
     "layout pp2,ddp2@interleaved:2 on 4 ranks"),  # the name spells its schedule
    # context and expert parallelism beside a pipeline (refused before): ring attention and the MoE's all-to-alls
    # inside each stage's passes, the experts over the two CP ranks, FSDP2 on them
    ("pp2,cp2,ep2,fsdp1", [], True, "layout pp2,cp2,ep2,fsdp1 on 4 ranks"),
])
def test_ddp_and_dimensions_beside_a_pipeline_train_end_to_end(request, tmp_path, layout, extra, mixture, said):
    out = tmp_path / "t.jsonl"
    model = request.getfixturevalue("moe") if mixture else "llama-tiny"
    run = commbench("train", model, "--layout", layout, *extra, "-N", "4", "--steps", "2", "--warmup-steps", "1",
                    "--json", str(out), timeout=240)
    assert run.returncode == 0, run.stderr
    assert "is deprecated" not in run.stderr  # torch's all_to_all_single warning, 8 times a MoE train (issue 48)
    records = read_records(str(out))
    steps, summary = [r for r in records if r["record"] == "step"], records[-1]
    name = said.split()[1]
    assert records[0]["layout"]["layout"] == name and summary["status"] == "ok"
    assert len(steps) == 3 and all(s["layout"] == name and s["step_us"] > 0 for s in steps)
    wrapper = "DDP" if "ddp" in name else "FSDP2"
    assert f"real training of {said}" in run.stdout and f"{wrapper} on dp x cp = 2 ranks" in run.stdout


def test_tp_beside_ep_prints_no_warning_about_the_moe_plan(moe):
    # the TP plan's gate/up/down keys on an expert-parallel MoE: parallelize_module skipped each with a UserWarning,
    # 12 of them before the table (issue 48, item 12); the MoE's experts are split over ep, not tp
    run = commbench("train", moe, "--layout", "tp2,ep2,fsdp2", "-N", "4", "--steps", "2", "--warmup-steps", "1",
                    timeout=240)
    assert run.returncode == 0, run.stderr
    assert "Warning" not in run.stderr and "Warning" not in run.stdout
    assert "real training of layout tp2,ep2,fsdp2 on 4 ranks" in run.stdout


@pytest.mark.parametrize("extra, message", [
    (["--layout", "tp2,zero1:2"], "keeps the data-parallel replicas with DDP or FSDP2: spell it ddp2 or fsdp2"),
    (["--layout", "tp3,fsdp2"], "tp3,fsdp2: tp x pp x cp x dp = 3 x 1 x 1 x 2 = 6 GPUs, not 4"),
    (["--layout", "ep2,fsdp4"], "ep 2 on a model without experts"),
    (["--layout", "tp2,fsdp2", "--microbatches", "2"], "runs micro-batches through a pipeline only"),
    (["--layout", "tp2,fsdp2", "--checkpointing", "full"], "keeps every activation"),
    (["--layout", "tp2,ddp2", "--bucket-mb", "5"], "runs DDP and FSDP2 with their defaults: drop --bucket-mb"),
    (["--layout", "ep2,ddp4", "MOE"], "shards the experts' replicas with FSDP2: beside ep spell the data-parallel "
                                      "part fsdp4"),
    (["--layout", "tp2sp,ep2,etp1,fsdp2", "MOE"], "etp1 is not trained"),
])
def test_a_layout_train_cannot_run_is_one_line_and_exit_2(request, extra, message):
    model = request.getfixturevalue("moe") if "MOE" in extra else "llama-tiny"
    run = commbench("train", model, "-N", "4", *[e for e in extra if e != "MOE"], timeout=120)
    assert run.returncode == 2, run.stdout + run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in run.stderr


def test_a_layout_train_on_a_gpu_host_with_device_auto_is_refused(monkeypatch, capsys):
    """--device auto resolves to cuda where a GPU is visible: the CPU-only trainer refuses it before ranks start."""
    from commbench.backends import torch_lazy
    from commbench.cli import main

    monkeypatch.setattr(torch_lazy, "cuda_available", lambda: True)
    assert main(["train", "llama-tiny", "-N", "4", "--layout", "tp2,fsdp2"]) == 2
    assert "trains on CPU ranks over gloo (give --device cpu" in capsys.readouterr().err
