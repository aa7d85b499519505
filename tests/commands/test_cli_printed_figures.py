"""Every figure a sweep, a proxy and a check print is found again in their JSON, to the digits
printed, and the JSON's figures are the statistics of the raw samples it keeps: what a reader sees
is what a script reads (issue 25). Real runs, so nothing here asserts a time, only agreement."""
from __future__ import annotations

import json
import re

import numpy as np
import pytest
from conftest import commbench

from commbench.results import raw_times, read_records


def close(printed: str, value: float) -> bool:
    """`printed` is `value` to the digits shown (half a unit of its last digit)."""
    decimals = len(printed.split(".")[1]) if "." in printed else 0
    return abs(float(printed) - value) <= 0.5 * 10 ** -decimals * (1 + 1e-9) + 1e-12


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("figures")
    paths = {name: folder / f"{name}.jsonl" for name in ("sweep", "proxy", "check")}
    hw = folder / "hw.json"
    sweep = commbench("sweep", "--sizes", "1K-64K", "-f", "4", "--iters", "12", "--warmup", "2", "--stat", "p50",
                      "--json", str(paths["sweep"]))
    assert sweep.returncode == 0, sweep.stderr
    fit = commbench("fit", str(paths["sweep"]), "-o", str(hw), "--accept-poor-fit")
    assert fit.returncode == 0, fit.stderr
    proxy = commbench("proxy", "tts_angular", "--nprocs", "2", "--batch", "1", "--compute", "flops", "--tflops", "0.05",
                      "--steps", "3", "--warmup-steps", "1", "--json", str(paths["proxy"]))
    assert proxy.returncode == 0, proxy.stderr
    check = commbench("check", str(paths["sweep"]), str(paths["proxy"]), "--hw", str(hw), "--json", str(paths["check"]))
    assert check.returncode == 0, check.stderr
    return {"sweep": (sweep.stdout, paths["sweep"]), "proxy": (proxy.stdout, paths["proxy"]),
            "check": (check.stdout, paths["check"], paths["sweep"], paths["proxy"])}


def test_every_figure_of_the_sweep_table_is_in_its_records(runs):
    stdout, path = runs["sweep"]
    records = read_records(str(path))
    results = {(r["nbytes"], r["placement"]): r for r in records if r["record"] == "result"}
    summary = records[-1]
    rows = [line.split() for line in stdout.splitlines() if line.strip() and not line.startswith("#")]
    assert len(rows) == 4 and len(results) == 8
    for row in rows:
        nbytes, count = int(row[0]), int(row[1])
        for offset, placement in ((5, "out-of-place"), (9, "in-place")):
            r = results[(nbytes, placement)]
            time_text, algbw, busbw, wrong = row[offset:offset + 4]
            assert r["count"] == count and r["stat"] == "p50" and r["iters"] == 12
            assert close(time_text, r["time_us"]) and close(algbw, r["algbw_gbps"]) and close(busbw, r["busbw_gbps"])
            assert int(wrong) == r["wrong"]
            samples = raw_times(r)  # the printed time is the statistic of the samples the record keeps
            assert r["time_us"] == pytest.approx(np.median(samples), rel=1e-12)
            assert r["mean_us"] == pytest.approx(samples.mean(), rel=1e-12)
            assert (r["min_us"], r["max_us"]) == (samples.min(), samples.max())
        assert (row[-1] == "~") == any(r["p99_us"] > 2 * r["p50_us"] for (n, _), r in results.items() if n == nbytes)
    footer = re.search(r"# Avg bus bandwidth    : (\S+) GB/s \(busbw of the p50 times\)", stdout)
    average = np.mean([r["busbw_gbps"] for r in results.values()])
    assert footer and float(footer.group(1)) == pytest.approx(average, rel=1e-3)
    assert summary["record"] == "summary" and summary["stat"] == "p50"
    assert summary["avg_busbw_gbps"] == pytest.approx(average, rel=1e-12)
    assert "12 iterations, time = p50 of the iterations, each iteration the slowest rank's" in stdout


def test_every_figure_of_the_proxy_table_is_in_its_records(runs):
    stdout, path = runs["proxy"]
    assert "DDP's own work" not in stdout  # --compute flops has no DDP term: the header does not print a 0.00
    records = read_records(str(path))
    steps = {r["step"]: r for r in records if r["record"] == "step"}
    summary = next(r for r in records if r["record"] == "proxy")
    names = ("compute_us", "comm_us", "exposed_comm_us", "other_us", "step_us")
    printed = [line.split() for line in stdout.splitlines() if re.match(r"^\s+\d+\s", line)]
    assert [int(row[0]) for row in printed] == sorted(steps) == [1, 2, 3, 4]
    for row in printed:
        step = steps[int(row[0])]
        assert all(close(text, step[name] / 1e3) for text, name in zip(row[1:6], names))
        assert close(row[6], step["samples_per_s"]) and step["warmup"] == ("(warm-up)" in " ".join(row))
    median = next(line.split()[2:] for line in stdout.splitlines() if line.startswith("# median"))
    p90 = next(line.split()[2:] for line in stdout.splitlines() if line.startswith("# p90"))
    assert all(close(text, summary[f"{name}_p50"] / 1e3) for text, name in zip(median, names))
    assert close(median[5], summary["samples_per_s"])
    assert all(close(text, summary[f"{name}_p90"] / 1e3) for text, name in zip(p90, names))
    measured = [steps[s] for s in steps if not steps[s]["warmup"]]
    for name in names:  # the summary is the statistics of the step records it follows
        assert summary[f"{name}_p50"] == pytest.approx(np.median([s[name] for s in measured]), rel=1e-9)


def test_every_figure_of_check_is_in_its_records_and_the_runs(runs):
    stdout, path, sweep_path, proxy_path = runs["check"]
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    rows, summary = [x for x in lines if x["record"] == "check"], lines[-1]
    printed = [line for line in stdout.splitlines() if line.strip() and not line.startswith("#")]
    assert len(printed) == len(rows) > 0
    for line, row in zip(printed, rows):
        numbers = re.findall(r"(-?\d+\.\d+)\s*(us|ms|s|%)", line[line.index(row["what"]) + len(row["what"]):])
        (measured, m_unit), (predicted, p_unit), (error, _) = numbers[:3]
        scale = {"us": 1.0, "ms": 1e3, "s": 1e6}  # each time printed with its unit (a step in ms, a point in us)
        assert close(measured, row["measured_us"] / scale[m_unit])
        assert close(predicted, row["predicted_us"] / scale[p_unit])
        assert close(error, 100 * row["error"])
    results = {f"{r['collective']} {r['nbytes'] // 1024}KiB {r['placement']}": r
               for r in read_records(str(sweep_path)) if r["record"] == "result"}
    proxy = next(r for r in read_records(str(proxy_path)) if r["record"] == "proxy")
    for row in rows:  # check's measured figure is the run's own printed one
        expected = results[row["what"]]["time_us"] if row["kind"] == "sweep" else \
            proxy["step_us_p50" if row["what"] == "step" else "comm_us_p50"]
        assert row["measured_us"] == pytest.approx(expected, rel=1e-12)
    for key, label in (("all", "all rows"), ("proxy_steps", "proxy steps")):
        found = re.search(rf"# {label}\s+(\d+) row\(s\): median \|error\| (\S+)%, max (\S+)%", stdout)
        part = summary[key]
        assert found and int(found.group(1)) == part["rows"]
        assert close(found.group(2), 100 * part["median_abs_error"])
        assert close(found.group(3), 100 * part["max_abs_error"])


def test_each_collectives_footer_is_in_the_summary(tmp_path, capsys):
    """With several collectives the summary's avg_busbw_gbps was the mean over all of them, a figure no line on
    screen shows (issue 32, item 11): each footer's figure is in avg_busbw_gbps_by_collective."""
    from commbench import cli

    path = tmp_path / "r.jsonl"
    assert cli.main(["sweep", "--backend", "sim", "--hw", "dgx-a100", "-N", "4", "-c", "allreduce,allgather,broadcast",
                     "--sizes", "1K,1M", "--json", str(path)]) == 0
    out = capsys.readouterr().out
    footers = dict(re.findall(r"# Collective: (\w+).*?# Avg bus bandwidth    : (\S+) GB/s", out, re.S))
    records = read_records(str(path))
    summary = records[-1]
    assert list(summary["avg_busbw_gbps_by_collective"]) == list(footers) == ["allreduce", "allgather", "broadcast"]
    for name, printed in footers.items():
        assert float(printed) == pytest.approx(summary["avg_busbw_gbps_by_collective"][name], rel=1e-3)
    every = [r["busbw_gbps"] for r in records if r["record"] == "result"]
    assert summary["avg_busbw_gbps"] == pytest.approx(np.mean(every), rel=1e-12)  # the run's, as documented


def test_an_untimed_run_writes_null_not_zero(tmp_path, capsys):
    """The sim backend without --hw prints n/m and wrote avg_busbw_gbps 0.0, a figure that was never measured."""
    from commbench import cli

    path = tmp_path / "r.jsonl"
    assert cli.main(["sweep", "--backend", "sim", "--sizes", "1K", "--json", str(path)]) == 0
    assert "# Avg bus bandwidth    : n/m" in capsys.readouterr().out
    summary = read_records(str(path))[-1]
    assert summary["avg_busbw_gbps"] is None and summary["avg_busbw_gbps_by_collective"] == {"allreduce": None}
