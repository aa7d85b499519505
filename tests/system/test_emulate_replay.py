"""`commbench replay --emulate`: a user's trace replayed on an emulated cluster of this host (2 nodes of 1
rank, links limited by tc), issuing exactly the trace's calls; as root with iproute2 (else skipped)."""
import os
import shutil

import pytest
from conftest import DATA, commbench

from commbench.proxies.traces.files import read_traces
from commbench.results import read_records

DDP = [str(DATA / "traces" / f"ddp_2rank_gloo_rank{r}.json.gz") for r in (0, 1)]


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("tc") is None,
                    reason="needs root and iproute2 (network namespaces)")
def test_replay_on_an_emulated_cluster_issues_the_traced_calls(tmp_path):
    out = tmp_path / "r.jsonl"
    proc = commbench("replay", *DDP, "--emulate", "2x1", "--link", "1gbit", "--steps", "1", "--warmup-steps", "0",
                     "--json", str(out), timeout=300)
    assert proc.returncode == 0, proc.stderr
    (step,) = [r for r in read_records(str(out)) if r["record"] == "step"]
    traced = read_traces(DDP).ranks[0].steps[0].calls
    assert step["issued"] == [[c.collective, c.nbytes, c.dtype, list(c.group)] for c in traced]


def test_emulate_with_a_launcher_flag_is_refused_in_one_line():
    proc = commbench("replay", *DDP, "--emulate", "2x1", "--launcher", "spawn")
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
