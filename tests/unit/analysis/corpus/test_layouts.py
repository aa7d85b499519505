"""The published layouts corpus (analysis/corpus/layouts.py): the shipped file loads, damaged copies are refused
with one line per problem, and the quantities derived from a row agree with what the source prints."""
from __future__ import annotations

import copy
import json
from dataclasses import replace

import pytest

from commbench.analysis.corpus import layouts as L


@pytest.fixture(scope="module")
def shipped():
    with open(L.CORPUS_PATH, encoding="utf-8") as handle:
        return json.load(handle)


def _write(tmp_path, data) -> str:
    path = tmp_path / "layouts.json"
    path.write_text(json.dumps(data) if not isinstance(data, str) else data, encoding="utf-8")
    return str(path)


def _problems(tmp_path, data) -> list[str]:
    with pytest.raises(L.LayoutCorpusError) as caught:
        L.load_layout_corpus(_write(tmp_path, data))
    return str(caught.value).splitlines()


def _index(data: dict, source: str, model: str | None = None) -> int:
    return next(i for i, r in enumerate(data["rows"])
                if r["source"] == source and (model is None or r["model"] == model))


def test_shipped_corpus_loads_with_enough_rows_and_sources():
    corpus = L.load_layout_corpus()
    assert len(corpus.rows) >= 20
    used = {r.source for r in corpus.rows}
    assert len(used) >= 3 and used <= set(corpus.sources)
    assert len({corpus.sources[s]["organisation"] for s in used}) >= 3
    assert all("torchtitan" not in s["address"].lower() for s in corpus.sources.values())


def test_every_row_batches_into_whole_micro_batches():
    corpus = L.load_layout_corpus()
    for row in corpus.rows:
        par = row.parallelism()
        assert par.world == row.gpus
        assert par.microbatches * (row.microbatch or L.ASSUMED["microbatch"]) * par.dp == row.global_batch


def test_context_parallel_row_keeps_the_tokens_a_batch(shipped):
    corpus = L.load_layout_corpus()
    llama = [r for r in corpus.rows if r.source == "llama3-herd-2024"]
    assert {r.global_batch * r.seq_len for r in llama} == {2048 * 8192}
    assert any(r.layout["cp"] > 1 for r in llama)


def test_not_json_and_wrong_schema(tmp_path, shipped):
    assert len(_problems(tmp_path, "{ not json")) == 1
    bad = dict(shipped, schema=2)
    assert _problems(tmp_path, bad) == [f"{_write(tmp_path, bad)}: not a layouts corpus of schema 1"]


@pytest.mark.parametrize("damage, expected", [
    (lambda r: r["layout"].update(dp=r["layout"]["dp"] + 1), "tp x pp x cp x dp"),
    (lambda r: r.update(precision="fp4"), ".precision must be one of"),
    (lambda r: r.update(model="no-such-model"), "neither in shapes nor a shipped profile"),
    (lambda r: r["throughput"].update(mfu=0.9), "mfu 0.9 but"),
    (lambda r: r["throughput"].update(aggregate_pflops=9.9), "aggregate_pflops 9.9 but"),
    (lambda r: r["throughput"].update(speed=3), "throughput.speed: not one of"),
    (lambda r: r.update(global_batch=511), "not a whole number of micro-batches"),
    (lambda r: r["layout"].update(schedule="zigzag"), "layout.schedule must be one of"),
    (lambda r: r["layout"].update(setup="ring"), "layout.setup must be one of"),
    (lambda r: r.update(memory_gb=-1), ".memory_gb must be a positive number"),
    (lambda r: r.update(gpus=True), ".gpus must be a whole number"),
    (lambda r: r.update(flops_formula="guess"), ".flops_formula must be one of"),
    (lambda r: r["layout"].update(expert_tp=3), ".layout.expert_tp must be 1"),
    (lambda r: r["layout"].update(ep_dispatcher="nvshmem"), ".layout.ep_dispatcher must be one of"),
])
def test_damaged_row_is_refused_naming_it(tmp_path, shipped, damage, expected):
    data = copy.deepcopy(shipped)
    i = _index(data, "narayanan-2021")
    damage(data["rows"][i])
    lines = _problems(tmp_path, data)
    assert any(f"rows[{i}]" in line and expected in line for line in lines), lines


def test_every_problem_is_its_own_line(tmp_path, shipped):
    data = copy.deepcopy(shipped)
    first, second = 0, len(data["rows"]) - 1
    data["rows"][first]["precision"] = "fp4"
    data["rows"][second]["gpus"] = 0
    lines = _problems(tmp_path, data)
    assert len(lines) == 2
    assert f"rows[{first}].precision" in lines[0] and f"rows[{second}].gpus" in lines[1]


def test_layout_the_model_cannot_split_is_refused_unless_marked(tmp_path, shipped):
    data = copy.deepcopy(shipped)
    i = _index(data, "nemo-24.07", "llama3.1-70b")
    data["rows"][i]["layout"].update(pp=3, dp=1, tp=4)  # 80 layers over 3 x 5 virtual stages do not divide
    data["rows"][i]["gpus"] = 4 * 3 * 2 * 1
    data["rows"][i]["global_batch"] = 126  # whole groups of pp micro-batches, as interleaving needs
    assert any(f"rows[{i}]" in line and "does not divide the model's 80 layers" in line
               for line in _problems(tmp_path, data))
    data["rows"][i]["not_predicted"] = "an uneven pipeline"
    corpus = L.load_layout_corpus(_write(tmp_path, data))
    assert corpus.rows[i].not_predicted == "an uneven pipeline"


def test_stated_gradient_accumulation_and_tokens_are_checked(tmp_path, shipped):
    data = copy.deepcopy(shipped)
    i = next(j for j, r in enumerate(data["rows"]) if "gradient_accumulation" in r)
    k = next(j for j, r in enumerate(data["rows"]) if "tokens_per_batch_stated" in r)
    data["rows"][i]["gradient_accumulation"] += 1
    data["rows"][k]["tokens_per_batch_stated"] = 8e6
    lines = _problems(tmp_path, data)
    assert any(f"rows[{i}].gradient_accumulation" in line for line in lines)
    assert any(f"rows[{k}].tokens_per_batch_stated" in line for line in lines)


def test_tflops_that_disagree_with_the_tokens_are_refused(tmp_path, shipped):
    data = copy.deepcopy(shipped)
    i = next(j for j, r in enumerate(data["rows"]) if r.get("flops_formula") == "megatron-core"
             and "tokens_per_s_per_gpu" in r["throughput"])
    data["rows"][i]["throughput"]["tflops_per_gpu"] *= 1.1
    assert any(f"rows[{i}].throughput" in line and "megatron-core's FLOPs a token" in line
               for line in _problems(tmp_path, data))


def test_system_needs_one_kind_of_hardware(tmp_path, shipped):
    data = copy.deepcopy(shipped)
    name = next(n for n, s in data["systems"].items() if "hardware" in s)
    data["systems"][name]["preset"] = "dgx-h100"
    assert any(f"systems.{name}: give either preset" in line for line in _problems(tmp_path, data))
    data = copy.deepcopy(shipped)
    data["systems"][name]["assumed"] = []
    assert any(f"systems.{name}.assumed" in line for line in _problems(tmp_path, data))


def test_expert_tp_reaches_the_layout_and_moves_the_expert_group(shipped):
    corpus = L.load_layout_corpus()
    row = next(r for r in corpus.rows if r.layout.get("expert_tp") == 1 and r.layout["tp"] > 1 and not r.not_predicted)
    par = row.parallelism()
    assert par.expert_tp == 1 and "etp1" in par.name
    # under etp1 an EP group takes consecutive ranks (inside a node for EP 8); without, it strides over TP
    assert par.group(0, "ep") == tuple(range(par.ep))
    assert replace(par, expert_tp=None).group(0, "ep") != tuple(range(par.ep))
