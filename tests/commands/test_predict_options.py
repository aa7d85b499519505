"""predict's command line as one typed, frozen value (commands/predict.py's PredictOptions): built once from
click's parameters, every option a field and every field an option, with click's defaults."""
from __future__ import annotations

from dataclasses import FrozenInstanceError, fields

import pytest

from commbench.commands.predict import PredictOptions, predict_command


def test_every_option_is_a_field_and_every_field_an_option():
    assert {p.name for p in predict_command.params} == {f.name for f in fields(PredictOptions)}


def test_the_fields_default_as_the_options_do():
    params = predict_command.make_context("predict", ["--hw", "dgx-a100"]).params
    assert PredictOptions.from_click(params) == PredictOptions(hw_spec="dgx-a100")


def test_the_options_are_read_as_typed_fields_and_cannot_be_changed():
    o = PredictOptions.from_click(predict_command.make_context(
        "predict", ["--hw", "dgx-a100", "-c", "allgather", "-T", "2x8", "--root", "3", "--tuning", "t.json"]).params)
    assert (o.hw_spec, o.collective_names, o.topology, o.root, o.tuning_path, o.sizes) == (
        "dgx-a100", ("allgather",), "2x8", 3, "t.json", "1K-1G")
    with pytest.raises(FrozenInstanceError):
        o.root = 0


def test_an_option_without_its_field_fails_at_once():
    params = predict_command.make_context("predict", ["--hw", "dgx-a100"]).params
    with pytest.raises(TypeError, match="no_such_option"):
        PredictOptions.from_click({**params, "no_such_option": 1})
