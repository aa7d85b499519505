"""The before/after chart of `commbench compare`: its band is exactly where compare calls no change,
and it is drawn from compare --plot and from `commbench report` of compare --json's file."""
from __future__ import annotations

import pytest
from test_compare import result, run, write

from commbench.analysis import compare as K
from commbench.analysis.report_compare import no_change_band, plot_compare

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("metric", ["busbw", "time"])
@pytest.mark.parametrize("noise", [0.0, 0.5, 3.0])  # p90 over p50: 0%, 50% and 300% noise
def test_the_band_holds_exactly_the_values_compare_calls_no_change(metric, noise):
    base = [result(1 << 20, 10.0, p50_us=100.0, p90_us=100.0 * (1 + noise))]
    for new_busbw in (2.0, 6.0, 9.6, 10.4, 14.0, 20.0, 50.0):
        comparison = K.compare([base[0].to_dict()], [result(1 << 20, new_busbw).to_dict()], metric, 5.0)
        (point,) = comparison.points
        record = K.to_record(point, comparison).to_dict()
        low, high = no_change_band(record)
        inside = low <= record["new"] <= high
        assert inside == (point.verdict in ("same", "within noise")), (new_busbw, point.verdict, low, high)


def test_compare_plot_and_report_draw_the_chart(tmp_path, capsys):
    sizes = (1024, 1 << 16, 1 << 20)
    base = write(tmp_path / "base.jsonl", [result(n, 10.0, p50_us=10.0, p90_us=11.0) for n in sizes])
    new = write(tmp_path / "new.jsonl", [result(n, b, p50_us=10.0, p90_us=11.0) for n, b in zip(sizes, (5, 10, 20))])
    code, out, _ = run(capsys, "compare", base, new, "--plot", tmp_path / "ba.png", "--json", tmp_path / "c.jsonl")
    assert code == 1 and "# wrote" in out  # one regression: exit 1, the chart written all the same
    assert (tmp_path / "ba.png").read_bytes()[:8] == PNG
    code, out, _ = run(capsys, "report", tmp_path / "c.jsonl", "-o", tmp_path / "rep")
    assert code == 0 and (tmp_path / "rep" / "compare.png").read_bytes()[:8] == PNG
    assert plot_compare([], str(tmp_path)) is None


def test_a_plot_that_is_not_a_png_is_refused(tmp_path, capsys):
    base = write(tmp_path / "base.jsonl", [result(1024, 10.0)])
    code, _, err = run(capsys, "compare", base, base, "--plot", tmp_path / "c.pdf")
    assert code == 2 and err.strip().splitlines() == [f"commbench: error: --plot {tmp_path / 'c.pdf'}: the chart is "
                                                      f"a PNG; give a file name ending in .png"]
    assert not (tmp_path / "c.pdf").exists()
