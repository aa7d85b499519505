"""--nodes/--gpus-per-node and --topology on sweep, which runs ranks: the two forms say the same, and
values that disagree (with each other or with --nprocs) are one line, exit 2."""
from __future__ import annotations

import pytest
from test_cli_layout import check_refused, check_the_two_forms_say_the_same

SWEEP = ["sweep", "--backend", "sim", "--hw", "dgx-a100", "--sizes", "1K", "--placement", "in-place"]


@pytest.mark.parametrize("command, says", [(SWEEP, "topology 2x4), 8 ranks")])
def test_the_two_forms_say_the_same(capsys, command, says):
    check_the_two_forms_say_the_same(capsys, command, says)


@pytest.mark.parametrize("command, extra, message", [
    (SWEEP, ["--nodes", "2", "--gpus-per-node", "2", "-N", "3"], "--nodes 2 --gpus-per-node 2 is 4 ranks but "
                                                                 "--nprocs 3"),
    (SWEEP, ["-T", "2x2", "--nodes", "3"], "--topology 2x2 and --nodes 3 disagree"),
])
def test_disagreeing_values_are_one_line_and_exit_2(capsys, command, extra, message):
    check_refused(capsys, command, extra, message)


def test_a_library_backend_takes_the_layout_as_its_rank_count(tmp_path):
    """torch (gloo) lays out its own ranks: the layout says how many, and is not refused as an
    algorithm option (it was, for the default backend)."""
    from conftest import commbench, results_of

    out = commbench("sweep", "--nodes", "1", "--gpus-per-node", "2", "--sizes", "1K", "--iters", "2", "--warmup", "0",
                    "--json", str(tmp_path / "t.jsonl"))
    assert out.returncode == 0, out.stderr
    results, _ = results_of(tmp_path / "t.jsonl")
    assert results and all(r["world_size"] == 2 and r["backend"] == "torch" for r in results)
