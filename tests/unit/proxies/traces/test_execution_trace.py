"""proxies/traces/execution_trace.py on real execution traces (ExecutionTraceObserver, torch 2.14.1, schema
1.1.1-chakra.0.0.4) of DDP on 2 gloo ranks: benchmarks/capture_trace.py --execution-trace --width 128
--layers 2 --steps 1 --warmup 1 (two steps, one bucket each)."""
import gzip

import pytest
from conftest import DATA

from commbench.proxies.traces.calls import TraceError
from commbench.proxies.traces.files import read_traces

ET = [str(DATA / "traces" / f"et_ddp_2rank_gloo_rank{r}.json.gz") for r in (0, 1)]
MODEL_BYTES = 2 * (128 * 128 + 128) * 4


def test_execution_trace_gives_each_steps_bucket_in_order():
    job = read_traces(ET)
    assert job.world == 2 and job.source == "PyTorch execution trace"
    for rank in job.ranks:
        (step,) = rank.steps
        reduces = [c for c in step.calls if c.collective == "allreduce"]
        assert [c.nbytes for c in reduces] == [MODEL_BYTES, MODEL_BYTES]
        assert all(c.dtype == "float32" for c in reduces)
        assert all(c.group == (0, 1) and c.time_us is None for c in step.calls)


def _edited(tmp_path, edit):
    path = tmp_path / "et_rank1.json"
    path.write_text(edit(gzip.open(ET[1], "rt").read()))
    return str(path)


def test_unknown_schema_and_cut_file_are_one_error(tmp_path):
    with pytest.raises(TraceError, match="schema"):
        read_traces([ET[0], _edited(tmp_path, lambda t: t.replace('"1.1.1-chakra', '"9.0.0-chakra', 1))])
    with pytest.raises(TraceError, match="truncated"):
        read_traces([ET[0], _edited(tmp_path, lambda t: t[: len(t) // 2])])


def test_a_rank_missing_disagrees_with_the_job():
    with pytest.raises(TraceError, match="mix|disagree"):
        read_traces([ET[0], str(DATA / "traces" / "ddp_2rank_gloo_rank1.json.gz")])


def _node_edited(tmp_path, edit):
    """Rank 1's trace with its first c10d node passed to `edit` (which changes it in place)."""
    import json

    data = json.load(gzip.open(ET[1], "rt"))
    edit(next(n for n in data["nodes"] if str(n.get("name", "")).startswith("c10d::")))
    path = tmp_path / "et_rank1.json"
    path.write_text(json.dumps(data))
    return str(path)


@pytest.mark.parametrize("edit,field", [
    (lambda n: n["inputs"].update(shapes=[[[-33024]]]), "'Input Dims' is -33024"),
    (lambda n: n["inputs"].update(shapes=[[[2 ** 30, 2 ** 30, 2 ** 30]]]), "elements; a tensor holds at most"),
    (lambda n: n["inputs"].update(shapes=[[["33024"]]]), "'Input Dims' is '33024'"),
    (lambda n: n["inputs"].update(shapes={"0": 1}), "lacks its input 0"),
    (lambda n: n.update(inputs=[1]), "lacks its input 0"),
    (lambda n: n.update(id=float("nan")), "'id' is nan"),
    (lambda n: n.update(id="218"), "'id' is '218'"),
])
def test_a_crafted_node_is_one_line_naming_the_file_the_node_and_the_field(tmp_path, edit, field):
    """Was a negative size sent to the ranks, or a traceback (issue 48)."""
    path = _node_edited(tmp_path, edit)
    with pytest.raises(TraceError) as caught:
        read_traces([ET[0], path])
    said = str(caught.value)
    assert said.startswith(f"{path}: node ") and "c10d::allreduce_" in said and field in said, said
