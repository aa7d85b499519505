"""proxy's and train's command lines as one typed, frozen value (commands/proxy_options.py), built once from
click's parameters; the backend's options settled once from it (commands/proxy_plan.py). The options proxy
shares with sweep are declared once, in their base (commands/helpers/ranks_options.py)."""
from __future__ import annotations

from dataclasses import fields

import pytest

from commbench.commands.helpers.ranks_options import RanksOptions
from commbench.commands.proxy import proxy_command, train_command
from commbench.commands.proxy_options import ProxyOptions
from commbench.commands.sweep import sweep
from commbench.commands.sweep_options import SweepOptions
from commbench.proxies.setups import KNOBS

OWN = {"knobs", "train"}  # fields no option fills: the knobs gathered, and which command it is


def test_every_proxy_option_is_a_field_or_a_knob_and_every_field_an_option():
    names = {f.name for f in fields(ProxyOptions)}
    proxy, train = {p.name for p in proxy_command.params}, {p.name for p in train_command.params}
    assert proxy - names <= set(KNOBS) and train - names <= set(KNOBS)
    assert names - OWN == (proxy | train) - (set(KNOBS) - {"bucket_mb"})


@pytest.mark.parametrize("command", [proxy_command, train_command], ids=["proxy", "train"])
def test_the_fields_default_as_the_options_do(command):
    o = ProxyOptions.from_click(command.make_context(command.name, ["resnet18"]).params)
    assert o == ProxyOptions(model="resnet18")


def test_the_knobs_given_are_gathered_with_bucket_mb():
    params = proxy_command.make_context("proxy", ["m", "--accumulate", "4", "--bucket-mb", "10"]).params
    o = ProxyOptions.from_click(params)
    assert o.knobs == (("accumulate", 4),)
    assert o.given_knobs() == {"accumulate": 4, "bucket_mb": 10.0}


def test_train_keeps_the_defaults_of_what_it_has_no_option_for():
    o = ProxyOptions.from_click(train_command.make_context("train", ["resnet18", "--amp"]).params, train=True)
    assert (o.train, o.amp, o.backend, o.algorithm, o.nodes, o.hw, o.compute, o.validate) == (
        True, True, "torch", "auto", None, None, None, False)


def test_the_backend_is_resolved_and_settled_once(monkeypatch):
    """make_config built the backend's request three times and resolved its device twice."""
    from commbench.backends.torch_dist import TorchBackend
    from commbench.commands import proxy_plan

    calls = {"resolve_device": 0, "settle": 0}
    for name in calls:
        original = getattr(TorchBackend, name).__func__

        def counted(cls, *args, _name=name, _original=original):
            calls[_name] += 1
            return _original(cls, *args)

        monkeypatch.setattr(TorchBackend, name, classmethod(counted))
    params = proxy_command.make_context("proxy", ["resnet18", "-N", "2", "--tflops", "1", "--device", "cpu"]).params
    cfg, plan = proxy_plan.make_config(ProxyOptions.from_click(params))
    assert calls == {"resolve_device": 1, "settle": 1}
    assert (plan.mode, plan.world, cfg.backend.backend, cfg.backend.device, cfg.backend.nprocs) == (
        "spawn", 2, "torch", "cpu", 2)


BASE = {f.name for f in fields(RanksOptions)}


def test_the_base_holds_exactly_the_options_sweep_and_proxy_both_take():
    assert BASE == {p.name for p in sweep.params} & {p.name for p in proxy_command.params}


@pytest.mark.parametrize("options", [SweepOptions, ProxyOptions])
def test_each_shared_option_is_declared_once_in_the_base(options):
    assert options.__mro__[1] is RanksOptions
    assert not BASE & set(vars(options)["__annotations__"])


@pytest.mark.parametrize("command,args", [(sweep, []), (proxy_command, ["m"])], ids=["sweep", "proxy"])
def test_the_base_defaults_as_both_commands_options_do(command, args):
    given = command.make_context(command.name, args).params  # a command line without options
    assert {name: given[name] for name in BASE} == {f.name: f.default for f in fields(RanksOptions)}
