"""`commbench nccl-tests`: every flag nccl-tests documents is either mapped onto `commbench
sweep` or refused with one line naming it; defaults are nccl-tests' own."""
from __future__ import annotations

import json

import pytest
from conftest import REPO, commbench

from commbench import cli, job
from commbench import collectives as C
from commbench.commands.helpers.common import UsageFault
from commbench.commands.nccltests import DTYPES, LONG, translate


def _one(*flags: str, binary: str = "all_reduce_perf") -> list[str]:
    runs = translate(binary, list(flags)).runs
    assert len(runs) == 1
    return runs[0]


def _value(args: list[str], option: str) -> str | None:
    return args[args.index(option) + 1] if option in args else None


def test_defaults_are_nccl_tests_defaults():
    args = _one()
    assert _value(args, "-c") == "allreduce" and _value(args, "--sizes") == str(32 << 20)
    assert (_value(args, "--iters"), _value(args, "--warmup")) == ("20", "5")
    assert (_value(args, "--dtype"), _value(args, "--op"), _value(args, "--root")) == ("float32", "sum", "0")
    assert _value(args, "--rank-agg") == "avg" and "--no-check" not in args and "--nprocs" not in args


@pytest.mark.parametrize("flags,option,expected", [
    (["-b", "8", "-e", "128M", "-f", "2"], "--sizes", "8-134217728"),
    (["-b", "8", "-e", "128M", "-f", "2"], "--factor", "2"),
    (["-b", "1K", "-e", "4k", "-i", "1024"], "--step", "1024"),
    (["--minbytes", "1.5K", "--maxbytes", "512m"], "--sizes", "1536-536870912"),  # 512 steps of -i's 1 MiB
    (["-n", "50", "-w", "0x3"], "--warmup", "3"),
    (["--iters", "010"], "--iters", "8"),  # strtol base 0: octal, as nccl-tests reads it
    (["-d", "half"], "--dtype", "float16"),
    (["-d", "bfloat16"], "--dtype", "bfloat16"),
    (["-o", "max"], "--op", "max"),
    (["-r", "1"], "--root", "1"),
    (["-a", "3"], "--rank-agg", "max"),
    (["-a", "2"], "--rank-agg", "min"),
    (["-T", "60"], "--timeout", "60"),
    (["-J", "out.json"], "--json", "out.json"),
    (["-b", "0x400", "-e", "0x1000", "-f", "2"], "--sizes", "1024-4096"),  # sscanf's %lf reads hexadecimal
    (["-b", "1KB", "-e", "2m"], "--sizes", "1024-2097152"),  # one unit letter; what follows it is not read
    (["-b", "1K", "-e", "4K", "-f", "1.5"], "--step", "1048576"),  # strtol: -f 1.5 is 1, so the step counts
])
def test_flags_map_onto_the_sweep(flags, option, expected):
    assert _value(_one(*flags), option) == expected


def test_ngpus_is_the_local_rank_count_one_by_default():
    assert translate("all_reduce_perf", ["-g", "4"]).local_ranks == 4
    assert translate("all_reduce_perf", []).local_ranks == 1


def test_refusals_read_numbers_as_nccl_tests_does():
    assert _one("-t", "01", "-m", "0x1", "-z", "00")  # 1, 1 and 0 in C's strtol: the defaults


def test_check_graph_and_no_op_flags():
    assert "--no-check" in _one("-c", "0")
    assert "--graph" in _one("-G", "1")
    assert _one("-p", "0") == _one("-p", "1")  # parallel init changes nothing here (said in a note)
    assert _one("-t", "1", "-m", "1", "-z", "0", "-y", "0", "-C", "0", "-S", "0", "-R", "0", "-D", "0", "-M", "0")


@pytest.mark.parametrize("flags,expected", [
    (["-I", "1"], ["--p99"]), (["-S", "1"], ["--timestamps"]), (["-M", "1"], ["--memory-report"]),
    (["-K", "3"], ["--skip-iters", "3"]), (["-u", "8"], ["--misalign", "8"]), (["-z", "1"], ["--blocking", "1"]),
    (["-z", "3"], ["--blocking", "3"]),
])
def test_nccl_tests_2_19_timing_flags_map_onto_the_sweep(flags, expected):
    """Issue 39: -I, -K, -S, -M, -u and -z were refused or not recognized."""
    args = _one(*flags)
    assert any(args[i:i + len(expected)] == expected for i in range(len(args)))


def test_timing_flags_the_sweep_refuses_are_named_as_given(capsys):
    assert cli.main(["nccl-tests", "all_reduce_perf", "-b", "1K", "-e", "1K", "-u", "2"]) == 2
    assert capsys.readouterr().err.startswith("commbench: error: -u 2: not a multiple of float32's 4 B")
    with pytest.raises(UsageFault, match="-z 1 with -G"):
        translate("all_reduce_perf", ["-z", "1", "-G", "1"])


def test_all_and_cycles_make_passes_of_one_sweep():
    assert len(translate("all_reduce_perf", ["-d", "all"]).runs) == 8
    assert len(translate("all_reduce_perf", ["-o", "all"]).runs) == 5
    cycled = translate("all_reduce_perf", ["-N", "3", "-o", "all"])
    assert (len(cycled.runs), cycled.cycles) == (5, 3)


@pytest.mark.parametrize("flags,needle", [
    (["-t", "2"], "-t 2"), (["-m", "4"], "-m 4"), (["-z", "2"], "-z 2"), (["-y", "1"], "-y 1"),
    (["-C", "1"], "-C 1"), (["-R", "1"], "-R 1"), (["-x", "1"], "-x 1"), (["-K", "-1"], "-K -1"),
    (["-D", "1"], "-D 1"), (["-V", "16"], "-V 16"), (["-u", "-4"], "-u -4"), (["-c", "5"], "-c 5"),
    (["-a", "0"], "-a 0"), (["-o", "mulsum"], "-o mulsum"), (["-d", "uint32"], "-d uint32"),
    (["-d", "f8e4m3"], "-d f8e4m3"), (["-N", "0"], "-N 0"), (["-b", "1G", "-e", "1K"], "minbytes"),
    (["-b", "lots"], "minbytes"), (["-n", "ten"], "-n 'ten'"), (["-q", "1"], "option -q not recognized"),
    (["--bogus=1"], "option --bogus not recognized"), (["-h"], "-h"), (["extra"], "unexpected argument"),
])
def test_flags_commbench_cannot_honour_are_refused_by_name(flags, needle):
    with pytest.raises(UsageFault, match=None) as caught:
        translate("all_reduce_perf", flags)
    assert needle in caught.value.message


def test_every_documented_flag_is_handled_and_documented():
    """Each long flag of nccl-tests parses (mapped or refused with its own line), and
    docs/nccl-tests.md has a row for it."""

    doc = (REPO / "docs" / "nccl-tests.md").read_text()
    for name in (flag.rstrip("=") for flag in LONG if flag != "help"):
        try:
            translate("all_reduce_perf", [f"--{name}=1"])
        except UsageFault as exc:
            assert "not recognized" not in exc.message, name
        assert f"`--{name}`" in doc, name


def test_binaries():
    assert _value(_one(binary="/opt/nccl-tests/build/sendrecv_perf"), "-c") == "sendrecv"
    for binary, name in (("gather_perf", "gather"), ("scatter_perf", "scatter"), ("alltoallv_perf", "alltoallv"),
                         ("hypercube_perf", "hypercube")):  # issue 39: refused before
        assert _value(_one(binary=binary), "-c") == name
    with pytest.raises(UsageFault, match="unknown nccl-tests binary"):
        translate("all_to_all_perf", [])


def test_the_command_runs_every_pass_in_one_job(monkeypatch, capsys):
    """Issue 32: -d all -o all ran 36 jobs, each starting its ranks and printing its own table."""
    planned = []
    monkeypatch.setattr(job, "run", lambda name, cfg, plan, argv: planned.append((cfg.passes, plan.world)) or 0)
    assert cli.main(["nccl-tests", "all_reduce_perf", "-b", "1K", "-e", "1K", "-g", "2", "-d", "all", "-p", "1"]) == 0
    assert len(planned) == 1 and planned[0][1] == 2 and len(planned[0][0]) == 8
    assert {dtype for dtype, _ in planned[0][0]} == set(C.DTYPES)
    out = capsys.readouterr().out
    assert "# note: -p 1" in out and "no -g" not in out
    assert cli.main(["nccl-tests", "all_reduce_perf", "-g", "64"]) == 2  # 64 local ranks: --oversubscribe


def test_all_types_and_ops_leave_out_what_the_backend_lacks(monkeypatch, capsys):
    planned = []
    monkeypatch.setattr(job, "run", lambda name, cfg, plan, argv: planned.extend(cfg.passes or [(cfg.dtype, cfg.op)])
                        or 0)
    assert cli.main(["nccl-tests", "all_reduce_perf", "-b", "1K", "-e", "1K", "-d", "all", "-o", "all"]) == 0
    assert ("int32", "avg") not in planned and ("float32", "avg") in planned and len(planned) == 8 * 5 - 4
    out = capsys.readouterr().out
    assert "left out (the backend has no such reduction): int8 avg" in out
    assert out.count("# note: no -g: one rank") == 1
    planned.clear()
    assert cli.main(["nccl-tests", "all_reduce_perf", "-b", "1K", "-e", "1K"]) == 0
    assert planned == [("float32", "sum")]


def test_no_ngpus_spawns_one_rank(monkeypatch):
    worlds = []
    monkeypatch.setattr(job, "run", lambda name, cfg, plan, argv: worlds.append(plan.world) or 0)
    assert cli.main(["nccl-tests", "all_reduce_perf", "-b", "1K", "-e", "1K"]) == 0
    assert worlds == [1]



@pytest.mark.parametrize("flags,message", [
    (["-T", "-1"], "-T -1: must not be negative"),
    (["-i", "abc", "-b", "1K", "-e", "2K"], "-i 'abc': not an integer"),
    (["-n", "-5"], "-n -5: must not be negative"),
    (["-b", "1X"], "invalid size specified for 'minbytes': '1X'"),
    (["-b", "-5"], "invalid size specified for 'minbytes': '-5' (from 0 to 4 EiB)"),
    (["-e", "inf"], "invalid size specified for 'maxbytes': 'inf'"),
])
def test_numbers_nccl_tests_would_misread_are_refused(flags, message):
    """Issue 26: -T -1 and -i abc were taken (strtol gives 0 for abc: a step of nothing)."""
    with pytest.raises(UsageFault) as refused:
        translate("all_reduce_perf", flags)
    assert refused.value.message == message


def test_a_factor_read_as_nccl_tests_reads_it_is_said():
    notes = translate("all_reduce_perf", ["-b", "1K", "-e", "4K", "-f", "1.5"]).notes
    assert notes == ["-f 1.5: read as 1, as nccl-tests reads it (strtol: an integer, up to the first character that "
                     "is not a digit)"]


def test_all_types_ops_and_cycles_print_one_table(tmp_path, capsys):
    """Issue 32: one header, one footer, every pass's rows in the order nccl-tests runs them, one JSON run."""
    out = tmp_path / "n.jsonl"
    args = ["nccl-tests", "-B", "sim", "all_reduce_perf", "-b", "1K", "-e", "2K", "-f", "2", "-g", "2", "-o", "max",
            "-d", "all", "-N", "2", "-J", str(out)]
    assert cli.main(args) == 0
    text = capsys.readouterr().out
    assert text.count("# Collective:") == 1 and text.count("# Avg bus bandwidth") == 1
    rows = [line.split() for line in text.splitlines() if line.startswith(" ")]
    order = [C.DTYPES[dtype].nccl_name for dtype in dict.fromkeys(DTYPES.values())]  # nccl-tests' -d all order
    assert [row[2] for row in rows] == [name for name in order for _ in (1, 2)] * 2  # two sizes, two cycles
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["record"] for r in records].count("header") == 1 and len({r.get("run_id") for r in records}) == 1
    assert sum(r["record"] == "result" for r in records) == len(rows) * 2  # both placements


def test_graphs_on_a_backend_without_them_are_refused_naming_g(capsys):
    """-G is refused as -G (the flag given), not as sweep's --graph (issue 25)."""
    assert cli.main(["nccl-tests", "all_reduce_perf", "-G", "1", "-b", "1K", "-e", "1K"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.count("-G:") == 1 and "--graph" not in err and "-B cupy" in err


def test_algorithm_has_sweeps_short_flag(monkeypatch):
    algorithms = []
    monkeypatch.setattr(job, "run", lambda name, cfg, plan, argv: algorithms.append(cfg.backend.algorithm) or 0)
    args = ["nccl-tests", "-B", "shm", "-A", "ring", "all_reduce_perf", "-b", "1K", "-e", "1K", "-g", "2"]
    assert cli.main(args) == 0
    assert algorithms == ["ring"]


def test_rows_keep_nccl_tests_thirteen_columns():
    """A noisy row and a schedule backend's algorithm add nothing to an nccl-tests row: its parsers count 13
    columns (the footer says how many rows were noisy)."""
    import io

    from commbench import collectives as C
    from commbench.results import point_result
    from commbench.table import Table

    plan = C.plan("allreduce", 1024, C.resolve_dtype("float32"), 2, 0)
    noisy = point_result(plan, dtype="float32", op="sum", placement="in-place", nnodes=1, backend="shm",
                         library="shm", device="cpu", time_us=10.0, per_iteration_us=[1.0] * 90 + [50.0] * 10,
                         algorithm="ring", steps=2)
    for marks, columns in ((False, 13), (True, 15)):
        out = io.StringIO()
        table = Table(["out-of-place", "in-place"], stream=out, show_algorithm=marks, marks_in_rows=marks)
        table.row({"out-of-place": noisy, "in-place": noisy}, "float")
        table.footer(True)
        row, *footer = out.getvalue().splitlines()
        assert len(row.split()) == columns, row
        assert any("1 row(s) with p99" in line for line in footer)


def test_an_existing_j_file_is_refused_naming_j(tmp_path, capsys):
    out = tmp_path / "n.jsonl"
    out.write_text("mine\n")
    assert cli.main(["nccl-tests", "all_reduce_perf", "-b", "1K", "-e", "1K", "-J", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"commbench: error: -J {out}: the file exists") and "--json" not in err
    assert out.read_text() == "mine\n"


def test_gather_scatter_alltoallv_and_hypercube_run_checked_on_gloo(tmp_path, capsys):
    """Issue 39: nccl-tests' gather_perf, scatter_perf, alltoallv_perf (here with skewed splits) and
    hypercube_perf run on torch (gloo) with #wrong 0, algbw and busbw as nccl-tests computes them."""
    for binary, extra in (("gather_perf", ["-r", "1"]), ("scatter_perf", []), ("hypercube_perf", []),
                          ("alltoallv_perf", [])):
        out = tmp_path / f"{binary}.jsonl"
        options = ["--splits", "skewed:1:4"] if binary == "alltoallv_perf" else []
        assert cli.main(["nccl-tests", *options, binary, "-b", "4K", "-e", "4K", "-n", "2", "-w", "1", "-g", "2",
                         *extra, "-J", str(out)]) == 0, binary
        results = [json.loads(line) for line in out.read_text().splitlines() if '"result"' in line]
        assert results and all(r["wrong"] == 0 for r in results), binary
        for r in results:
            algbw, busbw = C.bandwidths_gbps(r["collective"], r["nbytes"], 2, r["time_us"])
            assert (r["algbw_gbps"], r["busbw_gbps"]) == pytest.approx((algbw, busbw))
    assert "hypercube needs a power-of-two" in _refusal(["nccl-tests", "hypercube_perf", "-g", "3"], capsys)


def _refusal(args, capsys):
    assert cli.main(args) == 2
    return capsys.readouterr().err


def test_all_reduce_perf_ignores_a_root_as_nccl_tests_does():
    """-r names the root of rooted collectives; all_reduce_perf takes it and ignores it (no -g: one rank)."""
    proc = commbench("nccl-tests", "all_reduce_perf", "-b", "1K", "-e", "1K", "-r", "1", "-n", "1", "-w", "1")
    assert proc.returncode == 0, proc.stderr
