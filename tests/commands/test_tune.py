"""`commbench tune` writes a tuning table from paired sweeps; sweep --tuning follows it, and each
record says which table chose its algorithm (issue 36). Run on sim and on shm, here on the CPU."""
import json
import subprocess
import sys

import pytest
from conftest import clean_env, commbench, results_of


def _tune(tmp_path, backend, *args):
    out = tmp_path / f"{backend}.json"
    proc = commbench("tune", "--backend", backend, "--rounds", "2", "-o", str(out), *args, timeout=400)
    assert proc.returncode == 0, proc.stderr
    return json.loads(out.read_text()), proc.stdout


def test_tune_on_sim_writes_the_model_fastest_and_sweep_follows_it(tmp_path):
    table, printed = _tune(tmp_path, "sim", "-N", "4", "--hw", "dgx-h100", "--sizes", "1K,16M",
                           "--algorithms", "ring,oneshot,rhd")
    assert table["backend"] == "sim" and "2 paired round(s)" in table["source"]
    by_size = {row["up_to_nbytes"]: row["algorithm"] for row in table["rows"]}
    assert by_size == {1024: "oneshot", None: "rhd"}, table  # the cost model ranks them, deterministically
    assert "winner" in printed and "rule's" in printed
    path = tmp_path / "swept.jsonl"
    proc = commbench("sweep", "--backend", "sim", "-N", "4", "--hw", "dgx-h100", "--sizes", "1K,16M",
                     "--tuning", str(tmp_path / "sim.json"), "--json", str(path))
    assert proc.returncode == 0, proc.stderr
    results, _ = results_of(path)
    assert {r["tuning"] for r in results} == {table["name"]}
    chosen = {r["nbytes"]: r["algorithm"] for r in results}
    assert chosen[1024] == by_size.get(1024, table["rows"][0]["algorithm"]) and chosen[16 << 20] == \
        table["rows"][-1]["algorithm"]


def test_tune_on_shm_two_ranks(tmp_path):
    table, _ = _tune(tmp_path, "shm", "-N", "2", "--sizes", "1K,64K", "--algorithms", "ring,oneshot",
                     "--iters", "5", "--warmup", "1")
    assert table["library"] == "shm" and {r["algorithm"] for r in table["rows"]} <= {"ring", "oneshot"}
    assert table["rows"][-1]["up_to_nbytes"] is None and all(r["world"] == 2 for r in table["rows"])


@pytest.mark.skipif(sys.version_info < (3, 11), reason="the parent needs python -P (3.11) to keep the cwd off its path")
def test_tune_starts_its_sweeps_as_the_ranks_start(tmp_path):
    """A `uuid.py` (and other standard-library names a sweep imports) where the user runs tune does not run
    in tune's sweeps (issue 48: they started as `python -m commbench`, which puts the cwd first). The parent
    runs with -P here, as the `commbench` script keeps the cwd off its path, so that only tune's children
    are tested."""
    work, marker = tmp_path / "work", tmp_path / "ran"
    work.mkdir()
    for name in ("uuid", "selectors", "secrets"):
        (work / f"{name}.py").write_text(f"open({str(marker)!r}, 'a').write({name!r} + '\\n')\n")
    proc = subprocess.run([sys.executable, "-P", "-m", "commbench", "tune", "-b", "sim", "--hw", "dgx-h100",
                           "-T", "1x2", "-s", "1K", "--algorithms", "ring,oneshot", "--rounds", "1",
                           "-o", str(tmp_path / "t.json")],
                          cwd=work, capture_output=True, text=True, timeout=180, env=clean_env())
    assert not marker.exists(), marker.read_text()
    assert proc.returncode == 0, proc.stderr
    assert json.loads((tmp_path / "t.json").read_text())["rows"]


def test_without_a_file_the_shipped_table_or_the_rule_says_it_chose(tmp_path):
    path = tmp_path / "r.jsonl"
    proc = commbench("sweep", "--backend", "sim", "-N", "3", "--sizes", "1K", "--json", str(path))
    assert proc.returncode == 0, proc.stderr
    assert {r["tuning"] for r in results_of(path)[0]} == {"rule"}  # no table is shipped for sim


@pytest.mark.parametrize("args,message", [
    (["tune", "--backend", "torch", "-o", "x.json"], "runs a library's algorithms"),
    (["tune", "--backend", "sim", "--algorithms", "nonesuch", "-o", "x.json"], "--algorithms nonesuch"),
    (["sweep", "--backend", "torch", "--tuning", "t.json"], "--tuning chooses among commbench's own algorithms"),
    (["sweep", "--backend", "shm", "--tuning", "missing.json"], "--tuning missing.json: cannot read it"),
])
def test_bad_requests_are_one_line(tmp_path, args, message):
    proc = commbench(*args, cwd=tmp_path)
    assert proc.returncode == 2 and message in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr


def test_every_option_of_tune_is_a_field_of_its_options_value():
    """tune reads one frozen TuneOptions built from click (issue 33), not a dict of options: a click option
    without its field (or a field without its option) would fail here, before any sweep runs."""
    import dataclasses

    from commbench.commands.tune import TuneOptions, tune_command

    params = {p.name for p in tune_command.params}
    assert params == {f.name for f in dataclasses.fields(TuneOptions)}
    with pytest.raises(dataclasses.FrozenInstanceError):
        TuneOptions(**{name: None for name in params}).rounds = 3


def test_timeout_bounds_the_whole_tune_and_keeps_what_it_measured(tmp_path):
    """issue 48: `--rounds 100` ran for minutes and `--timeout` bounded each sweep alone. Now the tune stops at
    its --timeout (exit 3), the table from the rounds it completed, every sweep's records kept, and each sweep
    said on stderr as it starts."""
    out, kept = tmp_path / "t.json", tmp_path / "t.jsonl"
    proc = commbench("tune", "-b", "sim", "--hw", "dgx-h100", "-T", "1x2", "-s", "1K", "--algorithms",
                     "ring,oneshot", "--rounds", "100", "--timeout", "15", "-o", str(out), "--json", str(kept),
                     timeout=180)
    assert proc.returncode == 3, proc.stderr
    assert "# tune: sweep 1 of 200: round 1, ring" in proc.stderr and "s left" in proc.stderr
    assert kept.exists() and results_of(kept)[0]
    if out.exists():  # at least one round ended: the table says how many it is from
        rounds = int(json.loads(out.read_text())["source"].split(" paired round(s)")[0].rsplit(" ", 1)[1])
        assert 1 <= rounds < 100 and f"reached after {rounds} of 100 round(s)" in proc.stderr
    else:
        assert "before one round of 2 sweeps ended: no table written" in proc.stderr
