"""proxies/trace_et.py on real execution traces (ExecutionTraceObserver, torch 2.14.1, schema
1.1.1-chakra.0.0.4) of DDP on 2 gloo ranks: benchmarks/capture_trace.py --execution-trace --width 128
--layers 2 --steps 1 --warmup 1 (two steps, one bucket each)."""
import gzip

import pytest
from conftest import DATA

from commbench.proxies.trace_calls import TraceError
from commbench.proxies.trace_files import read_traces

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
