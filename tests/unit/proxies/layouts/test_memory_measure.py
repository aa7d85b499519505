"""proxies/layouts/memory.py against a real step's peak (proxies/layouts/memory_measure.py): llama-tiny trained on
one CPU rank, bare, under DDP and under FSDP2, measured by torch's MemTracker (tensor storages, so load changes
nothing).
The model was 35-41% under before it counted the loss's fp32 buffers, a float32 run's width, DDP's buckets and
FSDP2's gathered root (benchmarks/memory_measured.py, docs/memory.md)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

CHILD = """
import json, sys
from commbench.proxies.layouts.memory_measure import measure_peak, predicted_peak, shape_of
constructor, seq, batch = sys.argv[1], 64, 4
out = {}
for wrapper in ("none", "ddp", "fsdp"):
    measured = measure_peak(constructor, seq, batch, "float32", wrapper)
    out[wrapper] = [measured.total_nbytes, predicted_peak(shape_of(constructor, seq, "float32"), batch,
                                                          wrapper).total_nbytes, measured.by_kind]
print(json.dumps(out))
"""
TINY = ("transformers:LlamaForCausalLM:hidden_size=64,intermediate_size=176,num_hidden_layers=4,"
        "num_attention_heads=4,num_key_value_heads=2,vocab_size=1024,max_position_embeddings=64,"
        "tie_word_embeddings=false")


@pytest.fixture(scope="module")
def peaks():
    pytest.importorskip("transformers")
    done = subprocess.run([sys.executable, "-P", "-c", CHILD, TINY], capture_output=True, text=True, timeout=300,
                          check=False)  # a process of its own: the wrappers start a one-rank process group
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("wrapper", ["none", "ddp", "fsdp"])
def test_llama_tiny_memory_is_predicted_within_ten_percent_of_its_measured_peak(peaks, wrapper):
    measured, predicted, _ = peaks[wrapper]
    assert predicted == pytest.approx(measured, rel=0.10), (wrapper, measured, predicted)


def test_the_wrappers_hold_what_the_model_says_they_add(peaks):
    """DDP adds its gradient buckets (the gradients' bytes) to the bare step's peak; FSDP2 its gathered root."""
    bare, ddp, fsdp = (peaks[w][0] for w in ("none", "ddp", "fsdp"))
    grads = peaks["none"][2]["PARAM"]  # float32 gradients are the parameters' bytes
    assert ddp - bare == pytest.approx(grads, rel=0.02)
    assert fsdp > bare and peaks["fsdp"][2]["UNSHARDED_PARAM"] > 0


LAYOUTS_CHILD = """
import json
from commbench.proxies.layouts.memory_measure import layout_peaks, predicted_layout_peak
from commbench.proxies.layouts.parallelism import parse_layout
from commbench.proxies.profile import load_profile
shape = load_profile("llama-tiny").transformer
layouts = [parse_layout(t, "ddp", 2) for t in ("fsdp2", "tp2,ddp1")]
peaks = layout_peaks(layouts, shape, world=2, timeout_s=240)
print(json.dumps({p.name: [peaks[p.name].total_nbytes, predicted_layout_peak(p, shape).total_nbytes] for p in layouts}))
"""


def test_layouts_trained_on_two_ranks_are_predicted_within_ten_percent():
    """train --layout's own FSDP2 and TP, each rank's second step measured by MemTracker: the prediction with the
    head whole on each TP rank and FSDP2's layers gathered in the backward only (before both: +13.9% and -26.4%)."""
    pytest.importorskip("transformers")
    done = subprocess.run([sys.executable, "-P", "-c", LAYOUTS_CHILD], capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    for name, (measured, predicted) in json.loads(done.stdout.strip().splitlines()[-1]).items():
        assert predicted == pytest.approx(measured, rel=0.10), (name, measured, predicted)


def test_a_pipeline_is_refused_before_any_rank_starts():
    from commbench.proxies.layouts.memory_measure import layout_peaks
    from commbench.proxies.layouts.parallelism import parse_layout
    from commbench.proxies.profile import load_profile

    with pytest.raises(ValueError, match="pp2,ddp2: a pipeline's memory is not measured"):
        layout_peaks([parse_layout("pp2,dp2", "ddp", 4, microbatches=4)], load_profile("llama-tiny").transformer)
