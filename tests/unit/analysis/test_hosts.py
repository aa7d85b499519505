"""Where a run's ranks ran: a busy host named from its header (the rest of analysis/hosts.py:
unit/analysis/test_fit_oversubscribed.py, system/test_launchers.py)."""
import json

from conftest import REPO, commbench


def _header(load, cpus=2):
    return {"record": "header", "run_id": "r", "ranks": [{"host": "vm", "device": "cpu", "cpus": cpus,
                                                          "load_average": load}] * 2}


def test_a_busy_host_is_named_and_a_quiet_one_or_an_old_header_is_not():
    from commbench.analysis.hosts import busy_hosts

    assert busy_hosts([_header(5.0)]) == "load average 5.0 on 2 cores"
    assert busy_hosts([_header(1.2), _header(9.0, cpus=16)]) is None
    assert busy_hosts([_header(None), {"record": "header", "ranks": "x"}, _header(True)]) is None
    assert busy_hosts([_header(4.0), _header(12.0, cpus=4)]) == "load average 12.0 on 4 cores"


def test_a_fit_of_runs_on_a_busy_host_says_so_and_so_does_every_use(tmp_path):
    """issue 48 item 5: the README's fit on a host at load 5 gave overlap_slowdown 9.17 with no word."""

    source = REPO / "tests" / "data" / "shm_2rank_loaded_refit_without_byte_cost.jsonl"
    lines = source.read_text().splitlines()
    header = json.loads(lines[0])
    for rank in header["ranks"]:
        rank["load_average"] = 5.0
    sweep = tmp_path / "busy.jsonl"
    sweep.write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")
    fit = commbench("fit", str(sweep), "-o", str(tmp_path / "hw.json"), "--accept-poor-fit")
    assert fit.returncode == 0, fit.stderr
    assert "measured under load (load average 5.0 on 2 cores)" in fit.stderr
    assert json.loads((tmp_path / "hw.json").read_text())["meta"]["fitted_under_load"] == "load average 5.0 on 2 cores"
    used = commbench("predict", "--hw", str(tmp_path / "hw.json"), "-s", "1K", "-T", "1x2")
    assert used.returncode == 0 and "fitted from runs under load" in used.stderr, used.stderr
