"""`check` on parallel-layout runs: a replay at a given rate is predicted by predict_layout for its own layout,
micro-batches and topology; any other run (training, a replay measuring its compute) from the compute block of the
hardware file; without one it is left out with the reason."""
from __future__ import annotations

from dataclasses import replace

import pytest

from commbench.analysis.check import check
from commbench.analysis.check import summary as summary_of
from commbench.analysis.check_layout import LayoutCheckError, check_layout_run, parallelism_of
from commbench.analysis.predict_layout import Job, predict_layout
from commbench.costmodel import load_hardware
from commbench.costmodel.compute import AttentionPoint, ComputeBlock, MatmulPoint, attention_flops
from commbench.proxies.layouts.parallelism import parse_layout
from commbench.proxies.profile import load_profile
from commbench.topology import Topology


def _run(layout: str = "tp2,dp2", kind: str = "proxy", compute: str = "flops", nodes: int = 1,
         step_us: float = 50_000.0, comm_us: float = 30_000.0, **schedule) -> list[dict]:
    """A header and a proxy record as `proxy --layout` (or `train --layout`) writes them."""
    par = parse_layout(layout, "ddp", 4, **schedule)
    config = {"model": "llama-tiny", "compute": compute, "tflops": 0.01 if compute == "flops" else None,
              "microbatch": 1, "checkpointing": "none", "layout": par.to_dict()}
    header = {"record": "header", "run_id": "r1", "kind": kind, "model": "llama-tiny", "config": config}
    record = {"record": "proxy", "run_id": "r1", "kind": kind, "model": "llama-tiny", "backend": "torch",
              "world_size": 4, "nnodes": nodes, "status": "ok", "step_us_p50": step_us, "comm_us_p50": comm_us,
              "gradient_bytes": 1 << 20, "layout": par.to_dict()}
    return [header, record]


@pytest.fixture(scope="module")
def hw():
    return load_hardware("dgx-a100")


@pytest.mark.parametrize("layout, nodes, schedule", [("tp2,dp2", 1, {}), ("pp2,dp2", 2, {"microbatches": 4}),
                                                     ("cp2,fsdp2", 1, {})])
def test_a_replay_is_predicted_for_its_own_layout_rate_and_topology(hw, layout, nodes, schedule):
    header, record = _run(layout, nodes=nodes, **schedule)
    checked = check_layout_run(record, header["config"], hw, "ring")
    profile = load_profile("llama-tiny")
    topo = Topology(nodes, 4 // nodes)
    expected = predict_layout(Job(profile.transformer, profile, hw, 4 // nodes, 1, 0.01, "none",
                                  "ring"), parallelism_of(record))
    assert checked.step_us == pytest.approx(expected.step_us)
    assert checked.exposed_us == pytest.approx(sum(expected.exposed_us.values()))
    assert parallelism_of(record).name in checked.setup and f"{topo}" in checked.setup


def test_check_gives_a_step_and_a_comm_row_for_a_layout_replay(hw):
    rows, notes = check(_run("tp2,dp2"), hw)
    assert [(r.kind, r.what) for r in rows] == [("proxy", "step"), ("proxy", "comm")]
    assert "tp2" in rows[0].setup and rows[0].measured_us == 50_000.0
    assert not any("llama-tiny" in n for n in notes)


@pytest.mark.parametrize("kind, compute", [("train", "flops"), ("proxy", "measured")])
def test_a_run_without_a_known_rate_is_left_out_with_the_reason(hw, kind, compute):
    rows, notes = check(_run(kind=kind, compute=compute), hw)
    assert rows == []
    assert any("compute rate is not known" in n for n in notes), notes


def test_a_damaged_or_mismatched_layout_is_a_note_not_a_traceback(hw):
    header, record = _run()
    record["layout"] = {"layout": "tp2,dp2", "tp": "two"}
    with pytest.raises(LayoutCheckError, match="damaged|left out"):
        check_layout_run(record, header["config"], hw, "ring")
    header, record = _run()
    record["world_size"] = 8  # the layout holds 4 ranks
    rows, notes = check([header, record], hw)
    assert rows == [] and any("do not hold the layout" in n for n in notes)


@pytest.mark.parametrize("where, key, value, message", [
    ("config", "tflops", "fast", "tflops 'fast' is not a rate"),
    ("config", "tflops", 1e-300, "is not a rate"),
    ("config", "tflops", -1, "is not a rate"),
    ("config", "tflops", 0, "is not a rate"),
    ("config", "tflops", None, "is not a rate"),
    ("config", "microbatch", "x", "microbatch 'x' is not a whole number"),
    ("config", "checkpointing", "bogus", "checkpointing 'bogus' is not one of"),
    ("layout", "microbatches", 10**15, "more than 4096"),
])
def test_damaged_run_settings_are_one_note_each(hw, where, key, value, message):
    header, record = _run()
    (header["config"] if where == "config" else record["layout"])[key] = value
    rows, notes = check([header, record], hw)
    assert rows == [] and any(message in n for n in notes), notes


def test_a_header_config_that_is_not_an_object_is_taken_as_missing(hw):
    header, record = _run()
    header["config"] = "not an object"
    rows, notes = check([header, record], hw)  # no AttributeError: the run's rate is then not known
    assert rows == [] and any("compute rate is not known" in n for n in notes)


def _block(tflops: float, attention: bool = True, dtypes=("float32",), cpus: int | None = None) -> ComputeBlock:
    """Products and attention at `tflops` in each of `dtypes` (a CPU's block: `commbench compute` times float32)."""
    flops = attention_flops(8, 128, 128, 16, True)
    matmul = tuple(MatmulPoint(256, 256, 256, d, 2 * 256 ** 3 / (tflops * 1e6)) for d in dtypes)
    points = tuple(AttentionPoint(8, 128, 128, 16, True, d, flops / (tflops * 1e6), 2 * flops / (tflops * 1e6))
                   for d in dtypes)
    meta = {"dtype": dtypes[0], "cpus": cpus, "threads": 1}
    return ComputeBlock("cpu (test)", matmul, points if attention else (), 5.0, 1.0, meta=meta)


@pytest.mark.parametrize("kind, compute", [("train", "flops"), ("proxy", "measured"), ("proxy", "block")])
def test_a_run_without_a_given_rate_is_predicted_from_the_blocks_operators(hw, kind, compute):
    header, record = _run("pp2,dp2", kind=kind, compute=compute, microbatches=4)
    with_block = replace(hw, compute=_block(0.05))
    checked = check_layout_run(record, header["config"], with_block, "ring")
    profile = load_profile("llama-tiny")
    shape = replace(profile.transformer, dtype_bytes=4) if kind == "train" else profile.transformer  # train: fp32
    job = Job(shape, profile, with_block, 4, 1, 0.0, "none", "ring", compute=with_block.compute,
              compute_dtype="float32")
    expected = predict_layout(job, parallelism_of(record))
    assert checked.step_us == pytest.approx(expected.step_us)
    assert "at the float32 compute block" in checked.setup
    faster = check_layout_run(record, header["config"], replace(hw, compute=_block(0.5)), "ring")
    assert faster.step_us < checked.step_us  # the block's rates are what the step is made of
    rows, notes = check([header, record], with_block)
    assert [r.what for r in rows] == ["step", "comm"] and rows[0].predicted_us == pytest.approx(expected.step_us)


def test_a_replay_at_a_given_rate_keeps_its_rate_beside_a_block(hw):
    header, record = _run("tp2,dp2")
    assert check_layout_run(record, header["config"], replace(hw, compute=_block(0.5)), "ring") == \
        check_layout_run(record, header["config"], hw, "ring")


def test_a_block_that_lacks_what_the_layers_need_is_named(hw):
    header, record = _run(kind="train")
    rows, notes = check([header, record], replace(hw, compute=_block(0.05, attention=False)))
    assert rows == [] and any("compute block lacks float32 attention" in n for n in notes), notes


def test_a_train_run_is_read_in_float32_and_sized_at_four_bytes(hw):
    """`train --layout` trains in float32: a block with bfloat16 products beside float32 ones is read in float32, and
    the layers' bytes are 4-byte (read in bfloat16 at 2 bytes it came out 2.3x faster)."""
    header, record = _run("tp2,dp2", kind="train")
    both = check_layout_run(record, header["config"], replace(hw, compute=_block(0.05, dtypes=("bfloat16", "float32"))),
                            "ring")
    only = check_layout_run(record, header["config"], replace(hw, compute=_block(0.05)), "ring")
    assert "float32 compute block" in both.setup and both.step_us == pytest.approx(only.step_us)


def test_ranks_sharing_a_host_share_a_cpu_blocks_cores_across_emulated_nodes(hw):
    """Two emulated nodes of 2 ranks on one 2-core host: the block's cores are shared by the host's 4 ranks, as on
    one node of 4 (not by a node's 2: half the compute)."""
    block = replace(hw, compute=_block(0.05, cpus=2))
    header, record = _run("pp2,fsdp2", kind="train", microbatches=4)
    one_node = check_layout_run(record, header["config"], block, "ring")
    header, record = _run("pp2,fsdp2", kind="train", nodes=2, microbatches=4)
    emulated = check_layout_run(record, header["config"], block, "ring", ranks_per_host=4)
    alone = check_layout_run(record, header["config"], block, "ring")
    assert emulated.step_us > 1.5 * alone.step_us
    assert emulated.step_us == pytest.approx(one_node.step_us, rel=0.05)  # the links differ, the compute does not


def test_a_header_listing_more_ranks_than_the_run_shares_the_cores_among_the_runs_own(hw):
    """The ranks a header lists on one host count up to the run's world: 100,000 listed entries of a 4-rank run
    predicted a 510 s step before."""
    header, record = _run("tp2,dp2", kind="train")
    block = replace(hw, compute=_block(0.05, cpus=2))
    listed = {"host": "h", "device": "cpu", "cpus": 2, "cpu_affinity": [0, 1]}
    header["ranks"] = [listed] * 4
    four = check([header, record], block)[0][0].predicted_us
    header["ranks"] = [listed] * 100_000
    assert check([header, record], block)[0][0].predicted_us == pytest.approx(four)


def test_a_measured_replays_pieces_are_set_against_the_blocks(hw):
    """47 item 6: the pieces a `proxy --layout --compute measured` run timed (its header's layout_compute_us, the
    slowest rank's) each against the piece the block costs (pieces.from_block), as rows of kind compute, judged apart
    from the steps; a replay spinning the block's own pieces is not set against itself, a damaged piece or header
    is a note."""
    from commbench.analysis.check_layout import check_layout_pieces
    from commbench.proxies.layouts.pieces import from_block

    header, record = _run("cp2,dp2", compute="measured")
    header["layout_compute_us"] = {"layer_forward_us": 900.0, "layer_backward_us": 2000.0, "block_forward_us": 50.0,
                                   "block_backward_us": 120.0, "embed_forward_us": 30.0, "embed_backward_us": 60.0,
                                   "head_forward_us": 400.0, "head_backward_us": 800.0, "optimizer_us": 700.0}
    with_block = replace(hw, compute=_block(0.05))
    expected = from_block(with_block.compute, parallelism_of(record), load_profile("llama-tiny").transformer, 1, 0,
                          "float32")
    pieces = check_layout_pieces(record, header, header["config"], with_block)
    assert [p for p, _, _ in pieces] == ["layer forward", "layer backward", "block forward", "block backward",
                                         "embed forward", "embed backward", "head forward", "head backward",
                                         "optimizer"]
    assert pieces[0][1:] == (900.0, pytest.approx(expected.layer_forward_us))
    assert pieces[-1][1:] == (700.0, pytest.approx(expected.optimizer_us))
    rows, notes = check([header, record], with_block)
    assert [r.kind for r in rows] == ["proxy", "proxy"] + ["compute"] * 9
    assert rows[2].what == "layer forward" and rows[2].error == pytest.approx(expected.layer_forward_us / 900 - 1)
    spun = [dict(header, config=dict(header["config"], compute="block")), record]
    assert check_layout_pieces(record, spun[0], spun[0]["config"], with_block) == []
    summary = summary_of(rows)
    assert summary["all"]["rows"] == 2 and summary["compute_pieces"]["rows"] == 9  # --max-error judges the steps
    header["layout_compute_us"]["optimizer_us"] = float("nan")
    rows, notes = check([header, record], with_block)
    assert [r.kind for r in rows] == ["proxy", "proxy"] and any("layout_compute_us" in n for n in notes)
    for damaged in ("oops", [1]):  # a header's config that is not an object: as check_layout_run takes it
        rows, notes = check([dict(header, config=damaged), record], with_block)
        assert all(r.kind == "proxy" for r in rows)


def test_a_pipelines_pieces_are_set_against_the_fullest_stages(hw):
    """The measured pieces are the slowest rank's: the head is the last stage's, the embedding the first's."""
    from commbench.analysis.check_layout import check_layout_pieces

    header, record = _run("pp2,dp2", compute="measured", microbatches=4)
    header["layout_compute_us"] = {"layer_forward_us": 900.0, "layer_backward_us": 2000.0, "embed_forward_us": 30.0,
                                   "embed_backward_us": 60.0, "head_forward_us": 400.0, "head_backward_us": 800.0,
                                   "optimizer_us": 700.0}
    pieces = dict((p, (m, q)) for p, m, q in check_layout_pieces(record, header, header["config"],
                                                                  replace(hw, compute=_block(0.05))))
    assert {"embed forward", "head forward", "optimizer"} <= set(pieces)
