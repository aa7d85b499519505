"""Real multi-process sweeps over gloo: table, JSON Lines, CSV, checks, every collective."""
import csv

import pytest
from conftest import commbench, results_of


@pytest.fixture(scope="module")
def two_rank_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    proc = commbench("sweep", "-c", "all", "--sizes", "1K,33K", "--iters", "3", "--warmup", "1",
                     "--json", str(out / "r.jsonl"), "--csv", str(out / "r.csv"))
    return proc, out


def test_two_ranks_every_collective(two_rank_run):
    proc, out = two_rank_run
    assert proc.returncode == 0, proc.stderr
    results, records = results_of(out / "r.jsonl")
    assert records[0]["record"] == "header" and records[-1]["record"] == "summary"
    assert records[-1]["status"] == "ok" and records[-1]["points"] == len(results)
    # 7 collectives x 2 sizes x 2 placements + alltoall/sendrecv/alltoallv x 2 sizes out-of-place only
    assert len(results) == 7 * 2 * 2 + 3 * 2
    assert {r["collective"] for r in results} == {"allreduce", "allgather", "reduce_scatter", "broadcast", "reduce",
                                                  "alltoall", "sendrecv", "gather", "scatter", "alltoallv"}
    for r in results:
        assert r["wrong"] == 0 and r["iters"] == 3 and r["warmup"] == 1
        assert r["time_us"] > 0 and r["library"] == "gloo" and r["world_size"] == 2
        assert r["algbw_gbps"] == pytest.approx(r["nbytes"] / r["time_us"] / 1e3)
        assert r["min_us"] <= r["p50_us"] <= r["p90_us"] <= r["p99_us"] <= r["max_us"]


def test_header_records_the_environment(two_rank_run):
    _, out = two_rank_run
    header = results_of(out / "r.jsonl")[1][0]
    assert header["schema"] == 1 and header["launch"]["world_size"] == 2
    assert header["versions"]["torch"] and header["versions"]["python"]
    assert len(header["ranks"]) == 2 and header["hosts"]
    assert header["config"]["sizes"] == [1024, 33 * 1024]


def test_table_shows_sizes_actually_used(two_rank_run):
    proc, _ = two_rank_run
    lines = proc.stdout.splitlines()
    assert any("# Collective: allgather" in line for line in lines)
    rows = [line.split() for line in lines if line and not line.startswith("#")]
    rows = [row[:-1] if row[-1] == "~" else row for row in rows]  # the mark of a noisy point (p99 > 2 x p50)
    assert all(len(row) in (13, 9) for row in rows), rows
    assert ["1024", "256", "float", "sum", "-1"] == rows[0][:5]
    assert "N/A" in proc.stdout  # alltoall, sendrecv and alltoallv have no in-place column
    assert proc.stdout.count("# Out of bounds values : 0 OK") == 10  # every collective but hypercube


def test_csv_matches_json(two_rank_run):
    _, out = two_rank_run
    rows = list(csv.DictReader(open(out / "r.csv")))
    results, _ = results_of(out / "r.jsonl")
    assert [float(r["busbw_gbps"]) for r in rows] == pytest.approx([r["busbw_gbps"] for r in results])


@pytest.mark.parametrize("nprocs,dtype,op", [(3, "bfloat16", "max"), (4, "int8", "sum"), (3, "float16", "prod")])
def test_more_ranks_and_dtypes_check_clean(tmp_path, nprocs, dtype, op):
    proc = commbench("sweep", "-c", "all", "-N", str(nprocs), "--sizes", "1K,100K", "--dtype", dtype, "--op", op,
                     "--iters", "2", "--warmup", "1", "--json", str(tmp_path / "r.jsonl"))
    assert proc.returncode == 0, proc.stderr
    results, _ = results_of(tmp_path / "r.jsonl")
    assert results and all(r["wrong"] == 0 for r in results)
    allgather = [r for r in results if r["collective"] == "allgather"]
    assert allgather[0]["nbytes"] == (1024 // (nprocs * 2)) * nprocs * 2  # rounded down as nccl-tests does


def test_adaptive_iterations_and_rank_agg(tmp_path):
    proc = commbench("sweep", "--sizes", "1K", "--min-time", "0.05", "--rank-agg", "min", "--placement", "in-place",
                     "--json", str(tmp_path / "r.jsonl"))
    assert proc.returncode == 0, proc.stderr
    (result,), _ = results_of(tmp_path / "r.jsonl")
    assert 5 <= result["iters"] <= 1000 and result["warmup"] >= 2 and result["rank_agg"] == "min"
    assert result["placement"] == "in-place"


def test_too_small_sizes_are_skipped_with_a_note(tmp_path):
    proc = commbench("sweep", "-c", "allgather", "-N", "2", "--sizes", "4,8,1K", "--iters", "1", "--warmup", "0")
    assert proc.returncode == 0, proc.stderr
    assert "skipped 4 B" in proc.stdout
    assert proc.stdout.count("\n        ") >= 2  # 8 B and 1 KiB rows ran


def test_progress_is_silent_when_not_a_terminal(two_rank_run):
    proc, _ = two_rank_run
    assert "\r" not in proc.stderr


@pytest.mark.parametrize("backend", ["sim", "shm"])
def test_all_runs_what_the_backend_runs_and_names_what_it_leaves_out(tmp_path, backend):
    """-c all on a schedule backend: the six collectives it has algorithms for, and one line on stderr
    naming sendrecv, gather, scatter and alltoallv, which it has none for (before: exit 2, "no algorithm for alltoall";
    alltoall runs on them since its schedules, issue 34 item 6)."""
    path = tmp_path / "all.jsonl"
    proc = commbench("sweep", "--backend", backend, "-c", "all", "--sizes", "1K", "--iters", "2", "--warmup", "1",
                     "--json", str(path))
    assert proc.returncode == 0, proc.stderr
    results, _ = results_of(path)
    assert {r["collective"] for r in results} == {"allreduce", "allgather", "reduce_scatter", "broadcast", "reduce",
                                                  "alltoall"}
    notes = [line for line in proc.stderr.splitlines() if "-c all" in line]
    assert len(notes) == 1 and "leaves out sendrecv (" in notes[0] and "alltoall (" not in notes[0], proc.stderr
    assert all(f"{name} (" in notes[0] for name in ("gather", "scatter", "alltoallv"))  # no schedules for them


def test_all_with_an_algorithm_only_some_collectives_have_keeps_those(tmp_path):
    path = tmp_path / "all.jsonl"
    proc = commbench("sweep", "--backend", "sim", "-c", "all", "--algorithm", "binomial", "--sizes", "1K",
                     "--json", str(path))
    assert proc.returncode == 0, proc.stderr
    kept = {r["collective"] for r in results_of(path)[0]}
    assert kept and "allgather" not in kept and "-c all leaves out" in proc.stderr and "allgather" in proc.stderr
