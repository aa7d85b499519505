"""--layout auto's search: every layout it enumerates can run, the ones people use are among them, and what
fits is ranked fastest first with the rest counted."""
import pytest

from commbench.analysis.layout_search import SearchSpace, candidates, search
from commbench.analysis.predict_layout import Job, predict_layout
from commbench.costmodel import load_hardware
from commbench.proxies.profile import load_profile


def _job(model: str, per_node: int = 8) -> Job:
    profile = load_profile(model)
    return Job(profile.transformer, profile, load_hardware("dgx-h100"), per_node, 1, 400.0, "selective")


def test_every_candidate_runs_and_the_usual_ones_are_there():
    shape = load_profile("llama3.1-70b").transformer
    space = SearchSpace(256, 8, 256, 1)
    found = candidates(shape, space)
    names = [p.name for p in found]
    assert len(names) == len(set(names)) > 50
    for par in found:
        par.check(256, 8, shape, within_node=("tp",))
        assert par.microbatches * par.dp == 256
    for usual in ("tp8sp,fsdp32", "tp4sp,pp2,fsdp32", "tp8sp,cp2,fsdp16", "tp8sp,pp4,fsdp8@interleaved:2"):
        assert usual in names
    assert not any(p.tp == 3 or p.tp > 8 for p in found)  # TP inside a node, dividing the heads


def test_experts_are_searched_on_a_model_with_them_and_bounded_tp_is_kept():
    shape = load_profile("mixtral-8x7b").transformer
    found = candidates(shape, SearchSpace(64, 8, 64, 1, max_tp=2))
    assert any(p.ep == 8 for p in found) and all(p.tp <= 2 for p in found)


def test_what_fits_is_ranked_fastest_first_and_the_rest_counted():
    job = _job("llama3.1-8b")
    result = search(job, job.shape, SearchSpace(16, 8, 16, 1))
    speeds = [p.tokens_per_s for p in result.ranked]
    assert speeds == sorted(speeds, reverse=True) and all(p.fits for p in result.ranked)
    assert result.searched == len(result.ranked) + len(result.too_big)
    sizes = [nbytes for _, nbytes in result.too_big]
    assert sizes == sorted(sizes)
    best = result.ranked[0]
    assert predict_layout(job, best.layout).step_us == pytest.approx(best.step_us)  # the same prediction


def test_a_search_larger_than_its_bound_is_one_line(monkeypatch):
    from commbench.analysis import layout_search
    from commbench.proxies.layouts.parallelism import LayoutError

    monkeypatch.setattr(layout_search, "MAX_CANDIDATES", 5)
    with pytest.raises(LayoutError, match="more than 5 layouts"):
        candidates(load_profile("llama3.1-70b").transformer, SearchSpace(256, 8, 256, 1))


def test_a_global_batch_beyond_a_ranks_micro_batches_leaves_those_layouts_out():
    """A search at --global-batch 16384 on 16 GPUs ran a minute, then a layout of 8,192 micro-batches a rank was
    refused mid-way with a traceback (the setups' accumulate bound): such layouts are not candidates."""
    from commbench.analysis.layout_search import MAX_MICROBATCHES

    found = candidates(load_profile("llama3.1-8b").transformer, SearchSpace(16, 8, 16384, 1))
    assert found and all(p.microbatches <= MAX_MICROBATCHES for p in found)
    assert not any(p.dp == 2 for p in found)  # 8,192 micro-batches a rank
