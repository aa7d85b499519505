"""Bad input files and unwritable outputs: result files, hardware files and output paths end in
one line (`commbench: error: ...`) and exit 2, never a traceback (issue 11). The commands run in
this process (cli.main), so a traceback fails the test as an exception."""
import base64
import copy
import errno
import json
import os
import subprocess
import zlib

import pytest

from commbench import algorithms as A
from commbench import costmodel as M
from commbench.cli import main
from commbench.collectives import COLLECTIVES
from commbench.commands.helpers.common import check_writable
from commbench.results import OutputError, RecordError, Result, ResultSink, read_records
from commbench.topology import Link, Topology

TRUTH = M.Hardware("truth", 4, Link("shm", 8.0, 3.0), Link("shm", 8.0, 3.0))
PRESET = json.loads(open(os.path.join(M.PRESET_DIR, "dgx-a100.json")).read())


def run(capsys, *args):
    code = main([str(a) for a in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def records(worlds=(2, 4), sizes=tuple(1 << k for k in range(10, 21, 2))):
    """Measured ring allreduce points timed by a known cost model: a fit of them succeeds."""
    out = []
    for world in worlds:
        topo = Topology(1, world)
        for nbytes in sizes:
            count = nbytes // 4 - (nbytes // 4) % world
            t = M.schedule_us(A.build("allreduce", "ring", topo, count, count * 4), topo, TRUTH, 4)
            out.append({"record": "result", "kind": "measured", "collective": "allreduce", "backend": "shm",
                        "library": "shm", "algorithm": "ring", "dtype": "float32", "op": "sum", "root": None,
                        "placement": "in-place", "world_size": world, "nnodes": 1, "count": count,
                        "nbytes": count * 4, "time_us": t, "busbw_gbps": 1.0, "wrong": 0})
    return out


def write_lines(path, lines):
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    return path


# ---------------------------------------------------------------- malformed result files


def _packed(values):
    from commbench.results import pack_times

    return pack_times(list(values))


def _without(name):
    def change(r):
        del r[name]
    return change


def _set(name, value):
    def change(r):
        r[name] = value
    return change


# (what line 3 becomes: a replacement line or a change of the record) -> the error after "PATH:3: "
RESULT_CASES = {
    "list": ([1, 2], "not a JSON object but a list: every line of a results file is one record"),
    "number": (5, "not a JSON object but 5: every line of a results file is one record"),
    "string": ('"x"', 'not a JSON object but the string "x": every line of a results file is one record'),
    "null": (None, "not a JSON object but null: every line of a results file is one record"),
    "not JSON": ("{oops", "not JSON (Expecting property name enclosed in double quotes, column 2): a results file is "
                          "JSON Lines, one record a line"),
    "no placement": (_without("placement"), "result record: missing field 'placement'"),
    "no collective": (_without("collective"), "result record: missing field 'collective'"),
    "no nbytes": (_without("nbytes"), "result record: missing field 'nbytes'"),
    "no backend": (_without("backend"), "result record: missing field 'backend'"),
    "no record type": (_without("record"), "no 'record' field naming the record type"),
    "nbytes string": (_set("nbytes", "1024"), 'result record: nbytes must be a whole number, not the string "1024"'),
    "time string": (_set("time_us", "5"), 'result record: time_us must be a number or null, not the string "5"'),
    "world string": (_set("world_size", "2"), 'result record: world_size must be a whole number, not the string "2"'),
    "world float": (_set("world_size", 2.5), "result record: world_size must be a whole number, not 2.5"),
    "world 0": (_set("world_size", 0), "result record: world_size must be at least 1, not 0"),
    "nnodes 0": (_set("nnodes", 0), "result record: nnodes must be at least 1, not 0"),
    "negative time": (_set("time_us", -3.0), "result record: time_us cannot be negative (-3.0)"),
    "wrong string": (_set("wrong", "0"), 'result record: wrong must be a whole number or null, not the string "0"'),
    "unknown collective": (_set("collective", "allfoo"), "result record: unknown collective 'allfoo'; known: "
                           + ", ".join(COLLECTIVES)),
    "unknown dtype": (_set("dtype", "float8"), "result record: unknown dtype 'float8'; known: float32, float16, "
                      "bfloat16, float64, int32, int8, uint8, int64"),
    "root outside": (_set("root", 9), "result record: root 9 is not a rank of 2"),
    "telemetry list": (_set("telemetry", [1]), "result record: telemetry must be an object or null, not a list"),
    # hostile files (issue 26): each was a traceback, or a read without bound
    "nested 200,000 deep": ("[" * 200_000 + "]" * 200_000, "nested deeper than a JSON reader follows: a results file "
                            "is JSON Lines, one record a line"),
    "5,000 digits": ('{"record": "result", "nbytes": ' + "9" * 5000 + "}", "holds an integer of more than 4,300 "
                     "digits (Python reads no more): a results file is JSON Lines, one record a line"),
    "nbytes 10**300": (_set("nbytes", 10**300), "nbytes is above 2**63: no count or size of a run comes near it"),
    "time 1e300": (_set("time_us", 1e300), "time_us is above 1e30: no count or size of a run comes near it"),
    "packed count wrong": (_set("iteration_times_us", {**_packed(range(100, 200)), "count": 5}),
                           "result record: iteration_times_us: more values, the record says 5"),
    "packed bomb": (_set("iteration_times_us", {"encoding": "float32-zlib-base64", "count": 100,
                                                "data": base64.b64encode(zlib.compress(bytes(64 << 20), 9)).decode()}),
                    "result record: iteration_times_us: more values, the record says 100"),
    "packed garbage": (_set("iteration_times_us", {"encoding": "float32-zlib-base64", "count": 3, "data": "!!"}),
                       "result record: iteration_times_us: data is not float32-zlib-base64 (Only base64 data is "
                       "allowed)"),
    "packed count huge": (_set("iteration_times_us", {**_packed(range(100, 200)), "count": 10**12}),
                          "result record: iteration_times_us: count must be a whole number in 1..10,000,000, not "
                          "1000000000000"),
}
NON_FINITE = {"NaN": "NaN", "Infinity": "infinite", "-Infinity": "infinite", "1e999": "infinite"}


def _bad_results_file(tmp_path, case):
    lines = records()
    replacement, _ = RESULT_CASES[case]
    if callable(replacement):
        record = copy.deepcopy(lines[2])
        replacement(record)
        lines[2] = record
    else:
        lines[2] = replacement if isinstance(replacement, str) else json.dumps(replacement)
    return write_lines(tmp_path / "bad.jsonl", lines)


def _commands(path, good, tmp_path):
    return {"fit": ["fit", path, "-o", tmp_path / "hw.json"],
            "check": ["check", path, "--hw", "dgx-a100"],
            "report": ["report", path, "-o", tmp_path / "rep"],
            "compare": ["compare", good, path, "--metric", "time"]}


@pytest.mark.parametrize("command", ["fit", "report", "compare", "check"])
@pytest.mark.parametrize("case", sorted(RESULT_CASES))
def test_a_malformed_result_line_is_one_line_with_file_and_line(tmp_path, capsys, case, command):
    path = _bad_results_file(tmp_path, case)
    good = write_lines(tmp_path / "good.jsonl", records())
    code, _, err = run(capsys, *_commands(path, good, tmp_path)[command])
    assert (code, err) == (2, f"commbench: error: {path}:3: {RESULT_CASES[case][1]}\n")
    assert not (tmp_path / "hw.json").exists() and not (tmp_path / "rep").exists()


@pytest.mark.parametrize("command", ["fit", "report", "compare", "check", "predict-scaling --jitter-from"])
def test_a_file_declaring_too_many_times_ends_at_the_budget(tmp_path, capsys, command):
    """Records of 10,000,000 zlib-compressed zeros each (issue 32: 100 of them, 5.3 MB, cost check 141 s, report
    188 s, fit 39 s, predict-scaling --jitter-from over 90 s): the record past the file's budget is one line."""
    from commbench.results import MAX_RAW_TIMES, MAX_RAW_TIMES_PER_FILE

    zeros = {"encoding": "float32-zlib-base64", "count": MAX_RAW_TIMES,
             "data": base64.b64encode(zlib.compress(bytes(4 * MAX_RAW_TIMES), 9)).decode()}
    within = MAX_RAW_TIMES_PER_FILE // MAX_RAW_TIMES
    lines = [{**r, "iteration_times_us": zeros} for r in records(sizes=tuple(1 << k for k in range(10, 20)))]
    path = write_lines(tmp_path / "zeros.jsonl", lines)
    good = write_lines(tmp_path / "good.jsonl", records())
    argv = {**_commands(path, good, tmp_path), "predict-scaling --jitter-from": [
        "predict-scaling", "resnet50", "--hw", "dgx-a100", "--gpus", "1,8", "--jitter-from", path]}[command]
    code, _, err = run(capsys, *argv)
    assert (code, err) == (2, f"commbench: error: {path}:{within + 1}: result record: iteration_times_us: the file's "
                              f"records declare more than {MAX_RAW_TIMES_PER_FILE:,d} per-iteration times in all, "
                              f"more than commbench reads from one file (a sweep keeps at most {MAX_RAW_TIMES:,d} a "
                              f"point): split the file, or keep fewer iterations\n")


@pytest.mark.parametrize("command", ["fit", "report", "compare"])
@pytest.mark.parametrize("literal", sorted(NON_FINITE))
def test_nan_and_infinity_in_a_result_are_refused(tmp_path, capsys, literal, command):
    lines = [json.dumps(r) for r in records()]
    lines[1] = lines[1].replace(f'"time_us": {json.dumps(records()[1]["time_us"])}', f'"time_us": {literal}')
    assert literal in lines[1]
    path = write_lines(tmp_path / "bad.jsonl", lines)
    good = write_lines(tmp_path / "good.jsonl", records())
    code, _, err = run(capsys, *_commands(path, good, tmp_path)[command])
    assert (code, err) == (2, f"commbench: error: {path}:2: time_us is {NON_FINITE[literal]}: only finite numbers "
                              "are accepted\n")


@pytest.mark.parametrize("command", ["fit", "report", "compare"])
def test_a_binary_file_is_one_line(tmp_path, capsys, command):
    path = tmp_path / "bin.jsonl"
    path.write_bytes(bytes(range(128, 256)) + bytes(range(256)) * 8)
    good = write_lines(tmp_path / "good.jsonl", records())
    code, _, err = run(capsys, *_commands(path, good, tmp_path)[command])
    assert (code, err) == (2, f"commbench: error: {path}:1: not UTF-8 text: a results file is JSON Lines, one record "
                              f"a line\n")


def test_a_truncated_last_line_is_skipped_with_a_warning(tmp_path, capsys):
    """The one skip the docs promise: a run killed mid-write leaves a cut last line."""
    path = write_lines(tmp_path / "r.jsonl", records())
    with open(path, "a") as handle:
        handle.write('{"record": "result", "collec')
    code, out, err = run(capsys, "fit", path, "-o", tmp_path / "hw.json")
    assert code == 0 and "12 points" in out
    assert err == (f"commbench: warning: {path}:13: the last line is cut short (a run killed mid-write): "
                   "skipped\n")
    assert len(read_records(str(path))) == 12  # no warn callback: skipped quietly, as before


def test_a_bad_line_in_the_middle_is_not_skipped(tmp_path):
    path = write_lines(tmp_path / "r.jsonl", [*records()[:2], '{"record": "result", "collec', *records()[2:]])
    with pytest.raises(RecordError, match=r"r\.jsonl:3: not JSON"):
        read_records(str(path))


def test_readers_still_take_hand_made_and_older_records(tmp_path, capsys):
    """Fields outside the readers' needs may be missing; unknown record types and fields pass."""
    lines = [{"record": "header", "anything": [1, {"x": None}]}, {"record": "from-the-future", "x": "y"},
             *[{k: v for k, v in r.items() if k not in ("kind", "op", "root", "busbw_gbps")} for r in records()],
             {"record": "summary", "status": "ok", "points": 12}]
    lines[3]["a_field_from_the_future"] = "z"
    path = write_lines(tmp_path / "r.jsonl", lines)
    assert run(capsys, "fit", path, "-o", tmp_path / "hw.json")[0] == 0
    assert run(capsys, "compare", path, path, "--metric", "time")[0] == 0


def test_a_point_without_count_is_a_fit_error(tmp_path, capsys):
    lines = records()
    del lines[0]["count"]
    path = write_lines(tmp_path / "r.jsonl", lines)
    code, _, err = run(capsys, "fit", path, "-o", tmp_path / "hw.json")
    assert (code, err) == (2, "commbench: error: the allreduce point of 1024 bytes (shm/shm/ring) has no count: a "
                              "fit needs the element count of each point\n")


def test_report_checks_proxy_and_scaling_records(tmp_path, capsys):
    scaling = {"record": "scaling", "model": "m", "hardware": "h", "batch": 1, "compute": "c", "gpus": 8,
               "algorithm": "nccl", "samples_per_s": 10.0, "speedup": 0, "linearity": 1.0}
    path = write_lines(tmp_path / "s.jsonl", [scaling])
    code, _, err = run(capsys, "report", path, "-o", tmp_path / "rep")
    assert (code, err) == (2, f"commbench: error: {path}:1: scaling record: speedup must be positive, not 0\n")
    proxy = {"record": "proxy", "kind": "proxy", "model": "m", "backend": "torch", "library": "gloo",
             "world_size": 2, "batch": 4}
    path = write_lines(tmp_path / "p.jsonl", [proxy])
    code, _, err = run(capsys, "report", path, "-o", tmp_path / "rep")
    assert (code, err) == (2, f"commbench: error: {path}:1: proxy record: missing field 'step_us_p50'\n")


# ---------------------------------------------------------------- bad hardware files


def _hw(change=None, raw=None):
    def build(path):
        if raw is not None:
            path.write_bytes(raw) if isinstance(raw, bytes) else path.write_text(raw)
            return
        data = copy.deepcopy(PRESET)
        change(data)
        path.write_text(json.dumps(data))
    return build


NOT_HW = "not a hardware file (expected JSON from commbench fit)"


def _level(level, key, value):
    return _hw(lambda d: d["levels"][level].__setitem__(key, value))


def _top(key, value):
    return _hw(lambda d: d.__setitem__(key, value))


def _literal(old, new):
    return _hw(raw=json.dumps(PRESET).replace(old, new))


HW_CASES = {
    "bw string": (_level("intra", "bw_gbps", "300"), 'levels.intra.bw_gbps must be a number, not the string "300"'),
    "latency string": (_level("inter", "latency_us", "2"),
                       'levels.inter.latency_us must be a number, not the string "2"'),
    "ranks string": (_top("ranks_per_node", "8"), 'ranks_per_node must be a number, not the string "8"'),
    "ranks 2.7": (_top("ranks_per_node", 2.7), "ranks_per_node must be a whole number, not 2.7"),
    "ranks true": (_top("ranks_per_node", True), "ranks_per_node must be a number, not true"),
    "ranks 0": (_top("ranks_per_node", 0), "ranks_per_node must be at least 1, not 0"),
    "levels list": (_top("levels", [1, 2]), "levels must be a JSON object, not a list"),
    "intra list": (_hw(lambda d: d["levels"].__setitem__("intra", [1])), "levels.intra must be a JSON object, "
                                                                          "not a list"),
    "file a list": (_hw(raw="[1, 2]"), "a hardware file must be a JSON object, not a list"),
    "negative bw": (_level("intra", "bw_gbps", -3), "levels.intra.bw_gbps must be positive, not -3"),
    "negative latency": (_level("intra", "latency_us", -3), "levels.intra.latency_us must be non-negative, not -3"),
    "NaN latency": (_literal('"latency_us": 0.6', '"latency_us": NaN'),
                    "levels.intra.latency_us must be a finite number, not nan"),
    "inf latency": (_literal('"latency_us": 0.6', '"latency_us": Infinity'),
                    "levels.intra.latency_us must be a finite number, not inf"),
    "NaN bw": (_literal('"bw_gbps": 300.0', '"bw_gbps": NaN'), "levels.intra.bw_gbps must be a finite number, not nan"),
    "1e999 bw": (_literal('"bw_gbps": 300.0', '"bw_gbps": 1e999'),
                 "levels.intra.bw_gbps must be a finite number, not inf"),
    "NaN overhead": (_literal('"per_call_overhead_us": 6.6', '"per_call_overhead_us": NaN'),
                     "per_call_overhead_us must be a finite number, not nan"),
    "huge int overhead": (_literal('"per_call_overhead_us": 6.6', '"per_call_overhead_us": 1' + "0" * 400),
                          "per_call_overhead_us must be at most 1e+30, not 100000000000... (401 digits)"),
    "overhead string": (_top("per_call_overhead_us", "x"), 'per_call_overhead_us must be a number, not the string "x"'),
    "reduce string": (_top("reduce_gbps", "fast"), 'reduce_gbps must be a number, not the string "fast"'),
    "negative reduce": (_top("reduce_gbps", -1), "reduce_gbps must be positive, not -1"),
    "tflops list": (_top("device_tflops", [1]), "device_tflops must be a JSON object, not a list"),
    "tflops string": (_hw(lambda d: d["device_tflops"].__setitem__("fp32", "x")),
                      'device_tflops.fp32 must be a number, not the string "x"'),
    "tflops NaN": (_literal('"fp32": 19.5', '"fp32": NaN'), "device_tflops.fp32 must be a finite number, not nan"),
    "links 2.5": (_level("inter", "links_per_node", 2.5), "levels.inter.links_per_node must be a whole number, "
                                                          "not 2.5"),
    "links string": (_level("inter", "links_per_node", "8"),
                     'levels.inter.links_per_node must be a number, not the string "8"'),
    "cache string": (_hw(lambda d: d["levels"]["intra"].update(cache_bytes="1", cache_bw_gbps=5)),
                     'levels.intra.cache_bytes must be a number, not the string "1"'),
    "cache alone": (_level("intra", "cache_bytes", 1024), "levels.intra: cache_bytes and cache_bw_gbps go together"),
    "meta list": (_top("meta", [1]), "meta must be a JSON object, not a list"),
    "no intra": (_hw(lambda d: d["levels"].pop("intra")), "missing field 'levels.intra'"),
    "schema 2": (_top("schema", 2), "schema 2: this commbench reads hardware files of schema 1"),
    "binary": (_hw(raw=bytes(range(128, 256)) * 4), "not UTF-8 text: not a hardware file (expected JSON from commbench "
                                               "fit)"),
    "not JSON": (_hw(raw='{"levels": '), "not JSON (Expecting value, column 12): " + NOT_HW),
    "nested": (_hw(raw="[" * 200_000 + "]" * 200_000), "nested deeper than a JSON reader follows: " + NOT_HW),
    "5,000 digits": (_hw(raw='{"ranks_per_node": ' + "9" * 5000 + "}"),
                     "holds an integer of more than 4,300 digits (Python reads no more): " + NOT_HW),
    "1e308": (_level("intra", "latency_us", 1e308), "levels.intra.latency_us must be at most 1e+30, not 1e+308"),
}


def _hw_commands(hw, tmp_path):
    good = write_lines(tmp_path / "good.jsonl", records())
    return {
        "predict": ["predict", "--hw", hw, "--topology", "2x8", "--sizes", "1K,1M"],
        "predict-scaling": ["predict-scaling", "resnet50", "--hw", hw, "--gpus", "1,8,16"],
        "proxy --backend sim": ["proxy", "resnet50", "--backend", "sim", "--nodes", "2", "--gpus-per-node", "8",
                                "--hw", hw, "--tflops", "100", "--steps", "3"],
        "sweep --backend sim": ["sweep", "--backend", "sim", "-N", "4", "--hw", hw, "--sizes", "1K,64K"],
        "report --hw": ["report", good, "--hw", hw, "-o", tmp_path / "rep"],
        "fit --base": ["fit", good, "--base", hw, "-o", tmp_path / "out.json"],
    }


@pytest.mark.parametrize("case", sorted(HW_CASES))
def test_a_bad_hardware_file_is_one_line_naming_the_field(tmp_path, capsys, case):
    hw = tmp_path / "hw.json"
    HW_CASES[case][0](hw)
    code, out, err = run(capsys, *_hw_commands(hw, tmp_path)["predict"])
    assert (code, out, err) == (2, "", f"commbench: error: {hw}: {HW_CASES[case][1]}\n")


@pytest.mark.parametrize("command", ["predict", "predict-scaling", "proxy --backend sim", "sweep --backend sim",
                                     "report --hw", "fit --base"])
@pytest.mark.parametrize("case", ["bw string", "intra list", "NaN latency", "ranks 2.7", "binary", "tflops list",
                                  "nested", "5,000 digits", "1e308",
                                  "reduce string"])
def test_every_command_that_reads_hardware_validates_it_alike(tmp_path, capsys, case, command):
    hw = tmp_path / "hw.json"
    HW_CASES[case][0](hw)
    code, out, err = run(capsys, *_hw_commands(hw, tmp_path)[command])
    assert (code, err) == (2, f"commbench: error: {hw}: {HW_CASES[case][1]}\n")
    assert "nan" not in out and not (tmp_path / "out.json").exists() and not (tmp_path / "rep").exists()


def test_inf_latency_no_longer_breaks_json(tmp_path, capsys):
    hw = tmp_path / "hw.json"
    HW_CASES["inf latency"][0](hw)
    out_path = tmp_path / "p.jsonl"
    code, _, err = run(capsys, "predict", "--hw", hw, "--topology", "1x2", "--sizes", "1K", "--json", out_path)
    assert (code, err) == (2, f"commbench: error: {hw}: levels.intra.latency_us must be a finite number, not inf\n")
    assert not out_path.exists()


def test_every_preset_and_a_fitted_file_load(tmp_path):
    for name in M.presets():
        assert M.load_hardware(name).name == name
    path = tmp_path / "hw.json"
    TRUTH.save(str(path))
    assert M.load_hardware(str(path)) == M.Hardware("truth", 4, Link("shm", 8.0, 3.0), Link("shm", 8.0, 3.0))


def test_a_fit_across_nodes_only_writes_a_loadable_file(tmp_path, capsys):
    """One rank per node: the intra level is never crossed and is copied, never written as Infinity."""
    lines = []
    for r in records(worlds=(2,)):
        topo = Topology(2, 1)
        t = M.schedule_us(A.build("allreduce", "ring", topo, r["count"], r["nbytes"]), topo, TRUTH, 4)
        lines.append({**r, "nnodes": 2, "time_us": t})
    path = write_lines(tmp_path / "r.jsonl", lines)
    code, out, _ = run(capsys, "fit", path, "-o", tmp_path / "hw.json")
    assert code == 0 and "intra level not fitted (one rank per node): copied from the inter level" in out
    hw = M.load_hardware(str(tmp_path / "hw.json"))
    assert hw.intra.bw_gbps == hw.inter.bw_gbps < float("inf")


# ---------------------------------------------------------------- outputs


def _unwritable_sys():
    try:
        os.close(os.open("/sys/commbench-probe.json", os.O_WRONLY | os.O_CREAT | os.O_EXCL))
    except OSError as exc:
        return exc.strerror
    os.unlink("/sys/commbench-probe.json")
    pytest.skip("/sys is writable here")


@pytest.mark.parametrize("command", ["fit", "predict", "predict-scaling", "compare", "profiles extract", "sweep",
                                     "sweep --csv", "sweep --backend sim", "proxy --backend sim"])
def test_an_unwritable_output_is_refused_before_any_work(tmp_path, capsys, command):
    """/sys refuses new files even to root, where the old os.access check passed; the line names why (issue 32)."""
    _unwritable_sys()
    good = write_lines(tmp_path / "good.jsonl", records())
    out = "/sys/commbench-x.json"
    args = {"fit": ["fit", good, "-o", out],
            "predict": ["predict", "--hw", "dgx-a100", "--topology", "1x2", "--sizes", "1K", "--json", out],
            "predict-scaling": ["predict-scaling", "resnet50", "--hw", "dgx-a100", "--gpus", "1,8", "--json", out],
            "compare": ["compare", good, good, "--metric", "time", "--json", out],
            "profiles extract": ["profiles", "extract", "resnet50", "-o", out],
            "sweep": ["sweep", "--sizes", "1K", "--json", out],
            "sweep --csv": ["sweep", "--sizes", "1K", "--csv", out],
            "sweep --backend sim": ["sweep", "--backend", "sim", "-N", "2", "--hw", "dgx-a100", "--sizes", "1K",
                                    "--json", out],
            "proxy --backend sim": ["proxy", "resnet50", "--backend", "sim", "--nodes", "1", "--gpus-per-node", "2",
                                    "--hw", "dgx-a100", "--tflops", "100", "--steps", "2", "--json", out]}[command]
    code, stdout, err = run(capsys, *args)
    assert (code, stdout, err.count("\n")) == (2, "", 1), err
    assert f" {out}: /sys is the kernel's sysfs file system, which holds no files to write" in err, err


def test_report_into_an_unwritable_directory_is_refused(tmp_path, capsys):
    _unwritable_sys()
    good = write_lines(tmp_path / "good.jsonl", records())
    code, _, err = run(capsys, "report", good, "-o", "/sys/commbench-report")
    assert code == 2 and err.startswith("commbench: error: -o /sys/commbench-report: /sys is the kernel's sysfs file "
                                        "system")
    assert err.count("\n") == 1


@pytest.mark.parametrize("command", ["predict", "predict-scaling", "compare", "fit", "check"])
def test_a_full_disk_mid_run_is_one_line_and_keeps_what_was_printed(tmp_path, capsys, command, monkeypatch):
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full")
    # /dev/full stands for a disk that fills during the run: past the up-front check, which refuses devices
    monkeypatch.setattr("commbench.commands.helpers.common._check_existing", lambda *args: None)
    good = write_lines(tmp_path / "good.jsonl", records())
    args = {"predict": ["predict", "--hw", "dgx-a100", "--topology", "1x2", "--sizes", "1K,1M", "--json"],
            "predict-scaling": ["predict-scaling", "resnet50", "--hw", "dgx-a100", "--gpus", "1,8", "--json"],
            "compare": ["compare", good, good, "--metric", "time", "--json"],
            "fit": ["fit", good, "-o"], "check": ["check", good, "--hw", "dgx-a100", "--json"]}[command]
    code, out, err = run(capsys, *args, "/dev/full")
    assert (code, err) == (2, "commbench: error: cannot write /dev/full: No space left on device\n")
    if command != "fit":  # the table went out before the file failed
        assert [line for line in out.splitlines() if not line.startswith("#")]


@pytest.fixture
def small_disk(tmp_path):
    """A 64 KiB tmpfs (root only), and a function that fills it until `free` bytes are left; unmounted after."""
    import shutil

    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("needs root to mount a small tmpfs")
    where = tmp_path / "disk"
    where.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(where)], capture_output=True)
    if mounted.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode(errors='replace').strip()}")

    def fill(free: int) -> None:
        with open(where / "filler", "ab") as handle:
            while os.statvfs(where).f_bavail * os.statvfs(where).f_frsize > free:
                try:
                    handle.write(b"\0" * 1024)
                    handle.flush()
                except OSError:
                    break

    try:
        yield where, fill
    finally:
        subprocess.run(["umount", str(where)], capture_output=True)


def test_append_on_a_full_disk_leaves_the_users_file_whole(small_disk, capsys):
    """predict --append onto a file when the disk fills part way: every line it holds is whole, the user's
    lines first (issue 48: a torn last line was left in it)."""
    where, fill = small_disk
    mine = where / "mine.jsonl"
    write_lines(mine, records(worlds=(2,)))
    before = mine.read_bytes()
    fill(4096)
    code, _, err = run(capsys, "predict", "--hw", "dgx-a100", "--topology", "2x8", "--sizes", "1K-1G", "--json",
                       mine, "--append")
    assert (code, err) == (2, f"commbench: error: cannot write {mine}: No space left on device\n")
    after = mine.read_bytes()
    assert after.startswith(before) and after.endswith(b"\n")
    assert len(read_records(str(mine))) == after.count(b"\n")


@pytest.mark.parametrize("command", [
    ["sweep", "--backend", "shm", "-N", "2", "--sizes", "1K-1M"],
    ["proxy", "tts_angular", "--nprocs", "2", "--backend", "shm", "--compute", "flops", "--tflops", "0.05",
     "--steps", "2", "--warmup-steps", "1"],
])
@pytest.mark.parametrize("free", [0, 4096])
def test_a_full_disk_under_spawned_ranks_is_one_line_and_exit_2(small_disk, command, free):
    """Rank 0's results file fills the disk: one line naming it (and its peer's about rank 0), exit 2, the
    file's lines whole (issue 48: a traceback in the spawner, exit 1, when the summary did not fit)."""
    from conftest import commbench, said_lines

    where, fill = small_disk
    path = where / "r.jsonl"
    fill(free)
    out = commbench(*command, "--json", str(path), "--timeout", "60", timeout=300)
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr
    said = said_lines(out.stderr)
    assert said[0] == f"commbench: rank 0: cannot write {path}: No space left on device", said
    assert len(said) <= 2, said  # and rank 1's, that rank 0 ended
    data = path.read_bytes() if path.exists() else b""
    assert not data or data.endswith(b"\n")
    read_records(str(path)) if data else None


def test_a_device_that_cannot_fsync_is_a_fine_output(capsys):
    code, _, err = run(capsys, "predict", "--hw", "dgx-a100", "--topology", "1x2", "--sizes", "1K",
                       "--json", "/dev/null")
    assert (code, err) == (0, "")


def test_the_sink_keeps_what_it_wrote_when_a_write_fails(tmp_path, monkeypatch):
    path = tmp_path / "r.jsonl"
    point = Result.from_dict({**records()[0], "device": "cpu", "requested_nbytes": 1024, "warmup": 0, "iters": 1,
                              "algbw_gbps": 1.0, "p50_us": 1.0, "p90_us": 1.0, "p99_us": 1.0, "min_us": 1.0,
                              "max_us": 1.0, "rank_agg": "max"})
    sink = ResultSink(str(path))
    sink.header({"run_id": "x"})
    sink.result(point)

    def full(_fd, _data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr("commbench.results.sink._write_some", full)  # the sink's one write (os.write)
    with pytest.raises(OutputError) as failure:
        sink.result(point)
    assert str(failure.value) == f"cannot write {path}: No space left on device"
    assert failure.value.filename == str(path)  # the job's one line for a rank: "PATH: reason"
    assert [r["record"] for r in read_records(str(path))] == ["header", "result"]


def test_one_path_for_two_outputs_or_an_output_over_an_input_is_refused(tmp_path, capsys):
    same = tmp_path / "same.out"
    code, _, err = run(capsys, "sweep", "--backend", "sim", "-N", "2", "--hw", "dgx-a100", "--sizes", "1K",
                       "--json", same, "--csv", same)
    assert (code, err) == (2, f"commbench: error: --csv {same}: the same file as --json; give each output a file "
                              "of its own\n")
    assert not same.exists()
    link = tmp_path / "link.out"
    link.symlink_to(same)
    code, _, err = run(capsys, "sweep", "--backend", "sim", "-N", "2", "--hw", "dgx-a100", "--sizes", "1K",
                       "--json", same, "--csv", link)
    assert code == 2 and "the same file as --json" in err
    good = write_lines(tmp_path / "good.jsonl", records())
    before = good.read_text()
    code, _, err = run(capsys, "fit", good, "-o", good)
    assert (code, err) == (2, f"commbench: error: -o {good}: that is an input file, which writing would overwrite\n")
    code, _, err = run(capsys, "compare", good, good, "--metric", "time", "--json", good)
    assert code == 2 and "that is an input file" in err
    assert good.read_text() == before


def test_the_up_front_check_truncates_nothing_and_leaves_nothing(tmp_path):
    existing = tmp_path / "old.jsonl"
    existing.write_text('{"record": "header", "keep": "me"}\n')
    check_writable(str(existing), append=True)
    assert existing.read_text() == '{"record": "header", "keep": "me"}\n'
    fresh = tmp_path / "sub" / "new.jsonl"
    check_writable(str(fresh))
    assert not fresh.exists() and fresh.parent.is_dir()  # the directory is the run's, as before


def test_an_immutable_file_is_refused_as_root(tmp_path, capsys):
    target = tmp_path / "frozen.jsonl"
    target.write_text("")
    try:
        made = subprocess.run(["chattr", "+i", str(target)], capture_output=True).returncode == 0
    except FileNotFoundError:
        made = False
    if not made:
        pytest.skip("chattr +i is not available here")
    try:
        code, _, err = run(capsys, "proxy", "resnet50", "--backend", "sim", "--nodes", "1", "--gpus-per-node", "2",
                           "--hw", "dgx-a100", "--tflops", "100", "--steps", "2", "--json", target)
        assert (code, err) == (2, f"commbench: error: cannot write {target}: Operation not permitted\n")
    finally:
        subprocess.run(["chattr", "-i", str(target)], capture_output=True)


# ---------------------------------------------------------------- outputs that hold something, devices (issue 26)


@pytest.fixture
def no_ranks(monkeypatch):
    """A refusal comes before any rank: a run that got past the checks ends here, not in real ranks."""
    from commbench import job

    monkeypatch.setattr(job, "run", lambda *args, **kwargs: 0)


def _writers(tmp_path, good, out):
    """Every command that writes a file, as argv with its output `out`, stopping short of heavy work."""
    return {
        "sweep --json": ["sweep", "--backend", "sim", "-N", "2", "--hw", "dgx-a100", "--sizes", "1K", "--json", out],
        "sweep --csv": ["sweep", "--backend", "sim", "-N", "2", "--hw", "dgx-a100", "--sizes", "1K", "--csv", out],
        "fit -o": ["fit", good, "-o", out],
        "predict --json": ["predict", "--hw", "dgx-a100", "--topology", "1x2", "--sizes", "1K", "--json", out],
        "predict-scaling --json": ["predict-scaling", "resnet50", "--hw", "dgx-a100", "--gpus", "1,8", "--json", out],
        "check --json": ["check", good, "--hw", "dgx-a100", "--json", out],
        "compare --json": ["compare", good, good, "--metric", "time", "--json", out],
        "compare --plot": ["compare", good, good, "--metric", "time", "--plot", out + ".png"],
        "profiles extract -o": ["profiles", "extract", "resnet18", "-o", out],
        "proxy --json": ["proxy", "resnet18", "--backend", "sim", "--hw", "dgx-a100", "--tflops", "100", "--nodes",
                         "1", "--gpus-per-node", "2", "--steps", "1", "--json", out],
        "nccl-tests -J": ["nccl-tests", "all_reduce_perf", "-b", "1K", "-e", "1K", "-J", out],
    }


@pytest.mark.parametrize("writer", ["sweep --json", "sweep --csv", "fit -o", "predict --json", "predict-scaling --json",
                                    "check --json", "compare --json", "compare --plot", "profiles extract -o",
                                    "proxy --json", "nccl-tests -J"])
def test_an_output_that_holds_something_is_refused_and_kept(tmp_path, capsys, writer, no_ranks):
    good = write_lines(tmp_path / "good.jsonl", records())
    precious = tmp_path / "precious.out"
    argv = _writers(tmp_path, str(good), str(precious))[writer]
    target = tmp_path / "precious.out.png" if writer == "compare --plot" else precious
    target.write_text("16 lines of results\n")
    code, _, err = run(capsys, *argv)
    appendable = writer in ("sweep --json", "sweep --csv", "predict --json", "predict-scaling --json", "check --json",
                            "compare --json", "nccl-tests -J")
    leave = "--force to overwrite it" + (" or --append to add to it" if appendable else "")
    assert code == 2 and err.endswith(f" {target}: the file exists and is not empty; give a new name, or add "
                                      f"{leave}\n"), err
    assert err.count("\n") == 1 and target.read_text() == "16 lines of results\n"


APPENDABLE = ("sweep --json", "sweep --csv", "predict --json", "predict-scaling --json", "check --json",
              "compare --json", "nccl-tests -J")


@pytest.mark.parametrize("writer", APPENDABLE)
@pytest.mark.parametrize("foreign", ["a,b\n1,2\n", "hello\n", '["a list"]\n'])
def test_append_refuses_a_file_that_is_not_commbench_results(tmp_path, capsys, writer, foreign, no_ranks):
    """`--csv ex.csv --append` added 39-column rows under another tool's header `a,b` (exit 0, the file damaged),
    and `--json --append` added records after any text (issue 32). Another header, or a first line that is no
    record, is one line and exit 2, the file as it was."""
    good = write_lines(tmp_path / "good.jsonl", records())
    target = tmp_path / "theirs.out"
    target.write_text(foreign)
    argv = _writers(tmp_path, str(good), str(target))[writer]
    argv = [argv[0], "--append", *argv[1:]]  # nccl-tests takes commbench's flags before the binary's name
    code, _, err = run(capsys, *argv)
    option = writer.split()[1]
    assert code == 2 and err.startswith(f"commbench: error: {option} {target}: --append adds to a commbench results "
                                        f"file, but "), err
    assert err.count("\n") == 1 and target.read_text() == foreign


def test_append_takes_a_file_of_its_own_kind(tmp_path, capsys):
    """A CSV that commbench wrote takes the next run's rows under its one header; the JSON Lines beside it its
    records; a CSV header of other columns (another version's) is refused."""
    from commbench.results import CSV_HEADER

    csv_out, json_out = tmp_path / "r.csv", tmp_path / "r.jsonl"
    sweep = ["sweep", "--backend", "sim", "-N", "2", "--hw", "dgx-a100", "--sizes", "1K", "--csv", csv_out,
             "--json", json_out]
    assert run(capsys, *sweep)[0] == 0
    rows = csv_out.read_text().splitlines()
    assert run(capsys, *sweep, "--append")[0] == 0
    again = csv_out.read_text().splitlines()
    assert again[:len(rows)] == rows and len(again) == 2 * len(rows) - 1 and again.count(CSV_HEADER) == 1
    older = tmp_path / "older.csv"
    older.write_text(CSV_HEADER.rsplit(",", 1)[0] + "\r\n")  # one column fewer
    code, _, err = run(capsys, *sweep[:-4], "--csv", older, "--append")
    assert code == 2 and "is not the header of commbench's results CSV" in err


def test_report_refuses_to_overwrite_its_index(tmp_path, capsys):
    good = write_lines(tmp_path / "good.jsonl", records())
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "index.md").write_text("my notes\n")
    code, _, err = run(capsys, "report", good, "-o", tmp_path / "r")
    assert code == 2 and "index.md: the file exists and is not empty" in err
    assert (tmp_path / "r" / "index.md").read_text() == "my notes\n"


@pytest.mark.parametrize("flag", ["--force", "--append"])
def test_force_overwrites_and_append_adds_a_run(tmp_path, capsys, flag):
    out = tmp_path / "r.jsonl"
    sweep = ["sweep", "--backend", "sim", "-N", "2", "--hw", "dgx-a100", "--sizes", "1K", "--json", out]
    assert run(capsys, *sweep)[0] == 0
    first = out.read_text()
    assert run(capsys, *sweep, flag)[0] == 0
    runs = [r for r in read_records(str(out)) if r["record"] == "header"]
    assert len(runs) == (2 if flag == "--append" else 1) and out.read_text().startswith(first) == (flag == "--append")
    code, _, err = run(capsys, *sweep, "--force", "--append")
    assert (code, err) == (2, "commbench: error: --force and --append: choose one (overwrite, or add to the file)\n")


def test_append_after_a_killed_run_drops_its_torn_line_first(tmp_path, capsys):
    """A run killed mid-line leaves a fragment; a header appended onto it made every reader refuse the file."""
    out = tmp_path / "r.jsonl"
    sweep = ["sweep", "--backend", "sim", "-N", "2", "--hw", "dgx-a100", "--sizes", "1K", "--json", out]
    assert run(capsys, *sweep)[0] == 0
    out.write_bytes(out.read_bytes()[:-30])  # the summary line cut short
    assert run(capsys, *sweep, "--append")[0] == 0
    records = read_records(str(out))  # every line whole: no RecordError
    assert [r["record"] for r in records].count("header") == 2


@pytest.mark.parametrize("writer", ["sweep --json", "sweep --csv", "fit -o", "check --json", "compare --json",
                                    "profiles extract -o", "nccl-tests -J"])
@pytest.mark.parametrize("device", ["/dev/zero", "/dev/full", "fifo", ""])
def test_a_device_fifo_or_empty_name_is_refused_as_an_output(tmp_path, capsys, writer, device, no_ranks):
    """`--json /dev/full` grew a sweep to 20 GB (the record closing read /dev/zero back); `--json ''` wrote nothing."""
    if device == "fifo":
        device = str(tmp_path / "fifo")
        os.mkfifo(device)
    elif device and not os.path.exists(device):
        pytest.skip(f"no {device}")
    good = write_lines(tmp_path / "good.jsonl", records())
    code, _, err = run(capsys, *_writers(tmp_path, str(good), device)[writer])
    reason = "an empty value" if not device else "not a regular file (a device, FIFO or directory)"
    assert code == 2 and reason in err and err.count("\n") == 1, err


def test_the_record_closing_reads_no_device_back(tmp_path):
    """A failed spawn closes --json's records; given /dev/zero it read the device without end (20 GB)."""
    import sys

    script = ("import resource; resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30)); "
              "from commbench import job; from commbench.bench import SWEEP_JOB; "
              "job.close_records(SWEEP_JOB, '/dev/zero'); print('done')")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert (proc.returncode, proc.stdout) == (0, "done\n"), proc.stderr[-500:]


def test_the_record_closing_sums_up_only_the_appended_run(tmp_path, capsys):
    from commbench import job

    out = tmp_path / "r.jsonl"
    sweep = ["sweep", "--backend", "sim", "-N", "2", "--hw", "dgx-a100", "--sizes", "1K,4K", "--json", out]
    assert run(capsys, *sweep)[0] == 0
    earlier = out.read_text().splitlines()
    out.write_text("\n".join([*earlier, earlier[0], earlier[1]]) + "\n{\"record\": \"res")  # a second run, killed
    from commbench.bench import SWEEP_JOB

    job.close_records(SWEEP_JOB, str(out))
    summary = read_records(str(out))[-1]
    assert summary["record"] == "summary" and summary["status"] == "failed" and summary["points"] == 1


# ---------------------------------------------------------------- silently accepted or unclear (issue 26, item 9)


@pytest.mark.parametrize("args,message", [
    (["selftest", "--timeout", "nan"], "--timeout nan: must be a finite number"),
    (["selftest", "--timeout", "inf"], "--timeout inf: must be a finite number"),
    (["selftest", "--timeout", "1e308"], "--timeout 1e+308: must be at most 604800"),
    (["selftest", "--timeout", "0.001"], "--timeout 0.001: must be at least 1"),
    (["sweep", "--sizes", "-1"], "bad --sizes '-1': sizes are positive numbers of bytes, and a range is START-END "
                                 "with both ends (e.g. 1K-1M)"),
    (["predict", "--hw", "dgx-a100", "-T", "1x2", "--sizes", "1K-"], "bad --sizes '1K-': sizes are positive numbers "
                                                                     "of bytes, and a range is START-END with both "
                                                                     "ends (e.g. 1K-1M)"),
    (["sweep", "--sizes", "1K", "--emulate", ""], "--emulate '': an empty value"),
    (["sweep", "--sizes", "1K", "--emulate", "2x1", "--link", ""], "--link '': an empty value"),
    (["sweep", "--sizes", "1K", "--json", ""], "--json '': an empty value"),
    (["proxy", "resnet18", "--emulate", "", "--tflops", "1"], "--emulate '': an empty value"),
])
def test_what_was_taken_silently_or_failed_oddly_is_one_line(capsys, no_ranks, args, message):
    """`selftest --timeout nan` failed its checks with Python's errors (exit 1); `--sizes -1` said "bad size ''";
    `--emulate ''` ran locally, `--link ''` took the default, `--json ''` wrote nothing."""
    code, out, err = run(capsys, *args)
    assert (code, err) == (2, f"commbench: error: {message}\n")
