"""`commbench report --stragglers` (issue 39): a rank stopped (SIGSTOP) for a moment during a real sweep
shows as the iterations that spiked, when it was stopped, with it the last to arrive; the JSON holds
what is printed."""
import json
import os
import signal
import subprocess
import sys
import time

from conftest import REPO

from commbench import cli

# A stop seen by every rank alike (rank 1 held inside a call before rank 0 had its data) is nobody's in the
# report; about half are. 8 stops: all 8 such 1 time in 256.
# a stop must stand out at --spike 20 (20x a point's median iteration) on a loaded host too: in a suite run at load 12
# none of eight 0.25 s stops was found; the likely cause (not measured): the median call grew past 1/20 of a stop
STOP_S, STOPS = 0.5, 8


def _rank_pid(parent: int, rank: int) -> int | None:
    """The spawned rank `rank` of the sweep `parent` started (its environment says RANK=)."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as stat, open(f"/proc/{pid}/environ", "rb") as environ:
                if int(stat.read().rsplit(")", 1)[1].split()[1]) == parent and \
                        f"RANK={rank}".encode() in environ.read().split(b"\0"):
                    return int(pid)
        except (OSError, ValueError, IndexError):
            continue
    return None


def test_a_rank_stopped_during_a_sweep_is_found(tmp_path, capsys):
    out = tmp_path / "stopped.jsonl"
    sweep = subprocess.Popen([sys.executable, "-m", "commbench", "sweep", "-c", "allreduce", "--placement",
                              "out-of-place", "--sizes", "1M", "--iters", "4000", "--warmup", "5", "--json", str(out)],
                             cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 240
        while not (out.exists() and out.stat().st_size) and sweep.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)  # the header: the ranks are up
        rank1 = _rank_pid(sweep.pid, 1)
        assert rank1, sweep.stderr.read().decode() if sweep.poll() is not None else "no rank 1"
        time.sleep(1.0)  # into the timed calls (4000 of a millisecond or more each)
        stops = []
        for _ in range(STOPS):
            stops.append(time.time())
            os.kill(rank1, signal.SIGSTOP)
            time.sleep(STOP_S)
            os.kill(rank1, signal.SIGCONT)
            time.sleep(0.25)
        assert sweep.wait(timeout=300) == 0
    finally:
        if sweep.poll() is None:
            sweep.kill()
    report = tmp_path / "stragglers.json"
    assert cli.main(["report", "--stragglers", str(out), "--spike", "20", "--json", str(report)]) == 0
    printed = capsys.readouterr().out
    point = json.loads(report.read_text())["points"][0]
    largest = [s for s in point["spikes"] if s["time_us"] > 0.5 * STOP_S * 1e6]
    assert STOPS <= len(largest) <= 2 * STOPS, largest  # each stop: one or two iterations (rank 1's, then rank 0's)
    # rank 1 held them up, or nobody can say (a stop that lands inside a call: both ranks time it alike); never
    # rank 0, which was never stopped (which of the two a stop lands in is the machine's timing, not asserted)
    assert {s["held_by"] for s in largest} - {None} <= {1}, largest
    for spike in largest:  # each began within a moment of a stop
        began = time.mktime(time.strptime(spike["at_utc"][:19], "%Y-%m-%dT%H:%M:%S")) - time.timezone
        assert min(abs(began + float(spike["at_utc"][19:-1]) - stop) for stop in stops) < 0.5, (spike, stops)
    assert "by rank 0" not in printed


def test_a_rank_count_that_is_not_a_whole_number_is_one_line(tmp_path, capsys):
    """A result's rank_times_us.ranks true (a bool is an int to Python): one line naming it, exit 2 (issue 48:
    a TypeError from numpy's reshape in report --stragglers)."""
    from commbench.results import pack_times

    point = {"record": "result", "kind": "measured", "collective": "allreduce", "backend": "shm", "library": "shm",
             "algorithm": "ring", "dtype": "float32", "op": "sum", "root": None, "placement": "in-place",
             "world_size": 2, "nnodes": 1, "count": 256, "nbytes": 1024, "time_us": 10.0, "busbw_gbps": 0.1,
             "wrong": 0, "rank_times_us": {"ranks": True, "times_us": pack_times([10.0] * 200)}}
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps(point) + "\n")
    assert cli.main(["report", "--stragglers", str(path)]) == 2
    err = capsys.readouterr().err
    assert err == f"commbench: error: {path}:1: result record: rank_times_us.ranks must be a whole number, at least " \
                  "1, not true\n"


def test_stragglers_options_are_checked(tmp_path, capsys):
    empty = tmp_path / "e.jsonl"
    empty.write_text("")
    assert cli.main(["report", "--stragglers", str(empty), "-o", str(tmp_path / "r")]) == 2
    assert "--stragglers prints its report" in capsys.readouterr().err
    assert cli.main(["report", str(empty)]) == 2
    assert "missing -o/--output" in capsys.readouterr().err
    assert cli.main(["report", "--stragglers", str(empty)]) == 2
    assert "no measured result records" in capsys.readouterr().err
