"""report's command line as one typed, frozen value (commands/report.py's ReportOptions): built once from
click's parameters, every option a field and every field an option, with click's defaults."""
from __future__ import annotations

from dataclasses import FrozenInstanceError, fields

import pytest

from commbench.commands.report import ReportOptions, report_command


def test_every_option_is_a_field_and_every_field_an_option():
    assert {p.name for p in report_command.params} == {f.name for f in fields(ReportOptions)}


def test_the_fields_default_as_the_options_do(tmp_path):
    run = tmp_path / "run.jsonl"
    run.write_text("")
    params = report_command.make_context("report", [str(run)]).params
    assert ReportOptions.from_click(params) == ReportOptions(files=(str(run),))


def test_the_options_are_read_as_typed_fields_and_cannot_be_changed(tmp_path):
    runs = [tmp_path / "a.jsonl", tmp_path / "b.jsonl"]
    for run in runs:
        run.write_text("")
    o = ReportOptions.from_click(report_command.make_context(
        "report", [*map(str, runs), "--stragglers", "--spike", "5", "--json", "s.json"]).params)
    assert (o.files, o.stragglers, o.spike_factor, o.json_path, o.out_dir) == (
        tuple(map(str, runs)), True, 5.0, "s.json", None)
    with pytest.raises(FrozenInstanceError):
        o.stragglers = False
