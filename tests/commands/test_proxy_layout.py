"""--nodes/--gpus-per-node and --topology on proxy: the two forms say the same, and values that
disagree (with each other or with --nprocs) are one line, exit 2."""
from __future__ import annotations

import pytest
from test_cli_layout import check_refused, check_the_two_forms_say_the_same

PROXY = ["proxy", "resnet50", "--backend", "sim", "--hw", "dgx-a100", "--tflops", "100"]


@pytest.mark.parametrize("extra, message", [
    (["-T", "4x8", "-N", "16"], "--topology 4x8 is 32 ranks but --nprocs 16"),
    (["--nodes", "3", "-N", "16"], "--nprocs 16 ranks do not fill --nodes 3 evenly"),
])
def test_disagreeing_values_are_one_line_and_exit_2(capsys, extra, message):
    check_refused(capsys, PROXY, extra, message)


def test_topology_is_nodes_and_gpus_per_node(capsys):
    check_the_two_forms_say_the_same(capsys, PROXY, "on 2x4 (8 ranks)")


def test_a_layout_in_predicted_mode_is_refused_not_dropped(capsys):
    """--hw with no ranks here predicts the data-parallel proxy's step, which has no layout: one line, pointing
    at predict-scaling --layout, instead of a prediction of plain DDP."""
    from commbench.cli import main

    code = main(["proxy", "llama-tiny", "--layout", "pp2,dp2", "--nodes", "1", "--gpus-per-node", "4",
                 "--hw", "dgx-h100", "--tflops", "100"])
    err = capsys.readouterr().err
    assert code == 2 and "predict-scaling llama-tiny --hw HW --gpus N --layout pp2,dp2" in err
    assert len(err.strip().splitlines()) == 1
