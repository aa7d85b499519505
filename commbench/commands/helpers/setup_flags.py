"""The training-setup options, spelled alike on `proxy`, `train` and `predict-scaling`:
`--setup NAME` and one flag per knob of proxies/setups.py (a knob the setup does not take is
one line and exit 2)."""
from __future__ import annotations

import click

from commbench.commands.helpers.common import UsageFault

SETUP_HELP = ("Training setup (docs/setups.md): ddp, ddp-fp16, ddp-bf16, apex, horovod, zero1, zero2, fsdp-full, "
              "fsdp-grad-op, fsdp-hybrid.")


def knob_options(prefix: str = "") -> list:
    """One click option per setup knob except --bucket-mb (which the commands already have)."""
    from commbench.proxies.setups import KNOBS

    out = []
    for knob in KNOBS.values():
        if knob.name == "bucket_mb":
            continue
        flag = "--" + prefix + knob.name.replace("_", "-")
        kind = click.Choice(list(knob.choices)) if knob.choices else knob.kind
        default = "" if knob.default is None else f" [setup's default: {knob.default}]"
        out.append(click.option(flag, knob.name, type=kind, default=None, help=knob.help.capitalize() + default))
    return out


def setup_options(fn):
    """--setup and the knobs."""
    # the default is setups.DEFAULT_SETUP, spelled here: importing the table would cost every command's start-up
    options = [click.option("--setup", "setup", default="ddp", show_default=True, metavar="NAME", help=SETUP_HELP),
               *knob_options()]
    for option in reversed(options):
        fn = option(fn)
    return fn


def given_knobs(options: dict) -> dict:
    """The knobs given on the command line (bucket_mb included), by knob name."""
    from commbench.proxies.setups import KNOBS

    return {name: options.get(name) for name in KNOBS if options.get(name) is not None}


def settle_setup(name: str, options: dict, nodes: int | None = None, ranks_per_node: int | None = None,
                 device: str = "cuda", world: int | None = None):
    """The setup with its knobs checked against the layout (when known; `world`: the job's ranks, which nodes of
    unequal size make other than nodes x ranks per node): a Choice, or one line and exit 2."""
    from commbench.proxies.setups import Placement, SetupError, settle

    layout = Placement(nodes, ranks_per_node, device) if nodes and ranks_per_node else None
    try:
        choice = settle(name, given_knobs(options), layout)
    except SetupError as exc:
        raise UsageFault(str(exc)) from exc
    if layout and world and world != layout.world and dict(choice.knobs).get("shard_group") == "node":
        raise UsageFault(f"setup {name}: shards span a node of {ranks_per_node} ranks, which does not divide "
                         f"{world} ranks")
    return choice


def check_trainable(choice) -> None:
    """`train` (and `proxy --validate`) run a setup for real: one line and exit 2 for one they cannot."""
    if not choice.setup.trains_as:
        raise UsageFault(f"setup {choice.name} does not train here: "
                         f"{choice.setup.trains_instead or 'no real form of it runs in commbench train'}")
