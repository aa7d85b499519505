"""The `#` notes of predict and predict-scaling at most 120 characters a line (issue 48, item 12: the corpus's
note was 405 characters, predict-scaling's step terms 472): a long note is several `#` lines (commands/helpers/common.py
note_lines), every word of it kept in order; the table's own rows and column header are left as they are."""
from __future__ import annotations

import pytest

from commbench.cli import main
from commbench.commands.helpers.common import NOTE_WIDTH, note_lines

LONG = ("# step terms: overlap_slowdown 0 (defaulted: no GPU was available to this project's sessions: not measured, 0 "
        "until a GPU run measures it); step_cv 0.25% (defaulted: PyTorch DDP benchmark README @ bf69c149, 1 GPU in "
        "DDP: p95 - p50 of sec/iter over 1.645, median of its 4 models (0.14-0.41%)); per_bucket_us 0 us")


def test_a_long_note_is_several_comment_lines_with_every_word_kept():
    lines = note_lines(LONG)
    assert len(lines) == 3 and all(len(line) <= NOTE_WIDTH and line.startswith("#") for line in lines)
    assert " ".join(line.lstrip("# ") for line in lines).split() == LONG[2:].split()
    assert lines[0].startswith("# step terms:") and all(line.startswith("#   ") for line in lines[1:])


def test_an_indented_note_keeps_its_indent_and_a_short_or_other_line_is_left_alone():
    indented = "#        8 GPUs: " + "; ".join(["7.816 MiB x1 ring/LL128 16ch"] * 6)
    lines = note_lines(indented)
    assert lines[0].startswith("#        8 GPUs:") and lines[1].startswith("#          ring") and len(lines) == 2
    assert note_lines("# short") == ["# short"]
    row = " " * 10 + "x" * 200
    assert note_lines(row) == [row]  # a table's row: not a note


def _notes(stdout: str) -> list[str]:
    """The `#` lines that are notes: not the column headers (a table's header is as wide as its rows)."""
    return [line for line in stdout.splitlines() if line.startswith("#") and "algorithm" not in line[:40]
            and "size " not in line and "(B)" not in line and "in-place" not in line and "step(ms)" not in line]


@pytest.mark.parametrize("args", [
    ["predict", "-c", "allreduce", "-s", "1K-4K", "--hw", "dgx-h100", "-T", "2x8"],
    ["predict-scaling", "bert-large", "--hw", "dgx-a100", "--gpus", "8,64,512,1000", "--gpus-per-node", "8",
     "--batch", "4", "--precision", "amp", "--baseline", "nccl", "--candidate", "hier"],
    ["predict-scaling", "resnet50", "--hw", "dgx1-v100-4ib", "--gpus", "1,8,16", "--batch", "32",
     "--throughput-1gpu", "329", "--ddp-ms", "3"],
    ["predict-scaling", "llama3.1-70b", "--gpus", "1024", "--layout", "tp8,fsdp128", "--layout", "tp4sp,pp2,fsdp128",
     "--hw", "dgx-h100", "--tflops", "400"],
    ["predict-scaling", "llama3.1-8b", "--gpus", "64", "--layout", "auto", "--hw", "dgx-h100", "--tflops", "400"],
])
def test_predict_and_predict_scaling_print_no_note_wider_than_120(capsys, args):
    assert main(args) == 0
    output = capsys.readouterr().out
    notes = _notes(output)
    assert len(notes) > 3
    assert [line for line in notes if len(line) > NOTE_WIDTH] == []
    said = " ".join(line.lstrip("# ") for line in notes)  # the facts of the wrapped notes, their breaks undone
    if args[0] == "predict":
        assert "published nccl-tests figures" in said and "(analysis/corpus/collectives.json, docs/model.md)" in said
    elif "auto" in args:  # its search's footer was 173 characters
        assert "layouts: " in said and "with sp, pp with 1F1B and interleaved:2" in said
    elif "--layout" in args:  # its header was 145 and 164 characters
        assert "what the step waited for on each dimension (exposed)" in said and "1,024 sequences of 8,192" in said
    else:
        assert "# step terms: overlap_slowdown" in output and "per_bucket_us 0 us" in said
