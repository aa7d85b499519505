"""p2p backend: commbench's schedules over torch isend/irecv between real gloo processes.

Each sweep is a real multi-process run (a few seconds each), so every run covers
several things at once: every algorithm, 2/3/4 ranks, a 2x2 topology, root != 0,
uneven chunks (255 elements on 3 ranks), non-float32 dtypes and ops other than sum.
"""
import pytest
from conftest import commbench, results_of

ITERS = ("--iters", "2", "--warmup", "1")
FIVE = "allreduce,allgather,reduce_scatter,broadcast,reduce"
ONLY = {"allgather": "ring", "reduce_scatter": "ring", "broadcast": "chain", "reduce": "chain"}


def auto(big: str):
    """What `auto` picks: one-shot allreduce up to 64 KiB, `big` above; the only algorithm elsewhere."""
    return lambda r: ("oneshot" if r["requested_nbytes"] <= 64 << 10 else big) if r["collective"] == "allreduce" \
        else ONLY[r["collective"]]


# name: (ranks, arguments, sizes, the algorithm each record must name)
RUNS = {
    "tree-2-float32-sum": (2, ["-c", "allreduce", "-A", "tree"], "100K", lambda r: "tree"),
    "rhd-3-int32-max": (3, ["-c", "allreduce", "-A", "rhd", "-d", "int32", "-o", "max"], "1K", lambda r: "rhd"),
    "auto-3-int32-min-root1": (3, ["-c", FIVE, "-d", "int32", "-o", "min", "--root", "1"], "1K,100K", auto("ring")),
    "hier-2x2-bfloat16-avg-root3": (4, ["-c", FIVE, "-T", "2x2", "-d", "bfloat16", "-o", "avg", "--root", "3"],
                                    "100K", auto("hier")),
}


@pytest.mark.parametrize("name", list(RUNS))
def test_sweep_runs_and_checks(name, tmp_path):
    world, args, sizes, algorithm_of = RUNS[name]
    path = tmp_path / "r.jsonl"
    proc = commbench("sweep", "--backend", "p2p", "-N", str(world), *args, "--sizes", sizes, *ITERS,
                     "--json", str(path))
    assert proc.returncode == 0, proc.stderr
    results, records = results_of(path)
    assert records[0]["backend"] == "p2p" and records[0]["library"] == "gloo"
    assert records[-1]["status"] == "ok" and records[-1]["wrong"] == 0
    collectives = args[args.index("-c") + 1].split(",")
    assert {r["collective"] for r in results} == set(collectives)
    assert len(results) == len(collectives) * len(sizes.split(",")) * 2  # both placements
    for r in results:
        assert r["wrong"] == 0, r
        assert r["backend"] == "p2p" and r["library"] == "gloo" and r["world_size"] == world
        assert r["algorithm"] == algorithm_of(r), r
        assert r["steps"] > 0 and r["time_us"] > 0 and r["iters"] == 2
        if r["algorithm"] == "ring" and r["collective"] == "allreduce":
            assert r["steps"] == 2 * (world - 1)
        if r["algorithm"] == "oneshot":
            assert r["steps"] == 1
    if "-T" in args:
        assert {r["nnodes"] for r in results} == {2}


@pytest.mark.parametrize("world,algorithm,topology", [(2, "pairwise", "1x2"), (3, "bruck", "1x3"), (4, "hier", "2x2")])
def test_alltoall_runs_and_checks(tmp_path, world, algorithm, topology):
    path = tmp_path / "r.jsonl"
    proc = commbench("sweep", "--backend", "p2p", "-N", str(world), "-c", "alltoall", "-A", algorithm, "-T", topology,
                     "-d", "int32", "--sizes", "1K,100K", *ITERS, "--json", str(path))
    assert proc.returncode == 0, proc.stderr
    results, records = results_of(path)
    assert records[-1]["status"] == "ok" and len(results) == 2  # out of place only
    assert all(r["wrong"] == 0 and r["algorithm"] == algorithm and r["steps"] > 0 for r in results)


@pytest.mark.parametrize("args", [["-c", "sendrecv"], ["--algorithm", "tree", "-c", "allgather"]])
def test_what_no_schedule_runs_is_refused(args):
    proc = commbench("sweep", "--backend", "p2p", "-N", "2", "--sizes", "1K", *args)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("commbench:"), proc.stderr
    assert "Traceback" not in proc.stderr
