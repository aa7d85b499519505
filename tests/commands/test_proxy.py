"""`commbench proxy`, `train` and `profiles` as users run them: 2-rank real runs, the sim
prediction, bad input (one line, exit 2, nothing written) and a dead rank (exit 3, steps kept)."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import clean_env, commbench, rank_pid, torch_import_vm_bytes

from commbench import cli
from commbench.results import read_records

FAST = ["--batch", "1", "--steps", "2", "--warmup-steps", "1"]


def records(path, kind):
    return [r for r in read_records(str(path)) if r["record"] == kind]


def test_proxy_two_ranks_replays_and_writes_steps(tmp_path):
    out = tmp_path / "p.jsonl"
    proc = commbench("proxy", "resnet18", "--nprocs", "2", *FAST, "--tflops", "0.05", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "3 bucket(s)" in proc.stdout and "# median" in proc.stdout
    steps, (summary,) = records(out, "step"), records(out, "proxy")
    assert [s["step"] for s in steps] == [1, 2, 3] and [s["warmup"] for s in steps] == [True, False, False]
    assert summary["kind"] == "proxy" and summary["world_size"] == 2 and summary["buckets"] == 3
    # 3.63 + 7.02 GFLOP per sample at 0.05 TFLOP/s: the emulated compute is exactly that
    assert summary["compute_us_p50"] == pytest.approx((3.628 + 7.020) * 1e9 / 0.05e12 * 1e6, rel=1e-3)
    assert summary["comm_us_p50"] > 0 and summary["step_us_p50"] >= summary["compute_us_p50"]
    assert summary["exposed_comm_us_p50"] <= summary["comm_us_p50"] and summary["other_us_p50"] >= 0
    for step in steps:  # each step: compute + exposed + other
        assert step["compute_us"] + step["exposed_comm_us"] + step["other_us"] == pytest.approx(step["step_us"])


def test_proxy_on_shared_memory_with_no_bucketing(tmp_path):
    out = tmp_path / "p.jsonl"
    proc = commbench("proxy", "resnet18", "--backend", "shm", "--no-bucketing", "--compute", "none", *FAST,
                     "--monitor", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    (summary,) = records(out, "proxy")
    assert summary["backend"] == "shm" and summary["buckets"] == 62 and summary["compute_us_p50"] == 0
    assert "# telemetry:" in proc.stdout  # --monitor: the run's summary line, and per step
    assert all(step["telemetry"]["mem_used_mib"] > 0 for step in records(out, "step"))


def test_validate_runs_both_and_reports_the_error(tmp_path):
    out = tmp_path / "v.jsonl"
    proc = commbench("proxy", "tts_angular", "--nprocs", "2", *FAST, "--validate", "--json", str(out), timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "proxy error" in proc.stdout
    (check,) = records(out, "validate")
    proxy, (train,) = records(out, "proxy")[0], records(str(out).replace(".jsonl", ".train.jsonl"), "proxy")
    assert check["error"] == pytest.approx((proxy["step_us_p50"] - train["step_us_p50"]) / train["step_us_p50"])
    assert proxy["compute"].startswith("measured") and proxy["kind"] == "proxy"
    # the training run: real DDP, same model, batch, ranks and buckets, its own steps and summary
    assert train["kind"] == "train" and train["compute"] == "real" and train["steps"] == 2
    assert (train["model"], train["batch"], train["world_size"], train["buckets"]) == \
        (proxy["model"], proxy["batch"], proxy["world_size"], proxy["buckets"])
    assert train["step_us_p50"] > 0 and train["samples_per_s"] > 0
    # the replay measured DDP's own work at 1 rank and its communication's CPU, and ran the work in its steps
    (header,) = records(out, "header")
    split = header["compute_split_us"]
    assert split["ddp"] >= 0 and proxy["comm_cpu_gbps"] > 0
    assert proxy["compute_us_p50"] == pytest.approx(sum(split[k] for k in ("forward", "backward", "optimizer", "ddp")))
    # and `commbench check` predicts both runs from the replay's split, the training row named as such
    out_check = commbench("check", str(out), str(out).replace(".jsonl", ".train.jsonl"), "--hw", "dgx-a100")
    assert out_check.returncode == 0, out_check.stderr
    assert "step (training)" in out_check.stdout and "training steps" in out_check.stdout


def test_nodes_beyond_the_job_predict_with_the_model(tmp_path):
    out = tmp_path / "s.jsonl"
    proc = commbench("proxy", "resnet50", "--nodes", "4", "--gpus-per-node", "8", "--hw", "dgx-a100",
                     "--tflops", "100", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "this host is not a job of 4 x 8 ranks" in proc.stdout and "nothing measured" in proc.stdout
    (summary,) = records(out, "proxy")
    assert summary["kind"] == "predicted" and summary["world_size"] == 32 and summary["backend"] == "model"



def test_a_step_of_no_time_has_no_rate(tmp_path):
    """One rank and no compute: the predicted step takes 0 us, and its samples/s is undefined (null, '-'),
    not infinite (which JSON cannot hold) nor 0."""
    out = tmp_path / "s.jsonl"
    proc = commbench("proxy", "resnet18", "--backend", "sim", "--nodes", "1", "--gpus-per-node", "1",
                     "--compute", "none", "--hw", "ethernet-25g", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    (summary,) = records(out, "proxy")
    assert summary["step_us_p50"] == 0 and summary["samples_per_s"] is None
    assert summary["schedule"] is True and summary["timing"] == "modelled"
    assert proc.stdout.splitlines()[-2].split()[-1] == "-"

def test_nodes_with_local_spawn_every_rank(tmp_path):
    out = tmp_path / "l.jsonl"
    proc = commbench("proxy", "resnet18", "--nodes", "2", "--gpus-per-node", "2", "--local", "--backend", "hybrid",
                     "--compute", "none", *FAST, "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    (summary,) = records(out, "proxy")
    assert summary["world_size"] == 4 and summary["backend"] == "hybrid"


@pytest.mark.parametrize("args,message", [
    (["nosuch"], "unknown model 'nosuch'; known:"),
    (["resnet18", "--batch", "0"], "--batch 0: must be at least 1"),
    (["resnet18", "--nodes", "4"], "not a job of 4 x 1 ranks; add --local"),
    (["resnet18", "--compute", "flops"], "needs --tflops"),
    (["resnet18", "--no-bucketing", "--single-bucket"], "exclude each other"),
    (["resnet18", "--bucket-mb", "-5"], "--bucket-mb -5: must be positive"),
    (["resnet18", "--backend", "sim"], "give --hw"),
    (["resnet18", "--backend", "sim", "--hw", "nope"], "no hardware file or preset 'nope'"),
    (["resnet18", "--nodes", "2", "--hw", "dgx-a100"], "needs the cluster's compute rate: give --tflops"),
    (["resnet18", "--validate", "--backend", "shm"], "not with --backend shm"),
    (["resnet18", "--validate", "--no-bucketing"], "not with --no-bucketing"),
    (["resnet18", "--validate", "--compute", "none"], "not with --compute none"),
    (["resnet18", "--validate", "--backend", "sim", "--hw", "dgx-a100", "--tflops", "9"], "not with --backend sim"),
])
def test_proxy_bad_input_is_one_line_and_exit_2(tmp_path, capsys, args, message):
    """In process (cli.main, as `python -m commbench` runs it): a process each only restarted Python;
    test_bad_profile_file_says_which_field runs the real command's refusal."""
    out = tmp_path / "x.jsonl"
    assert cli.main(["proxy", *args, "--json", str(out)]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not out.exists()


def test_bad_profile_file_says_which_field(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"name": "x", "tensors": []}))
    proc = commbench("proxy", str(path))
    assert proc.returncode == 2 and "missing field(s) forward_flops" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


def test_train_a_model_too_large_for_memory_is_one_line_and_exit_2(tmp_path):
    """Address space limited to what torch needs plus 1 GiB: bert-large's 1.3 GB of weights cannot fit."""

    prlimit = "/usr/bin/prlimit"
    if not os.path.exists(prlimit):
        pytest.skip("prlimit (util-linux) not installed")
    out = tmp_path / "t.jsonl"
    limit = torch_import_vm_bytes() + (1 << 30)
    proc = subprocess.run([prlimit, f"--as={limit}", sys.executable, "-m", "commbench", "train", "bert-large",
                           "--nprocs", "2", "--batch", "1", "--json", str(out)],
                          capture_output=True, text=True, timeout=300, env=clean_env())
    assert proc.returncode == 2, proc.stderr
    assert "out of memory" in proc.stderr and "Traceback" not in proc.stderr
    assert not out.exists() or not records(out, "step")


def test_dead_rank_ends_the_proxy_and_keeps_its_steps(tmp_path):
    out = tmp_path / "d.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "commbench", "proxy", "resnet18", "--nprocs", "2", "--batch", "1",
                             "--compute", "none", "--steps", "100000", "--timeout", "10", "--json", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env(),
                            start_new_session=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (out.exists() and len(records(out, "step")) >= 3):
        time.sleep(0.2)
    os.kill(rank_pid(proc.pid, 1), signal.SIGKILL)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 3, err
    assert "rank 1 was killed by SIGKILL" in err and "Traceback" not in err
    assert len(records(out, "step")) >= 3


def test_profiles_list_show_and_buckets():
    listing = commbench("profiles", "list")
    assert listing.returncode == 0 and "resnet50" in listing.stdout and "25,557,032" in listing.stdout
    show = commbench("profiles", "show", "vgg16", "--buckets", "--json")
    layout = json.loads(show.stdout)
    assert layout["count"] == len(layout["buckets"]) and layout["total_bytes"] == 138_357_544 * 4
    text = commbench("profiles", "show", "resnet50", "--buckets", "--bucket-mb", "5")
    assert text.returncode == 0 and "cap 5 MiB" in text.stdout
    assert commbench("profiles", "show", "nosuch").returncode == 2


def test_profiles_extract_a_callable(tmp_path):
    out = tmp_path / "tts.json"
    proc = commbench("profiles", "extract", "commbench.proxies.models.tts_angular:build", "-o", str(out),
                     "--name", "my_tts")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    assert data["name"] == "my_tts" and data["parameters"] == 9_381_888
    assert data["source"]["spec"] == "commbench.proxies.models.tts_angular:build"
    bad = commbench("profiles", "extract", "torchvision:nosuchnet", "-o", str(tmp_path / "x.json"))
    assert bad.returncode == 2 and "torchvision has no model 'nosuchnet'" in bad.stderr
    tiny = commbench("profiles", "extract", "torchvision:resnet18", "--input-shape", "5,64,64", "-o",
                     str(tmp_path / "y.json"))
    assert tiny.returncode == 2 and "one forward and backward failed" in tiny.stderr
    assert "Traceback" not in tiny.stderr and not (tmp_path / "y.json").exists()


def test_extract_takes_a_modules_own_inputs_unit_and_batch(tmp_path):
    out = tmp_path / "st.json"
    proc = commbench("profiles", "extract", "commbench.proxies.models.speech_transformer:build", "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    assert data["sample_unit"] == "utterances" and data["default_batch"] == 10
    assert "input_shape" not in data["source"]  # rebuilt with the module's own example_inputs
