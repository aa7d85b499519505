"""One way to say the scale: --nodes N --gpus-per-node G, or --topology NxG, on sweep, predict, proxy and
predict-scaling alike; values that disagree are one line and exit 2, never a silent pick."""
from __future__ import annotations

import pytest

from commbench.cli import main

PREDICT = ["predict", "--hw", "dgx-a100", "--sizes", "1M"]
SCALING = ["predict-scaling", "resnet50", "--hw", "dgx-a100", "--tflops", "100"]


def run(capsys, *args):
    try:
        code = main(list(args))
    except SystemExit as exc:  # click's own exits
        code = exc.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def first_line(out: str) -> str:
    return next(line for line in out.splitlines() if line.startswith("# "))


def check_the_two_forms_say_the_same(capsys, command, says):
    short = run(capsys, *command, "--topology", "2x4")
    long = run(capsys, *command, "--nodes", "2", "--gpus-per-node", "4")
    both = run(capsys, *command, "-T", "2x4", "--nodes", "2", "--gpus-per-node", "4")  # agreeing: fine
    assert short[0] == long[0] == both[0] == 0, (short[2], long[2], both[2])
    assert says in first_line(short[1]) and first_line(short[1]) == first_line(long[1]) == first_line(both[1])


def test_predict_says_the_scale_either_way(capsys):
    check_the_two_forms_say_the_same(capsys, PREDICT, "on 2x4 (8 ranks)")


def test_predict_scaling_takes_nodes_lists_and_the_short_form(capsys):
    code, out, err = run(capsys, *SCALING, "--nodes", "1,2,4", "--gpus-per-node", "4")
    assert code == 0, err
    rows = [line.split() for line in out.splitlines() if line.startswith("  ")]
    assert [(int(r[1]), int(r[2])) for r in rows] == [(4, 1), (8, 2), (16, 4)]  # (gpus, nodes)
    code, out, err = run(capsys, *SCALING, "-T", "2x4")
    assert code == 0 and [line.split()[1:3] for line in out.splitlines() if line.startswith("  ")] == [["8", "2"]]


def test_predict_fills_a_node_from_the_hardware(capsys):
    code, out, _ = run(capsys, *PREDICT, "--nodes", "4")
    assert code == 0 and "on 4x8 (32 ranks)" in first_line(out)  # dgx-a100: 8 GPUs a node
    code, _, err = run(capsys, *PREDICT)
    assert code == 2 and err.strip() == ("commbench: error: give the scale to predict: --topology NODESxRANKS, or "
                                         "--nodes N --gpus-per-node G")


@pytest.mark.parametrize("command, extra, message", [
    (PREDICT, ["-T", "2x4", "--nodes", "3"], "--topology 2x4 and --nodes 3 disagree"),
    (PREDICT, ["-T", "2x4", "--gpus-per-node", "8"], "--topology 2x4 and --gpus-per-node 8 disagree"),
    (PREDICT, ["-T", "2y4"], "bad --topology '2y4': expected NODESxRANKS"),
    (PREDICT, ["--nodes", "0"], "--nodes 0: must be at least 1"),
    (SCALING, ["-T", "2x4", "--gpus", "8"], "--gpus and --topology both say the scale"),
    (SCALING, ["--nodes", "1,2", "--gpus", "8"], "--gpus and --nodes both say the scale"),
    (SCALING, ["--nodes", "1,2", "-T", "2x4"], "--topology 2x4 and --nodes 1,2 disagree"),
    (SCALING, ["--nodes", "1,x"], "--nodes '1,x': expected a comma list of node counts"),
])
def test_disagreeing_values_are_one_line_and_exit_2(capsys, command, extra, message):
    check_refused(capsys, command, extra, message)


def check_refused(capsys, command, extra, message):
    code, out, err = run(capsys, *command, *extra)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("commbench: error: ") and message in lines[0], err
    assert "Traceback" not in err
