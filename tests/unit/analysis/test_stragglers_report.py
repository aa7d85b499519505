"""report --stragglers' reading (analysis/stragglers_report.py) on records built with one slow rank:
the rank the others wait for, its node, the iterations that spike and when."""
import time

import numpy as np
import pytest

from commbench.analysis import stragglers_report as S
from commbench.results import pack_times

HOSTS = ["node-a", "node-a", "node-b", "node-b"]


def _record(late_rank: int | None, iterations=40, late_us=50.0, spike_at=None, run_id="r1"):
    """4 ranks: a collective of 100 us that ends together; `late_rank` arrives late_us after the others
    in every iteration, so each other rank measures 100 + late_us and it measures 100."""
    rng = np.random.default_rng(1)
    matrix = 100 + rng.uniform(0, 1, size=(4, iterations))
    if late_rank is not None:
        matrix += late_us
        matrix[late_rank] -= late_us
    if spike_at is not None:
        matrix[:, spike_at] += 5000
        matrix[late_rank if late_rank is not None else 0, spike_at] -= 4000  # it arrived last in the spike too
    return {"record": "result", "kind": "measured", "run_id": run_id, "collective": "allreduce", "nbytes": 1024,
            "placement": "in-place", "dtype": "float32", "op": "sum", "world_size": 4,
            "iteration_times_us": pack_times(matrix.max(axis=0)), "timed_start": 1_800_000_000.0,
            "rank_times_us": {"ranks": 4, "times_us": pack_times(matrix.ravel())}}


def _header(run_id="r1"):
    return {"record": "header", "run_id": run_id, "ranks": [{"host": h} for h in HOSTS]}


@pytest.mark.parametrize("late", [0, 2, 3])
def test_the_rank_the_others_wait_for_and_its_node_are_found(late):
    found = S.report([_header(), _record(late)])
    point = found["points"][0]
    assert point["slowest_rank"]["rank"] == late and point["slowest_rank"]["host"] == HOSTS[late]
    assert point["slowest_rank"]["per_iteration_us"] == pytest.approx(50, abs=2)
    assert point["slowest_rank"]["share_of_waits"] > 0.9
    assert point["slowest_node"]["host"] == HOSTS[late]
    assert found["slowest_rank_counts"] == {str(late): 1}
    nodes = {n["host"]: n for n in found["nodes"]}
    assert nodes[HOSTS[late]]["slowest_in"] == 1 and nodes[HOSTS[late]]["caused_wait_us"] > 1000


def test_spikes_say_which_iteration_when_and_who_came_last():
    record = _record(1, spike_at=30)
    (spike,) = S.spikes(record, 3.0)
    assert spike.iteration == 30 and spike.time_us > 3 * 150 and spike.held_by == 1
    began = 1_800_000_000.0 + S.rank_times(record)[0, :30].sum() * 1e-6
    assert spike.at_utc == time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(began)) + f".{int(began % 1 * 1000):03d}Z"


def test_records_without_rank_times_give_spikes_only_and_bad_input_is_one_line():
    record = _record(None, spike_at=5)
    del record["rank_times_us"]
    point = S.report([record])["points"][0]
    assert point["slowest_rank"] is None and len(point["spikes"]) == 1 and point["spikes"][0]["held_by"] is None
    with pytest.raises(S.StragglerError, match="no measured result"):
        S.report([_header()])
    with pytest.raises(S.StragglerError, match="--spike 1"):
        S.report([record], 1.0)


def test_a_rank_held_up_inside_a_call_is_the_one_found():
    """Rank 2 stopped inside iteration 10 after its peers had their data: it measures 5 ms there while they
    finish; in iteration 11 they wait 5 ms for it. Both waits are rank 2's."""
    matrix = 100 + np.random.default_rng(3).uniform(0, 1, size=(4, 20))
    matrix[2, 10] += 5000
    matrix[[0, 1, 3], 11] += 5000
    culprit, spread = S.holdups(matrix)
    assert culprit[10] == culprit[11] == 2 and spread[10] > 4000
    assert S.caused_wait_us(matrix).argmax() == 2


def test_many_spikes_are_timed_from_one_running_sum():
    """issue 48: each spike's moment summed rank 0's times before it anew (800k iterations from a 7.5 KB file
    took 14.6 s, a crafted file minutes); the moments are the running sum of the times before each spike."""
    samples = np.tile([1000.0, 10000.0], 100_000)  # every other iteration a spike: 100,000 of them
    record = {"iteration_times_us": samples.tolist(), "timed_start": 1_700_000_000.0}
    found = S.spikes(record, factor=1.5)
    assert len(found) == 100_000 and [s.iteration for s in found[:2]] == [1, 3]
    last = found[-1]
    moment = 1_700_000_000.0 + samples[:last.iteration].sum() * 1e-6
    assert last.at_utc == time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(moment)) + f".{int(moment % 1 * 1000):03d}Z"
