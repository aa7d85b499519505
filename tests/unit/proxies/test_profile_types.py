"""proxies/profile_types.py: what a profile derives from its tensors and units, and the file it saves to."""
import json

import pytest

from commbench.proxies.profile import load_profile
from commbench.proxies.profile_types import SCHEMA_VERSION, Profile, TensorSpec, TracedCompute, UnitSpec


def _profile(traced=None):
    # three tensors, their gradients ready last-registered first, as a backward pass readies them
    tensors = (TensorSpec("w0", (4, 3), "float32", 90.0, 2), TensorSpec("b0", (4,), "bfloat16", 60.0, 1),
               TensorSpec("w1", (2, 4), "float16", 30.0, 0))
    units = (UnitSpec("layer", (0, 1), 40.0, 80.0), UnitSpec("", (2,), 5.0, 10.0))
    return Profile("tiny", tensors, 45.0, 90.0, (3,), "samples", 2, units=units, traced=traced)


def test_sizes_order_and_shares_come_from_the_tensors():
    p = _profile()
    assert p.parameters == 12 + 4 + 8 and p.nbytes == 12 * 4 + 4 * 2 + 8 * 2
    assert p.unit_nbytes(p.units[0]) == 56 and p.unit_nbytes(p.units[1]) == 16
    assert p.ready_order() == [2, 1, 0]
    assert [p.ready_share(i) for i in p.ready_order()] == pytest.approx([1 / 3, 2 / 3, 1.0])
    assert p.compute_work() == (45.0, 90.0)


def test_a_traced_profile_shares_its_backward_by_time():
    traced = TracedCompute("cpu", 4, 100.0, 300.0, (300.0, 150.0, 30.0))
    p = _profile(traced)
    assert p.compute_work() == (100.0, 300.0)
    assert [p.ready_share(i) for i in range(3)] == pytest.approx([1.0, 0.5, 0.1])
    assert traced.times_us(8) == (800.0, 2400.0)
    assert Profile("idle", (), 0.0, 0.0, (1,), "samples", 1).ready_share(0) == 1.0  # no work: all done at once


def test_save_writes_a_row_per_tensor_and_reads_back_equal(tmp_path):
    p = _profile(TracedCompute("cpu", 4, 100.0, 300.0, (300.0, 150.0, 30.0)))
    path = tmp_path / "tiny.json"
    p.save(str(path))
    data = json.loads(path.read_text())
    assert data["schema"] == SCHEMA_VERSION and data["parameters"] == 24 and "transformer" not in data
    assert path.read_text().count('\n  ["') == len(p.tensors) + len(p.units)
    assert load_profile(str(path)) == p
