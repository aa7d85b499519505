"""What a newcomer trips over (issue 25): options that would be ignored are refused or said in one
line, nccl-tests' flags given to sweep point to the two ways to run them, a fit's unmeasured level
is said, long measurements say what they measure with progress, and the report's charts and tables
say which definition they show."""
from __future__ import annotations

import io

import numpy as np
from conftest import commbench

from commbench import cli
from commbench import collectives as C
from commbench.results import ResultSink, point_result


def _run(capsys, *args: str) -> tuple[int, str, str]:
    code = cli.main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_nccl_tests_flags_given_to_sweep_point_to_sizes_or_nccl_tests(capsys):
    """Each flag is answered with what says it here (sizes for -b/-e, --nprocs for -g: issue 48 found the
    sizes hint beside the point for -g) and the nccl-tests line it belongs to (no sweep option in it)."""
    cases = ((["-b", "8", "-e", "1M"], "--sizes", "-b 8 -e 1M"), (["-b", "8"], "--sizes", "-b 8"),
             (["--sizes", "1K", "-e", "1M"], "--sizes", "-b 1K -e 1M"), (["-g", "2"], "--nprocs", "-g 2"))
    for args, way, line in cases:
        code, _, err = _run(capsys, "sweep", *args)
        assert code == 2 and len(err.strip().splitlines()) == 1, err
        assert way in err and err.rstrip().endswith(f"commbench nccl-tests all_reduce_perf {line}"), err
        assert ("--sizes" in err) == (way == "--sizes"), err
    code, _, err = _run(capsys, "sweep", "--no-such-option")
    assert code == 2 and "nccl-tests" not in err  # any other unknown option keeps click's own line


def test_sweep_o_is_the_op_and_a_path_given_to_it_points_to_json(capsys):
    """-o is nccl-tests' op in sweep but the output in fit/report: a path given to sweep's -o says so."""
    code, _, err = _run(capsys, "sweep", "-o", "out.jsonl", "--sizes", "1K")
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "-o is the reduction op" in err and "--json FILE" in err
    code, _, err = _run(capsys, "sweep", "-o", "xor", "--sizes", "1K")
    assert code == 2 and "--json" not in err  # a mistyped op is only a mistyped op


def test_a_multi_node_layout_a_spawned_library_run_cannot_honour_is_refused(capsys):
    for args in (["--nodes", "2", "--nprocs", "2"], ["-T", "2x1"], ["--nodes", "2", "--gpus-per-node", "1"]):
        code, _, err = _run(capsys, "sweep", "--sizes", "1K", *args)
        assert code == 2 and len(err.strip().splitlines()) == 1, err
        assert "all on this host" in err and "--emulate 2x1" in err and "torchrun --nnodes 2" in err


def test_a_predicted_proxy_says_steps_do_not_apply():
    out = commbench("proxy", "resnet50", "--nodes", "4", "--gpus-per-node", "8", "--hw", "dgx-a100", "--tflops",
                    "100", "--steps", "3")
    assert out.returncode == 0, out.stderr
    assert "--steps 3 and --warmup-steps 5 do not apply to a prediction" in out.stdout
    assert "DDP's own work" not in out.stdout  # --compute flops: no DDP term to report


def _result_file(path, time_us: float | None, backend: str = "torch", library: str = "gloo") -> str:
    plan = C.plan("allreduce", 1 << 16, C.resolve_dtype("float32"), 2)
    with ResultSink(str(path)) as sink:
        sink.header({"run_id": "r" + path.stem})
        for placement in ("out-of-place", "in-place"):
            times = None if time_us is None else np.full(5, time_us * (2 if placement == "in-place" else 1))
            sink.write(point_result(plan, dtype="float32", op="sum", placement=placement, nnodes=1, backend=backend,
                                    library=library, device="cpu",
                                    time_us=None if times is None else float(times.mean()), per_iteration_us=times,
                                    run_id="r" + path.stem))
    return str(path)


def test_report_says_which_file_adds_nothing(tmp_path):
    from commbench.analysis import report as R

    measured = _result_file(tmp_path / "cmp.jsonl", 100.0)
    unmeasured = _result_file(tmp_path / "sim.jsonl", None, backend="sim", library="sim")
    warnings: list[str] = []
    index, _ = R.report([measured, unmeasured], str(tmp_path / "rep"), warn=warnings.append)
    assert warnings == [f"{unmeasured}: no timed result, proxy, scaling or compare record: it adds nothing to the "
                        f"report"]
    text = open(index).read()
    assert f"{unmeasured}: no timed result, proxy, scaling or compare record: nothing drawn from it" in text


def test_report_charts_one_colour_per_placement_and_busbw_always_log(tmp_path, monkeypatch):
    from commbench.analysis import report as R
    from commbench.analysis import report_steps as S

    figures = []
    monkeypatch.setattr(S, "save_png", lambda fig, out_dir, name, rect=None: figures.append(fig) or name)
    records = R.read_all([_result_file(tmp_path / "a.jsonl", 100.0)])
    R.plot(R.collect_series(records), str(tmp_path))
    ax_bw, ax_t = figures[0].axes
    assert ax_bw.get_yscale() == "log"  # even when busbw spans less than two decades
    colours = {line.get_label(): line.get_color() for line in ax_t.get_lines()}
    assert len(colours) == 2 and len(set(map(str, colours.values()))) == 2  # in-place and out-of-place differ
    assert "of the mean time" in ax_bw.get_title()


def test_step_labels_never_use_exponents():
    from commbench.analysis.report_steps import ms_text

    assert [ms_text(v) for v in (21210.4, 2.1214, 0.0012345)] == ["21210", "2.121", "0.001234"]


def test_index_gives_the_median_steps_own_parts_beside_each_columns_median():
    from commbench.analysis.report_steps import step_rows
    from commbench.analysis.report_tables import index_lines

    base = {"record": "step", "run_id": "x", "warmup": False}
    parts_ms = [(100, 900, 2, 5), (100, 100, 60, 7), (100, 500, 20, 50)]  # compute, comm, exposed, other
    steps = [{**base, "step": i, "compute_us": c * 1e3, "comm_us": m * 1e3, "exposed_comm_us": e * 1e3,
              "other_us": o * 1e3, "step_us": (c + e + o) * 1e3} for i, (c, m, e, o) in enumerate(parts_ms, 1)]
    summary = {"record": "proxy", "run_id": "x", "kind": "proxy", "model": "m", "world_size": 2, "backend": "torch",
               "library": "gloo", "batch": 1, **{f"{k}_us_p50": float(np.median([s[f"{k}_us"] for s in steps]))
                                                  for k in ("compute", "comm", "exposed_comm", "other", "step")}}
    text = "\n".join(index_lines(step_rows([*steps, summary]), []))
    assert "Each column's own median" in text and "The median step itself" in text
    assert "| 167.00 | 100.00 | 500.00 | 20.00 | 7.00 |" in text  # each column's median: they do not add up
    assert "| 167.00 | 100.00 | 100.00 | 60.00 | 7.00 |" in text  # step 2, the median step: 100 + 60 + 7 = 167


def test_measuring_the_compute_says_what_and_counts_its_steps(capsys, monkeypatch):
    from commbench.proxies import train as T
    from commbench.proxies.profile import load_profile
    from commbench.table import Progress

    labels = []
    real = Progress.update
    monkeypatch.setattr(Progress, "update", lambda self, label: labels.append(label) or real(self, label))
    # the catalog's smallest model (0.04 GFLOP a sample): the steps are counted, not timed
    T.measure_compute(load_profile("llama-tiny"), 1, "cpu", show_progress=True)
    assert "# measuring llama-tiny's compute here first (batch 1, at 1 rank: 22 steps" in capsys.readouterr().out
    assert len(labels) == T.COMPUTE_STEPS  # the ETA's denominator is the steps that run
    labels.clear()
    T.measure_compute(load_profile("llama-tiny"), 1, "cpu", show_progress=True, repeats=2)  # proxy --steps 2
    assert f"at 1 rank: {T.compute_steps(2)} steps" in capsys.readouterr().out and len(labels) == 13


def test_progress_names_its_unit():
    from commbench.table import Progress

    clock = iter([0.0, 40.0])
    log = io.StringIO()
    progress = Progress(4, stream=log, clock=lambda: next(clock), unit="steps")
    progress.advance()
    progress.update("DDP's own work")
    assert log.getvalue() == "commbench: 1/4 steps, 40 s ETA 120s: DDP's own work\n"


def test_sweep_notes_ranks_beyond_the_hosts_cores():
    from commbench.environment import oversubscribed

    assert oversubscribed([{"host": "a", "cpus": 2}] * 4) == "4 ranks on a host of 2 cores"
    assert oversubscribed([{"host": "a", "cpus": 2}] * 2) is None
    assert oversubscribed([{"host": "a", "cpus": None}] * 4) is None
    bound = [{"host": "a", "cpus": 2, "cpu_affinity": str(r)} for r in range(2)]  # mpirun: a core each
    assert oversubscribed(bound) is None
    assert oversubscribed(bound * 2) == "4 ranks on a host of 2 cores"


def test_an_emulated_clusters_header_does_not_say_one_host_above_its_nodes(capsys, monkeypatch):
    from commbench.launchers import EMULATED_VAR

    monkeypatch.setenv(EMULATED_VAR, "2 node(s) x 1 rank(s), each node's link 1 Gbit/s")
    code, out, _ = _run(capsys, "sweep", "--backend", "sim", "--nprocs", "2", "--sizes", "1K")
    assert code == 0
    assert "2 ranks on one host's emulated nodes" in out and "1 host(s)" not in out
    assert "# emulated cluster: 2 node(s)" in out
