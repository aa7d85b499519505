"""Measured compute kept for the next run of the same model, batch and setup: read back only as written, and a
second proxy run skips the measuring (issue 48 item 8: 295 of 451 s measuring, every run)."""
import json

import pytest
from conftest import commbench

from commbench.proxies import compute_cache as C


def test_figures_round_trip_and_anything_else_is_ignored(tmp_path, monkeypatch):
    monkeypatch.setenv("COMMBENCH_CACHE_DIR", str(tmp_path))
    assert C.read("m") is None
    C.write("m", (1.0, 2.0, 3.0, 0.5), True)
    values, cpu_time, when = C.read("m")
    assert values == [1.0, 2.0, 3.0, 0.5] and cpu_time and "UTC" in when
    for bad in ('{"forward_us": "1"}', "[1, 2]", "not json", json.dumps({f: float("nan") for f in C.FIELDS}),
                json.dumps({f: -1 for f in C.FIELDS}), json.dumps({f: True for f in C.FIELDS})):
        C.path_of("m").write_text(bad)
        assert C.read("m") is None, bad


def test_the_key_holds_what_the_figures_depend_on():
    pytest.importorskip("torch")
    from commbench.proxies.profile import load_profile
    from commbench.proxies.setups import settle

    tiny, ddp = load_profile("llama-tiny"), settle("ddp")
    one = C.key(tiny, 4, "cpu", False, ddp, 2, host="h")
    assert one == C.key(tiny, 4, "cpu", False, ddp, 2, host="h")
    others = {C.key(tiny, 8, "cpu", False, ddp, 2, host="h"), C.key(tiny, 4, "cuda", False, ddp, 2, host="h"),
              C.key(tiny, 4, "cpu", True, ddp, 2, host="h"),
              C.key(tiny, 4, "cpu", False, settle("fsdp-full"), 2, host="h"),
              C.key(tiny, 4, "cpu", False, ddp, 4, host="h"), C.key(tiny, 4, "cpu", False, ddp, 2, host="other"),
              C.key(load_profile("resnet18"), 4, "cpu", False, ddp, 2, host="h")}
    assert one not in others and len(others) == 7


def test_a_second_run_reads_the_first_ones_figures(tmp_path):
    from conftest import clean_env

    env = {**clean_env(), "COMMBENCH_CACHE_DIR": str(tmp_path)}
    args = ("proxy", "llama-tiny", "-N", "1", "--batch", "1", "--steps", "1", "--warmup-steps", "1")
    first = commbench(*args, env=env, timeout=240)
    assert first.returncode == 0, first.stderr
    assert "# measuring llama-tiny's compute here first" in first.stdout
    second = commbench(*args, env=env, timeout=240)
    assert second.returncode == 0 and "as measured here before" in second.stdout, second.stdout
    again = commbench(*args, "--remeasure", env=env, timeout=240)
    assert "# measuring llama-tiny's compute here first" in again.stdout
