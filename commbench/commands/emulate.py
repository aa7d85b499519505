"""`--emulate NODESxRANKS --link RATE` on sweep, proxy and train, and the `commbench emulate` group
(up, status, down, clean) for a cluster that outlives one run (commbench/emulate.py builds it,
commbench/emulated_run.py runs a job on it)."""
from __future__ import annotations

import os
import shlex
import time

import click

from commbench.commands.helpers.common import UsageFault

DEFAULT_LINK = "1gbit"

EMULATE_EXAMPLES = """
\b
Examples:
  commbench sweep --emulate 2x2 --link 1gbit            # 2 nodes of 2 ranks, 1 Gbit/s NICs, one run
  commbench proxy bert-base --emulate 2x2 --link 2gbit --compute flops --tflops 0.5
  commbench emulate up 2x1 --link 100mbit               # keep a cluster for torchrun/mpirun by hand
  commbench emulate status                              # clusters, their links, how to launch on them
  commbench emulate down TAG                            # remove one (or: down --all; down: what dead runs left)
  commbench emulate clean                               # remove what killed runs left behind

Needs root (or CAP_NET_ADMIN) and iproute2's ip and tc. docs/emulation.md.
"""


def emulate_options(function):
    """The two options of every command that runs ranks on an emulated cluster."""
    function = click.option(
        "--link", default=None, metavar="RATE",
        help=f"--emulate: each node's NIC rate, both directions, in tc's units (100mbit, 1gbit, 2.5gbit) "
             f"[default: {DEFAULT_LINK}].")(function)
    return click.option(
        "--emulate", default=None, metavar="NODESxRANKS",
        help="Run on an emulated cluster of this host: NODES network namespaces joined by a switch, "
             "RANKS ranks each, links limited to --link; one torchrun per node. Needs root "
             "(docs/emulation.md).")(function)


def emulated_shape(emulate: str | None, link: str | None, conflicts: dict[str, object]) -> tuple[int, int, int] | None:
    """(nodes, ranks per node, link bit/s) when --emulate is given, else None (and --link refused).
    Options that say the scale or the launch another way are refused beside it, one line."""
    from commbench.emulate import EmulateError, parse_rate, parse_shape, require_privileges
    from commbench.launchers import detect_launcher

    for flag, value in (("emulate", emulate), ("link", link)):  # given but empty: not the default, not "no cluster"
        if value is not None and not value.strip():
            raise UsageFault(f"--{flag} '': empty; give {'NODESxRANKS' if flag == 'emulate' else 'a rate, e.g. 1gbit'}")
    if not emulate:
        if link is not None:
            raise UsageFault("--link sets the rate of an emulated cluster's links: give --emulate NODESxRANKS too")
        return None
    given = [flag for flag, value in conflicts.items() if value]
    if given:
        raise UsageFault(f"--emulate NODESxRANKS sets the job's layout and launch: drop {', '.join(given)}")
    if detect_launcher(os.environ) is not None:
        raise UsageFault("--emulate starts its own launchers: run it outside torchrun, srun or mpirun")
    try:
        nodes, ranks = parse_shape(emulate)
        rate = parse_rate(link or DEFAULT_LINK)
        require_privileges()
    except EmulateError as exc:
        raise UsageFault(str(exc)) from exc
    return nodes, ranks, rate


@click.group("emulate", epilog=EMULATE_EXAMPLES)
def emulate_group() -> None:
    """An emulated cluster on this host: network namespaces, a switch, rate-limited links."""


@emulate_group.command("up")
@click.argument("shape", metavar="NODESxRANKS")
@click.option("--link", default=DEFAULT_LINK, show_default=True, metavar="RATE", help="Each node's NIC rate.")
def up_command(shape: str, link: str) -> None:
    """Build a cluster that stays until `commbench emulate down`; print how to launch on it."""
    from commbench import emulate as E

    try:
        nodes, ranks = E.parse_shape(shape)
        rate = E.parse_rate(link)
        cluster = E.create(nodes, ranks, rate, owned=False)
    except E.EmulateError as exc:
        raise UsageFault(str(exc)) from exc
    click.echo(f"commbench: emulated cluster {cluster.tag}: {nodes} node(s), links of {E.rate_text(rate)}")
    _describe(cluster)


@emulate_group.command("status")
def status_command() -> None:
    """The emulated clusters on this host, and how to launch on each."""
    from commbench import emulate as E

    found = E.clusters()
    if not found:
        click.echo("no emulated cluster on this host")
        return
    for cluster in found:
        if cluster.owner_pid is None:
            owner = "kept (emulate up)"
        elif cluster.alive():
            owner = f"run by pid {cluster.owner_pid}"
        else:
            owner = "left by a run that died: `commbench emulate clean` removes it"
        age = f", up {time.time() - cluster.created:.0f} s" if cluster.created else ""
        click.echo(f"{cluster.tag}: {cluster.nodes} node(s) x {cluster.ranks_per_node} rank(s), "
                   f"links {E.rate_text(cluster.rate_bps) if cluster.rate_bps else '?'}, {owner}{age}")
        if cluster.alive():
            _describe(cluster)


@emulate_group.command("down")
@click.argument("tags", nargs=-1, metavar="[TAG]...")
@click.option("--all", "everything", is_flag=True, default=False, help="Every cluster, kept or running.")
def down_command(tags: tuple[str, ...], everything: bool) -> None:
    """Remove clusters (what runs inside them is stopped); without a TAG, what runs that died left."""
    from commbench import emulate as E
    from commbench.emulated_run import clean_dead_runs

    try:
        E.require_privileges("commbench emulate down")
        targets = E.clusters() if everything else [E.find(tag) for tag in tags]
    except E.EmulateError as exc:
        raise UsageFault(str(exc)) from exc
    if not targets and not everything:
        gone = clean_dead_runs()  # as `clean`: a killed run's cluster is what a user means to take down
        if not gone:
            raise UsageFault("no emulated cluster left by a run that died: name the cluster(s) to remove "
                             "(`commbench emulate status`), or give --all")
        for cluster in gone:
            click.echo(f"removed emulated cluster {cluster.tag} (left by a run that died)")
        return
    for cluster in targets:
        E.destroy(cluster)
        click.echo(f"removed emulated cluster {cluster.tag}")


@emulate_group.command("clean")
def clean_command() -> None:
    """Remove the clusters, processes and shared memory of runs that died."""
    from commbench import emulate as E
    from commbench.emulated_run import clean_dead_runs

    try:
        E.require_privileges("commbench emulate clean")
    except E.EmulateError as exc:
        raise UsageFault(str(exc)) from exc
    gone = clean_dead_runs()
    click.echo(f"removed {len(gone)} emulated cluster(s) left by runs that died"
               + (f": {', '.join(c.tag for c in gone)}" if gone else ""))


def _describe(cluster) -> None:
    """Node namespaces and addresses, and the launch lines a user would type."""
    from commbench import emulate as E
    from commbench.emulated_run import torchrun_argv

    for i in range(cluster.nodes):
        click.echo(f"  node {i}: namespace {cluster.node(i)}, {E.NIC} {cluster.address(i)}")
    click.echo("  launch on it (one line per node, e.g. in separate shells; node 0 serves the rendezvous):")
    for i in range(cluster.nodes):
        argv = torchrun_argv(cluster, i, 300.0, ["-m", "commbench", "sweep"])
        ns_exec, program = argv[:4], argv[4:]  # ip netns exec NS | python -m torch.distributed.run ...
        click.echo(f"    {shlex.join(ns_exec)} env GLOO_SOCKET_IFNAME={E.NIC} OMP_NUM_THREADS=1 {shlex.join(program)}")
