"""What a fit reads of a results file (analysis/fit_points.py): the usable points, the setup they ran, one
setup's points chosen, and a point no schedule models named in one FitError."""
import pytest

from commbench.analysis import fit_points as P


def _result(**fields) -> dict:
    record = {"record": "result", "kind": "measured", "collective": "allreduce", "backend": "shm", "library": "shm",
              "algorithm": "ring", "dtype": "float32", "placement": "in-place", "world_size": 2, "nnodes": 1,
              "count": 256, "nbytes": 1024, "time_us": 10.0, "wrong": 0, "root": None}
    return {**record, **fields}


def test_usable_points_are_measured_clean_and_in_place_where_the_collective_has_it():
    kept = _result()
    records = [kept, _result(placement="out-of-place"), _result(wrong=3), _result(kind="predicted"),
               _result(time_us=None), {"record": "header"}, _result(collective="alltoall", placement="out-of-place")]
    assert P.usable(records) == [kept, records[-1]]  # alltoall ran out of place only: its points stay


def test_a_fit_takes_one_backends_points_or_says_which_to_choose():
    shm, ring = _result(), _result(backend="torch", library="gloo", algorithm=None)
    assert P.setup_of(shm) == "shm/shm/ring" and P.setup_of(ring) == "torch/gloo/-"
    with pytest.raises(P.FitError, match="several setups: .*choose one with --setup"):
        P.select([shm, ring], None)
    assert P.select([shm, ring], "torch/gloo") == [ring]
    with pytest.raises(P.FitError, match="no measured points for setup 'nccl'"):
        P.select([shm, ring], "nccl")
    assert P.setups_name([shm, _result(algorithm="tree")]) == "shm/shm/ring+tree"


def test_each_point_becomes_its_schedules_features_or_one_error_naming_it():
    (point,) = P.points([_result()])
    assert point.features[0] == 1.0 and point.features[1] > 0 and point.features[3] > 0  # intra rounds and bytes
    assert point.features[2] == point.features[4] == 0  # one node: nothing crosses nodes
    with pytest.raises(P.FitError, match="has no count"):
        P.schedule_for(_result(count=None))
