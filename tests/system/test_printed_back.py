"""What files hold, printed back (issue 48, items 18 and 22): a hardware file's name and evidence, a trace's
event names, a results file's fields, as commbench prints them, in a table, a note, an error line or a figure.
A newline, a terminal escape or a lone surrogate a file holds is printed as its escape (files.shown): it
forges no output line and ends no command in a UnicodeEncodeError or a matplotlib traceback. The commands run
as users run them (`python -m commbench`), so the output streams are the process's own."""
import gzip
import json
import os

import pytest
from conftest import REPO, commbench

from commbench.costmodel import PRESET_DIR

HOSTILE = "ev\x1b[2J\x1b]52;c;cm0gLXJmIH4=\x07\n# forged line\u202e"  # clears the screen, writes the clipboard
SURROGATE = "sur\ud800"
TRACES = REPO / "tests" / "data" / "traces"


def escaped(text: str) -> str:
    """What the output must hold for `text`: each character that is not printable as its escape."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


@pytest.mark.parametrize("text,printed", [
    ("plain, é and 中", "plain, é and 中"),
    ("a\nb\rc\td", "a\\nb\\rc\\td"),
    ("\x1b[31mred", "\\x1b[31mred"),
    ("lone \ud800", "lone \\ud800"),
    ("bidi \u202eright", "bidi \\u202eright"),
    (3, "3"),
])
def test_what_a_file_holds_is_printed_escaped(text, printed):
    from commbench.files import shown

    assert shown(text) == printed
    assert shown(shown(text)) == shown(text)  # escaping twice changes nothing


def test_a_records_strings_are_escaped_at_every_depth_and_its_numbers_kept():
    from commbench.files import shown_values

    record = {"backend": "a\nb", "hosts": ["h\x1b"], "config": {"k\ud800": [1.5, {"x": "\x07"}]}, "n": 3}
    assert shown_values(record) == {"backend": "a\\nb", "hosts": ["h\\x1b"],
                                    "config": {"k\\ud800": [1.5, {"x": "\\x07"}]}, "n": 3}


def _hardware(path, name="dgx-h100", evidence="a benchmark"):
    data = json.loads(open(os.path.join(PRESET_DIR, "dgx-h100.json"), encoding="utf-8").read())
    data["name"] = name
    data["step_terms"] = {"step_cv": {"value": 0.01, "source": "measured", "evidence": evidence}}
    path.write_text(json.dumps(data), encoding="utf-8")  # json.dumps writes \ud800 as its escape: valid JSON
    return path


def _forges_nothing(out):
    """No line of `out` starts where the file's text put a line break, and no control character got out."""
    assert "Traceback" not in out
    assert not [line for line in out.splitlines() if line.startswith("# forged")], out
    assert not any(ch in out for ch in "\x1b\x07\u202e"), out


def test_a_hardware_files_evidence_is_printed_escaped(tmp_path):
    hw = _hardware(tmp_path / "hw.json", evidence=HOSTILE)
    out = commbench("predict-scaling", "resnet50", "--gpus", "8,16", "--hw", str(hw))
    assert out.returncode == 0, out.stderr[-2000:]
    _forges_nothing(out.stdout + out.stderr)
    assert "ev\\x1b[2J" in out.stdout and "\\n# forged line" in out.stdout  # said, escaped


def test_a_lone_surrogate_in_a_hardware_file_is_printed_escaped(tmp_path):
    hw = _hardware(tmp_path / "hw.json", name=SURROGATE, evidence=SURROGATE)
    out = commbench("predict-scaling", "resnet50", "--gpus", "8,16", "--hw", str(hw))
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert "sur\\ud800" in out.stdout


def _results(path, backend):
    """A 2-rank shm sweep's results, their backend as a hostile file would have it."""
    from test_inputs import records

    lines = [{"record": "header", "run_id": "x", "hosts": [backend]}] + \
        [dict(r, backend=backend, library=backend) for r in records(worlds=(2,))]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    return path


@pytest.mark.parametrize("backend", [HOSTILE, SURROGATE])
def test_check_prints_a_results_files_strings_escaped(tmp_path, backend):
    results = _results(tmp_path / "r.jsonl", backend)
    out = commbench("check", str(results), "--hw", "dgx-a100")
    assert out.returncode == 0, out.stderr[-2000:]
    _forges_nothing(out.stdout + out.stderr)
    assert escaped(backend) in out.stdout


@pytest.mark.parametrize("backend", [HOSTILE, SURROGATE])
def test_report_draws_a_results_files_strings_escaped(tmp_path, backend):
    results = _results(tmp_path / "r.jsonl", backend)
    out = commbench("report", str(results), "-o", str(tmp_path / "report"))
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr[-2000:]
    index = (tmp_path / "report" / "index.md").read_text(encoding="utf-8")
    assert escaped(backend) in index and "\n# forged" not in index
    assert (tmp_path / "report" / "allreduce.png").stat().st_size > 0


def _trace_pair(tmp_path, name):
    """The recorded 2-rank DDP trace, each rank holding one more call of a collective named `name`."""
    paths = []
    for rank in (0, 1):
        data = json.loads(gzip.open(TRACES / f"ddp_2rank_gloo_rank{rank}.json.gz").read())
        call = next(e for e in data["traceEvents"] if e.get("name") == "c10d::allreduce_")
        data["traceEvents"].append(dict(call, name=name))
        path = tmp_path / f"rank{rank}.json"
        path.write_text(json.dumps(data), encoding="utf-8")
        paths.append(str(path))
    return paths


@pytest.mark.parametrize("name", [f"c10d::{HOSTILE}", f"c10d::{SURROGATE}"])
def test_replay_prints_a_traces_names_escaped(tmp_path, name):
    out = commbench("replay", *_trace_pair(tmp_path, name), "--table-only")
    assert out.returncode == 0, out.stderr[-2000:]
    _forges_nothing(out.stdout + out.stderr)
    assert "left out (not replayed): 1 " + escaped(name) in out.stdout


def test_an_error_line_naming_what_a_file_holds_stays_one_line(tmp_path):
    """check's refusal names the hardware: its name, from the file, escaped in the one error line."""
    from test_inputs import records

    hw = _hardware(tmp_path / "hw.json", name=HOSTILE)
    unpredictable = tmp_path / "a2a.jsonl"  # a point of a collective the model has no schedule for
    unpredictable.write_text(json.dumps(dict(records(worlds=(2,))[0], collective="alltoall")) + "\n")
    out = commbench("check", str(unpredictable), "--hw", str(hw))
    assert out.returncode == 2, out.stderr
    assert out.stderr.count("\n") == 1 and escaped(HOSTILE) in out.stderr, out.stderr
    _forges_nothing(out.stderr)
