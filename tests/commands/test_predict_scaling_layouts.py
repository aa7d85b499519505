"""`predict-scaling MODEL --layout ...` as a user runs it: the ranking, its records, and layouts that cannot run
refused in one line."""
import json

import pytest
from conftest import REPO, commbench

from commbench import cli


def test_layouts_are_ranked_with_memory_beside(tmp_path):
    out = tmp_path / "layouts.jsonl"
    proc = commbench("predict-scaling", "llama3.1-8b", "--hw", "dgx-h100", "--gpus", "64", "--layout", "tp8,fsdp8",
                     "--layout", "tp4,pp2,fsdp8", "--layout", "tp2sp,dp32", "--tflops", "400", "--global-batch", "256",
                     "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    rows = [line.split() for line in proc.stdout.splitlines() if line.strip()[:1].isdigit()]
    assert sorted(r[1] for r in rows) == ["tp2sp,ddp32", "tp4,pp2,fsdp8", "tp8,fsdp8"]
    speeds = [float(r[3].replace(",", "")) for r in rows]
    fits = [r[10] for r in rows]
    assert speeds == sorted(speeds, reverse=True) or "NO" in fits
    records = [json.loads(line) for line in out.read_text().splitlines()]
    layouts = [r for r in records if r["record"] == "layout"]
    assert len(layouts) == 3 and all(r["memory_nbytes"]["total"] > 0 and r["gpus"] == 64 for r in layouts)
    first = next(r for r in layouts if r["layout"]["layout"] == "tp8,fsdp8")
    assert first["layout"]["microbatches"] == 32 and all(r["global_batch"] == 256 for r in layouts)
    top = next(r for r in layouts if r["acc_ratio"] == 1.0)  # vs #1: the top row, whichever was typed first
    assert top["baseline"] == top["layout"]["layout"] == rows[0][1] and top["tflops_source"] == "given"


def _ranked(capsys, *layouts, extra=()):
    """{layout name: (rank, step ms, GB a GPU)} of predict-scaling llama3.1-70b on 256 H100s, in process."""
    args = ["predict-scaling", "llama3.1-70b", "--hw", "dgx-h100", "--gpus", "256", "--tflops", "400", *extra]
    code = cli.main(args + [a for text in layouts for a in ("--layout", text)])
    out, err = capsys.readouterr()
    assert code == 0, err
    rows = [line.split() for line in out.splitlines() if line.strip()[:1].isdigit()]
    return {r[1]: (int(r[0]), float(r[2]), float(r[9])) for r in rows}


def test_a_candidate_added_leaves_the_others_as_they_were(capsys):
    """The default global batch depends on the GPUs, not on the layouts listed (issue 48: adding fsdp256 made
    it 8x larger and reordered the other three)."""
    three = ("tp8,fsdp32", "tp4sp,pp2,fsdp32", "tp8sp,cp2,fsdp16")
    before = _ranked(capsys, *three)
    after = _ranked(capsys, *three, "fsdp256")
    assert {name: after[name][1:] for name in three} == {name: before[name][1:] for name in three}
    order = sorted(three, key=lambda name: before[name][0])
    assert sorted(three, key=lambda name: after[name][0]) == order


def test_hsdp_sizes_its_shard_group(capsys):
    """issue 48: `tp8,hsdp128` could not say its shard group and held what ddp holds; hsdpRxS shards over S."""
    ranked = _ranked(capsys, "tp8,ddp32", "tp8,hsdp32", "tp8,hsdp4x8", "tp8,fsdp32")
    memory = {name: gb for name, (_, _, gb) in ranked.items()}
    assert memory["tp8,fsdp32"] < memory["tp8,hsdp4x8"] < memory["tp8,hsdp32"] <= memory["tp8,ddp32"] + 1


def test_a_schedule_applies_to_pipelines_only_and_a_layout_may_carry_its_own(capsys):
    """--pp-schedule gpipe leaves a layout without a pipeline as it was (it made tp8,fsdp32's memory 8x); a
    layout's own @schedule lets 1F1B and interleaved share one table."""
    plain = _ranked(capsys, "tp8,fsdp32", "tp8,pp2,fsdp16")
    gpipe = _ranked(capsys, "tp8,fsdp32", "tp8,pp2,fsdp16", extra=("--pp-schedule", "gpipe"))
    assert gpipe["tp8,fsdp32"][1:] == plain["tp8,fsdp32"][1:]
    assert gpipe["tp8,pp2,fsdp16@gpipe"][2] > plain["tp8,pp2,fsdp16"][2]  # GPipe holds every micro-batch
    both = _ranked(capsys, "tp8,pp4,fsdp8", "tp8,pp4,fsdp8@interleaved:2", "tp8,pp4,fsdp8")
    assert sorted(both) == ["tp8,pp4,fsdp8", "tp8,pp4,fsdp8@interleaved:2"]  # the one given twice ranked once
    assert both["tp8,pp4,fsdp8@interleaved:2"][1] < both["tp8,pp4,fsdp8"][1]  # a smaller bubble


def test_a_peak_rate_is_said_to_be_one(capsys, tmp_path):
    """Without --tflops the device's peak is used, and said to be one: on stderr, in the header, in the record."""
    out = tmp_path / "l.jsonl"
    code = cli.main(["predict-scaling", "llama3.1-8b", "--hw", "dgx-h100", "--gpus", "8", "--layout", "tp8,dp1",
                     "--json", str(out)])
    stdout, err = capsys.readouterr()
    assert code == 0, err
    assert "no --tflops" in err and "fp32 peak" in err and "peak: optimistic" in stdout
    assert json.loads(out.read_text().splitlines()[-1])["tflops_source"] == "peak:fp32"


@pytest.mark.parametrize("args,message", [
    (["resnet50", "--gpus", "8", "--layout", "tp2,dp4"], "has none"),
    (["llama3.1-8b", "--gpus", "64", "--layout", "tp8,dp4"], "= 32 GPUs, not 64"),
    (["llama3.1-8b", "--gpus", "24", "--layout", "tp3,dp8"], "tp 3 neither divides"),
    (["llama3.1-8b", "--gpus", "40", "--layout", "pp5,dp8"], "pp = 5 does not divide the model's 32 layers"),
    (["llama3.1-8b", "--gpus", "8", "--layout", "ep2,dp8"], "on a model without experts"),
    (["llama3.1-8b", "--gpus", "32", "--layout", "tp16,dp2"], "tp groups cross nodes of 8"),
    (["llama3.1-8b", "--gpus", "8,16", "--layout", "tp8,dp1"], "one --gpus"),
    (["llama3.1-8b", "--gpus", "16", "--layout", "tq2"], "spell a layout like"),
    (["llama3.1-8b", "--gpus", "16", "--layout", "tp2,dp8", "--global-batch", "12"], "not a whole number"),
    (["llama3.1-8b", "--gpus", "16", "--layout", "tp2,dp8", "--global-batch", "0"], "--global-batch 0"),
    (["llama3.1-8b", "--gpus", "16", "--layout", "tp2,dp8", "--seq-len", "0"], "--seq-len 0"),
    (["llama3.1-8b", "--gpus", "16", "--layout", "tp8,bogus:2"], "unknown setup 'bogus'"),
    (["llama3.1-8b", "--gpus", "16", "--layout", "tp8,dp2", "-A", "bogus"], "unknown allreduce algorithm"),
    (["llama3.1-8b", "--gpus", "16", "--layout", "tp8,dp2", "--batch", "4"], "--batch: data-parallel"),
    (["llama3.1-8b", "--gpus", "16", "--layout", "tp8,dp2", "--accumulate", "4"], "--accumulate: data-parallel"),
    (["llama3.1-8b", "--gpus", "16", "--layout", "pp2,dp8", "--pp-schedule", "interleaved"], "--virtual-stages 2"),
    (["llama3.1-8b", "--gpus", "80", "--layout", "pp40,dp2"], "40 pipeline stages for the model's 32 layers"),
    (["mixtral-8x7b", "--gpus", "16", "--layout", "tp2,ep16,fsdp8"], "ep 16 must divide dp x cp = 8"),
    (["llama3.1-70b", "--gpus", "1024", "--layout", "ep8,fsdp128"], "ep 8 on a model without experts"),
    (["mixtral-8x7b", "--gpus", "64", "--layout", "ep8,fsdp8"], "ep is carved out of dp x cp"),
    (["llama3.1-8b", "--gpus", "16", "--layout", "tp8,dp2@gpipe"], "a layout without a pipeline"),
    (["llama3.1-8b", "--gpus", "16", "--layout", "pp2,dp8@interleaved"], "@interleaved:V"),
    (["llama3.1-8b", "--gpus", "16", "--layout", "auto", "--pp-schedule", "gpipe"], "searches 1F1B and interleaved"),
    (["llama3.1-8b", "--gpus", "16", "--layout", "tp8,dp2", "--top", "1"], "options of --layout auto"),
    (["llama3.1-8b", "--gpus", "16", "--layout", "auto", "--max-tp", "16"], "--max-tp 16: at most 8"),
])
def test_layouts_that_cannot_run_are_one_line(capsys, args, message):
    """In process (cli.main, as `python -m commbench` runs it): a process each only restarted Python."""
    code = cli.main(["predict-scaling", *args, "--hw", "dgx-h100", "--tflops", "400"])
    out, err = capsys.readouterr()
    assert code == 2, out
    assert message in err and err.count("\n") == 1, err


def test_experts_without_tensor_parallelism_and_a_hardware_without_a_peak(tmp_path):
    """etp1 lays EP over the TP ranks too (memory counted so, no crash); a hardware file without device_tflops
    prints no MFU rather than the given rate over itself."""
    import json as _json

    hw = _json.loads((REPO / "commbench" / "presets" / "dgx-h100.json").read_text())
    hw.pop("device_tflops")
    path = tmp_path / "hw.json"
    path.write_text(_json.dumps(hw))
    proc = commbench("predict-scaling", "mixtral-8x7b", "--hw", str(path), "--gpus", "16", "--tflops", "400",
                     "--layout", "tp2sp,ep8,etp1,ddp8", "--layout", "tp2,ep8,ddp8", "--json", str(tmp_path / "l.jsonl"))
    assert proc.returncode == 0, proc.stderr
    records = [_json.loads(line) for line in (tmp_path / "l.jsonl").read_text().splitlines()]
    assert {r["layout"]["layout"] for r in records} == {"tp2sp,ep8,etp1,ddp8", "tp2,ep8,ddp8"}
    assert all(r["mfu"] is None for r in records)
    etp1 = next(r for r in records if r["layout"]["expert_tp"] == 1)
    other = next(r for r in records if r["layout"]["expert_tp"] is None)
    # unsharded (DDP): experts over ep 8 alone under etp1, over ep 8 x tp 2 otherwise
    assert etp1["memory_nbytes"]["parameters"] > other["memory_nbytes"]["parameters"]


@pytest.mark.parametrize("extra,message", [
    (["--tflops", "nan"], "finite"), (["--tflops", "inf"], "finite"), (["--tflops", "-1"], "at least"),
    (["--tflops", "1e-300"], "at least 1e-09"), (["--seq-len", "1" + "0" * 30], "--seq-len 1e+30: at most"),
    (["--microbatch", "1" + "0" * 30], "--microbatch 1e+30: at most"),
    (["--global-batch", "1" + "0" * 30], "--global-batch 1e+30: at most"),
    (["--virtual-stages", "100000"], "--virtual-stages 100000: at most"),
])
def test_numbers_out_of_range_are_one_line_not_a_traceback_or_a_hang(capsys, extra, message):
    """issue 48 item 18: a ZeroDivisionError, a ValueError traceback, a run past minutes."""
    code = cli.main(["predict-scaling", "llama3.1-8b", "--gpus", "8", "--layout", "tp8,dp1", "--hw", "dgx-h100",
                     *extra])
    out, err = capsys.readouterr()
    assert code == 2 and message in err and err.count("\n") == 1, err


def test_a_billion_micro_steps_is_one_line(capsys):
    code = cli.main(["predict-scaling", "resnet50", "--gpus", "8", "--accumulate", "1000000000", "--hw", "dgx-h100",
                     "--tflops", "100"])
    assert code == 2 and "at most 4096" in capsys.readouterr().err


def test_layout_auto_searches_ranks_and_writes_every_one_that_fits(capsys, tmp_path):
    out = tmp_path / "auto.jsonl"
    code = cli.main(["predict-scaling", "llama3.1-8b", "--gpus", "16", "--hw", "dgx-h100", "--tflops", "400",
                     "--layout", "auto", "--top", "3", "--json", str(out)])
    stdout, err = capsys.readouterr()
    assert code == 0, err
    rows = [line.split() for line in stdout.splitlines() if line.strip()[:1].isdigit()]
    assert [r[0] for r in rows] == ["1", "2", "3"]
    searched = next(line for line in stdout.splitlines() if line.startswith("# searched"))
    fit = int(searched.split(": ")[1].split(" fit")[0].replace(",", ""))
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == fit >= 3 and all(r["fits"] for r in records)
    assert cli.main(["predict-scaling", "llama3.1-8b", "--gpus", "16", "--hw", "dgx-h100", "--tflops", "400",
                     "--layout", "auto", "--layout", "tp8,dp2"]) == 2
    assert "give it alone" in capsys.readouterr().err
