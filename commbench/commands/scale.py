"""One way to say the scale on every command: `--nodes N --gpus-per-node G` (torchrun's
`--nnodes` / `--nproc-per-node`, spelled as commbench spells them), or the short form
`--topology NxG` (`-T`). sweep, predict, proxy and predict-scaling accept all three; given
twice with different values (`-T 2x4 --nodes 3`, or a scale that is not `--nprocs` ranks)
the command stops with one line and exit 2 instead of picking one. What a command does when
only part of the scale is given (the ranks per node of its hardware, of this host's GPUs)
stays its own, and its help says so."""
from __future__ import annotations

from dataclasses import dataclass, replace

from commbench.commands.helpers.common import UsageFault

SHORT_FORM = "--topology NxG is --nodes N --gpus-per-node G"


@dataclass(frozen=True)
class Scale:
    """What the options say: each part None where not given."""
    nodes: int | None
    per_node: int | None

    @property
    def complete(self) -> bool:
        return self.nodes is not None and self.per_node is not None

    @property
    def given(self) -> bool:
        return self.nodes is not None or self.per_node is not None

    def spec(self) -> str:
        return f"{self.nodes}x{self.per_node}"


def settle(topology: str | None, nodes: int | None, per_node: int | None, world: int | None = None,
           world_flag: str = "--nprocs") -> Scale:
    """The scale the options say, or one line (UsageFault): a malformed or out-of-range value,
    --topology disagreeing with --nodes/--gpus-per-node, or a scale that is not `world` ranks
    (`world`: the rank count given another way, e.g. --nprocs)."""
    from commbench.commands.helpers import options as O
    from commbench.topology import TopologyError, parse_nodes_by_ranks

    O.check({"--nodes": (O.COUNT, nodes), "--gpus-per-node": (O.COUNT, per_node)})
    if topology is not None:
        try:
            topo = parse_nodes_by_ranks(topology)
        except TopologyError as exc:
            raise UsageFault(str(exc)) from exc
        O.check({"--topology's nodes": (O.COUNT, topo.nodes), "--topology's ranks per node":
                 (O.COUNT, topo.ranks_per_node)})  # the world's own limit is each command's
        for flag, value, said in (("--nodes", nodes, topo.nodes), ("--gpus-per-node", per_node, topo.ranks_per_node)):
            if value is not None and value != said:
                raise UsageFault(f"--topology {topology} and {flag} {value} disagree: say the scale once "
                                 f"({SHORT_FORM})")
        nodes, per_node = topo.nodes, topo.ranks_per_node
    scale = Scale(nodes, per_node)
    if world is not None and scale.given:
        _check_world(scale, world, world_flag, topology)
    return scale


def _check_world(scale: Scale, world: int, world_flag: str, topology: str | None) -> None:
    said = f"--topology {topology}" if topology is not None else " ".join(
        f"{flag} {value}" for flag, value in (("--nodes", scale.nodes), ("--gpus-per-node", scale.per_node))
        if value is not None)
    if scale.complete and scale.nodes * scale.per_node != world:
        raise UsageFault(f"{said} is {scale.nodes * scale.per_node} ranks but {world_flag} {world}: say the scale "
                         f"once")
    part = scale.nodes or scale.per_node
    if not scale.complete and world % part:
        raise UsageFault(f"{world_flag} {world} ranks do not fill {said} evenly: give --nodes and --gpus-per-node "
                         f"(or --topology NxG)")


def complete(scale: Scale, world: int | None, per_node_default: int) -> Scale:
    """Fill the part not given: from `world` ranks where known, else `per_node_default` ranks per node
    (--nodes alone) or one node (--gpus-per-node alone)."""
    nodes, per_node = scale.nodes, scale.per_node
    if nodes is not None and per_node is None:
        per_node = world // nodes if world is not None else per_node_default
    elif per_node is not None and nodes is None:
        nodes = world // per_node if world is not None else 1
    return Scale(nodes, per_node)


def for_sweep(options, joined: bool):
    """sweep's options with the scale said once: --nodes/--gpus-per-node folded into --topology, and
    when this command makes the ranks (spawned, or in process) into --nprocs too, so that --topology
    2x4 runs 8 ranks. In a launcher's job (`joined`) the job has its own size, which the backend
    checks the scale against. Beside --emulate (its own scale), --nodes/--gpus-per-node are refused.
    `options`: commands/sweep_options.SweepOptions; returned with its topology and nprocs settled."""
    nodes, per_node = options.nodes, options.gpus_per_node
    if options.emulate:
        given = [flag for flag, value in (("--nodes", nodes), ("--gpus-per-node", per_node)) if value is not None]
        if given:
            raise UsageFault(f"--emulate NODESxRANKS sets the job's scale and launch: drop {', '.join(given)}")
        return options
    world = None if joined else options.nprocs
    said = settle(options.topology, nodes, per_node, world)
    if not said.given:
        return options
    said = complete(said, world, local_gpus() or 1)
    nprocs = options.nprocs if joined or world is not None else said.nodes * said.per_node
    if not _runs_schedules(options.backend):  # a library lays out its own ranks: the scale says how many
        if not joined and said.nodes > 1:
            raise UsageFault(f"scale {said.spec()}: ranks spawned here are all on this host, and --backend "
                             f"{options.backend} cannot lay them out as {said.nodes} nodes: start them with "
                             f"a launcher (torchrun --nnodes {said.nodes}), emulate the nodes (--emulate "
                             f"{said.spec()}), or give --nprocs {said.nodes * said.per_node} alone")
        return replace(options, topology=None, nprocs=nprocs)
    return replace(options, topology=said.spec(), nprocs=nprocs)


def _runs_schedules(backend: str | None) -> bool:
    from commbench.backends import BackendError, backend_class

    try:
        return backend_class(backend or "torch").runs_schedules
    except BackendError:
        return True  # an unknown backend is refused later, in one line, by the backend check


def local_gpus() -> int:
    from commbench.backends.torch_lazy import local_gpu_count

    return local_gpu_count()
