"""sweep's command line as one typed, frozen value (commands/sweep_options.py): built once from click's
parameters, every option a field and every field an option, with click's defaults."""
from __future__ import annotations

from dataclasses import FrozenInstanceError, fields

import pytest

from commbench.commands.sweep import sweep
from commbench.commands.sweep_options import SweepOptions


def test_every_option_is_a_field_and_every_field_an_option():
    assert {p.name for p in sweep.params} == {f.name for f in fields(SweepOptions)}


def test_the_fields_default_as_the_options_do():
    """A command line without options gives the value a caller gets without arguments (nccl-tests builds
    its sweeps from click; library callers from the dataclass: the two must agree)."""
    assert SweepOptions.from_click(sweep.make_context("sweep", []).params) == SweepOptions()


def test_the_options_are_read_as_typed_fields_and_cannot_be_changed():
    o = SweepOptions.from_click(sweep.make_context("sweep", ["-c", "allgather", "-c", "reduce_scatter", "-n", "3",
                                                             "--blocking", "1"]).params)
    assert (o.collective_names, o.iters, o.blocking, o.backend) == (("allgather", "reduce_scatter"), 3, "1", "torch")
    with pytest.raises(FrozenInstanceError):
        o.iters = 4


def test_an_option_without_its_field_fails_at_once():
    with pytest.raises(TypeError, match="no_such_option"):
        SweepOptions.from_click({**sweep.make_context("sweep", []).params, "no_such_option": 1})
