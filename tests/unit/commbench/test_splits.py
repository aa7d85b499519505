"""alltoallv's per-peer counts (commbench/splits.py): uniform, skewed as MoE routing (seeded), a file."""
import json

import numpy as np
import pytest

from commbench import collectives as C
from commbench import splits


def test_uniform_is_no_weights_and_skewed_is_seeded_and_skewed():
    assert splits.weights("uniform", 4) == ()
    a, b, c = splits.weights("skewed", 8), splits.weights("skewed:1:0", 8), splits.weights("skewed:1:1", 8)
    assert a == b and a != c
    counts = np.array(C.apportion(a, 8, 8000))
    received = counts.sum(axis=0)
    assert received.max() > 3 * received.min()  # a popular expert gets several times a rare one's tokens
    flat = np.array(C.apportion(splits.weights("skewed:0", 8), 8, 8000)).sum(axis=0)
    assert flat.max() < 1.5 * flat.min()  # ALPHA 0: popularity alike, only the senders' noise


def test_a_file_of_weights(tmp_path):
    path = tmp_path / "w.json"
    path.write_text(json.dumps([[0, 1], [3, 1]]))
    assert C.apportion(splits.weights(str(path), 2), 2, 100) == ((0, 100), (75, 25))


@pytest.mark.parametrize("content,needle", [
    ("[[1, 2], [3]]", "2 rows of 2"), ("[[1, -1], [1, 1]]", "non-negative"), ("[[0, 0], [1, 1]]", "row of zeros"),
    ("import os", "readable JSON matrix"), ('[[1, true], [1, 1]]', "non-negative"),
])
def test_bad_files_are_one_line(tmp_path, content, needle):
    path = tmp_path / "w.json"
    path.write_text(content)
    with pytest.raises(splits.SplitsError, match=needle):
        splits.weights(str(path), 2)


@pytest.mark.parametrize("spec", ["skewed:x", "skewed:1:-2", "skewed:1:2:3", "skewed:nan", "nofile.json", "/dev/zero"])
def test_bad_specs_are_one_line(spec):
    with pytest.raises(splits.SplitsError, match="--splits"):
        splits.weights(spec, 4)


def test_huge_weights_are_shares_not_sums_past_a_float(tmp_path):
    """A splits file of 1e308s: each row is read as shares of its largest, so every sender still sends its
    whole buffer (the sum once overflowed to inf and the rows fell apart, failing both ranks)."""
    from commbench import collectives as C
    from commbench.splits import _from_file

    path = tmp_path / "big.json"
    path.write_text("[[1e308, 1e308], [1, 1]]")
    weights = _from_file(str(path), 2)
    plan = C.plan("alltoallv", 1024, C.resolve_dtype("float32"), 2, -1, weights)
    assert [sum(row) for row in plan.splits] == [256, 256] and plan.splits[0] == (128, 128)
