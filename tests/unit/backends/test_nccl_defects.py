"""Known NCCL defects said on stderr (commbench/backends/nccl_defects.py): NVIDIA/nccl#1950, one-rank avg."""
from commbench.backends import nccl_defects
from commbench.backends.nccl_defects import one_rank_avg_defect, say_once
from commbench.collectives import resolve_dtype

F32, I32 = resolve_dtype("float32"), resolve_dtype("int32")
AFFECTED = ("allreduce", "reduce_scatter", "reduce")


def test_the_one_rank_avg_defect_is_named_only_where_it_applies():
    """NCCL 2.28.9 left the last count mod blocks elements of a one-rank float avg unwritten (H100, 2026-11-27:
    4 wrong of 262,148 out of place, NVIDIA/nccl#1950, fixed in 2.29.7): the warning names it there only."""
    note = one_rank_avg_defect(22809, 1, "avg", F32, ["allreduce"], AFFECTED)
    assert note and "2.28.9" in note and "NVIDIA/nccl#1950" in note and "2.29.7" in note
    assert one_rank_avg_defect(22809, 1, "avg", resolve_dtype("bfloat16"), ["reduce"], AFFECTED)
    for version, world, op, dtype, collectives in (
            (22907, 1, "avg", F32, ["allreduce"]), (23001, 1, "avg", F32, ["allreduce"]),
            (22809, 2, "avg", F32, ["allreduce"]), (22809, 1, "sum", F32, ["allreduce"]),
            (22809, 1, "avg", I32, ["allreduce"]), (None, 1, "avg", F32, ["allreduce"]),
            (22809, 1, "avg", F32, ["allgather", "broadcast", "alltoall"])):
        assert one_rank_avg_defect(version, world, op, dtype, collectives, AFFECTED) is None, \
            (version, world, op, dtype, collectives)


def test_a_note_is_said_once_per_process(capsys, monkeypatch):
    """-c all checks the request once per collective: the warning still comes once."""
    monkeypatch.setattr(nccl_defects, "_said", set())
    for _ in range(7):
        say_once("the note")
    say_once(None)
    assert capsys.readouterr().err == "commbench: warning: the note\n"


def test_torch_on_nccl_warns_for_its_own_out_of_place_reduce_scatter(capsys, monkeypatch):
    """torch runs allreduce and reduce out of place as a copy and an in-place call (the tail keeps the input):
    only its reduce_scatter, which NCCL writes out of place itself, can meet the defect."""
    from commbench.backends import torch_dist

    monkeypatch.setattr(nccl_defects, "_said", set())
    monkeypatch.setattr(torch_dist, "_torch_nccl_version", lambda: 22809)
    torch_dist.TorchBackend.check_request(None, "nccl", ["allreduce", "reduce"], F32, "avg", 1)
    assert capsys.readouterr().err == ""
    torch_dist.TorchBackend.check_request(None, "nccl", ["reduce_scatter"], F32, "avg", 1)
    assert "NVIDIA/nccl#1950" in capsys.readouterr().err
