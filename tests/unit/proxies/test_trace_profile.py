"""proxies/trace_profile.py: a profile from a real DDP trace (tests/data/traces/, 4 x Linear(512, 512)
on 2 gloo ranks) gives back the bucket layout DDP made for the model, and the traced compute."""
import pytest
from conftest import DATA

from commbench.proxies import buckets as B
from commbench.proxies.profile import load_profile
from commbench.proxies.trace_calls import TraceError
from commbench.proxies.trace_files import read_traces
from commbench.proxies.trace_profile import TRACED_TFLOPS, profile_from_trace

DDP = [str(DATA / "traces" / f"ddp_2rank_gloo_rank{r}.json.gz") for r in (0, 1)]
FSDP = str(DATA / "traces" / "fsdp2_2rank_gloo_rank0.json.gz")


def test_the_profile_gives_ddps_own_buckets(tmp_path):
    profile = profile_from_trace(DDP[0], batch=32)
    path = tmp_path / "p.json"
    profile.save(str(path))
    loaded = load_profile(str(path))  # a valid profile file
    traced = [c.nbytes for c in read_traces(DDP).ranks[0].steps[0].calls]
    assert [b.nbytes for b in B.assign(loaded, None, "ddp")] == traced
    assert loaded.parameters == 4 * (512 * 512 + 512) and len(loaded.tensors) == 8
    assert sorted(t.shape for t in loaded.tensors) == sorted([(512, 512)] * 4 + [(512,)] * 4)


def test_compute_is_the_traced_busy_time_at_the_traced_rate():
    one, many = profile_from_trace(DDP[0], batch=1), profile_from_trace(DDP[0], batch=32)
    assert many.forward_flops == pytest.approx(one.forward_flops / 32)
    forward_us = one.forward_flops / (TRACED_TFLOPS * 1e6)
    assert 0 < forward_us < one.source["step_us"]
    ready = [t.ready_flops for t in sorted(one.tensors, key=lambda t: t.ready_index)]
    assert ready == sorted(ready) and ready[-1] <= one.backward_flops


def test_an_fsdp_trace_is_refused_in_one_line():
    with pytest.raises(TraceError, match="sharded"):
        profile_from_trace(FSDP)
