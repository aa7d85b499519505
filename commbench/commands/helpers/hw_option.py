"""`--hw FILE|PRESET`: one option, one loader, one error mapping and one poor-fit warning for every command that
reads a hardware file (sweep and tune for sim, proxy, replay, predict, predict-scaling, check, report, compute).

The option checks its value as it is parsed (a file or preset that cannot be read is one line, exit 2, before
anything runs) and keeps what it loaded for the command, so `load_hw` in the command's body hands the same
Hardware back rather than reading the file again, and says a poor fit there, once, where the command is ready.
"""
from __future__ import annotations

import click

from commbench.commands.helpers.common import UsageFault

CACHE_KEY = "commbench.hardware"  # click's per-invocation meta: {spec: Hardware}


class HardwareOption(click.Option):
    """The --hw option (a class of its own, so a test can find every command's --hw and see it is this one)."""


def hw_option(help: str, required: bool = False, name: str = "hw_spec"):
    """The --hw option of a command, its value the spec as given (checked and loaded on parsing)."""
    return click.option("--hw", name, cls=HardwareOption, required=required, default=None, metavar="FILE|PRESET",
                        help=help, callback=_parsed)


def _parsed(ctx: click.Context, _param, spec: str | None) -> str | None:
    if spec is not None:
        ctx.meta.setdefault(CACHE_KEY, {})[spec] = _load(spec)
    return spec


def _load(spec: str):
    from commbench.costmodel import HardwareError, load_hardware

    try:
        return load_hardware(spec)
    except HardwareError as exc:
        raise UsageFault(str(exc)) from exc


def load_hw(spec: str, say_poor: bool = True):
    """The Hardware of `spec`: the one --hw loaded while parsing, else read now (UsageFault: one line, exit 2);
    a file `fit --accept-poor-fit` wrote said to be a poor fit (warn_poor) unless `say_poor` is False."""
    ctx = click.get_current_context(silent=True)
    cache = ctx.meta.get(CACHE_KEY, {}) if ctx is not None else {}
    hw = cache[spec] if spec in cache else _load(spec)
    if say_poor:
        warn_poor(hw, spec)
    return hw


def warn_poor(hw, spec: str | None) -> None:
    """A hardware file `fit --accept-poor-fit` wrote is used, and said to be poor, every time; one fitted from
    runs on a busy host (fit's `meta.fitted_under_load`) is said to hold that load."""
    if hw is not None and hw.meta.get("poor_fit"):
        click.echo(f"commbench: warning: {spec} is a poor fit ({hw.meta['poor_fit']}): its predictions do not "
                   f"describe the sweep it came from", err=True)
    if hw is not None and hw.meta.get("fitted_under_load"):
        click.echo(f"commbench: warning: {spec} was fitted from runs under load ({hw.meta['fitted_under_load']}): "
                   f"its figures hold that load", err=True)
