"""Hardware files (costmodel/hardware.py): saved and loaded back equal, each problem one HardwareError."""
import json

import pytest

from commbench import costmodel as M
from commbench.topology import Link

NVLINK = Link("nvlink", bw_gbps=100.0, latency_us=2.0)
IB = Link("ib", bw_gbps=25.0, latency_us=5.0, links_per_node=1)
HW = M.Hardware("test", 8, NVLINK, IB)


def test_hardware_files(tmp_path):
    path = tmp_path / "hw.json"
    HW.save(str(path))
    assert M.load_hardware(str(path)) == M.Hardware("test", 8, NVLINK, IB, meta={})
    broken = json.loads(path.read_text())
    del broken["levels"]["inter"]["bw_gbps"]
    path.write_text(json.dumps(broken))
    with pytest.raises(M.HardwareError, match="levels.inter.bw_gbps"):
        M.load_hardware(str(path))
    with pytest.raises(M.HardwareError, match="no hardware file or preset 'nope'"):
        M.load_hardware("nope")
    broken["levels"]["inter"]["bw_gbps"] = -1
    path.write_text(json.dumps(broken))
    with pytest.raises(M.HardwareError, match="positive"):
        M.load_hardware(str(path))
