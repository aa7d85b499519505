"""benchmarks/shm_fused_knobs.py runs its memories end to end (no timing asserted): each variant gets a line,
and the /dev/shm segments its ranks made are gone afterwards."""
import glob
import subprocess
import sys

import pytest
from conftest import REPO

from commbench.backends.shm import native as shm_native

try:
    shm_native.load_built()
    NATIVE = True
except shm_native.NativeUnavailable:
    NATIVE = False


@pytest.mark.skipif(not NATIVE, reason="the native executor does not build here")
def test_every_memory_runs_and_leaves_no_segments():
    variants = ["copy:segpad", "fused:seg:block=1K,nt=4", "fused:segpad:block=1K,nt=1", "fused:seg2k:block=1K,nt=4",
                "fusedoop:seg2k:block=512,nt=4", "fused:shm:block=8K,nt=4"]
    proc = subprocess.Popen([sys.executable, str(REPO / "benchmarks" / "shm_fused_knobs.py"), "--size", "1M",
                             "--rounds", "2", "--reps", "1", *variants], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    for variant in variants:
        assert any(line.startswith(variant + " ") for line in out.splitlines()), (variant, out)
    assert not glob.glob(f"/dev/shm/cb_knobs_{proc.pid}_*"), "segments left behind"
