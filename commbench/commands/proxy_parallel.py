"""`proxy MODEL --layout SPEC` and `train MODEL --layout SPEC`: the options that replay a parallel layout on
real ranks (proxies/layouts/replay.py) or train it for real (proxies/layouts/train/run.py), checked before any
rank starts. The spelling is predict-scaling's (commands/predict_layouts.py); proxy and train take one layout,
and the micro-batches a step runs."""
from __future__ import annotations

from dataclasses import replace

import click

from commbench.commands.helpers.common import UsageFault
from commbench.commands.predict_layouts import MAX_MICROBATCH, MAX_MICROBATCHES, MAX_VIRTUAL_STAGES, schedule_options

LAYOUT_HELP = {
    "proxy": "Replay a parallel layout (a transformer profile; --backend torch): tp2,dp2; tp2sp,dp2 (sequence "
             "parallel); pp2,dp2; cp2,dp2; ep2,dp2 (an MoE model); the data-parallel part as dpN (--setup), ddpN, "
             "fsdpN, hsdpN or SETUP:N. Compute from FLOPs at --tflops, or without it measured on each rank's own "
             "layers (--compute measured).",
    "train": "Train a parallel layout for real (a transformer profile): tp2,fsdp2; tp2sp,fsdp2 (sequence parallel); "
             "pp2,fsdp2; cp2,fsdp2; ep2,fsdp2 (an MoE model); the data-parallel part as DDP (ddpN) or FSDP2 (fsdpN), "
             "or dpN as --setup says.",
}
MICROBATCHES_HELP = {
    "proxy": "With --layout: how many micro-batches a step runs on each rank, each of --microbatch sequences "
             "[default: 2 x pp with a pipeline, else 1].",
    "train": "With a pipeline in --layout: how many micro-batches a step runs on each rank, each of --microbatch "
             "sequences [default: 2 x pp]; without pp, a step is one micro-batch: give --microbatch.",
}
CHECKPOINTING_WHY = {
    "proxy": "as train --layout runs, so that a replay and a training run compare; selective is predict-scaling's "
             "default",
    "train": "train --layout keeps every activation, and runs none only",
}


def layout_replay_options(command: str):
    """--layout and the pipeline's schedule, micro-batches and activation checkpointing beside it, each said for
    `command` (proxy: a replay; train: real training, which takes neither --backend nor --tflops)."""
    def decorate(fn):
        options = [
            click.option("--layout", "layout", default=None, metavar="SPEC", help=LAYOUT_HELP[command]),
            click.option("--microbatches", type=int, default=None, metavar="COUNT", help=MICROBATCHES_HELP[command]),
            *schedule_options("none", CHECKPOINTING_WHY[command], "--microbatches"),
        ]
        for option in reversed(options):
            fn = option(fn)
        return fn
    return decorate


def layout_fields(o, cls, profile, compute: str, world: int, ranks_per_node: int) -> dict:
    """The ProxyConfig fields of `--layout` ({} without it); a layout that cannot run here is one line.
    `o`: the command's options (commands/proxy_options.ProxyOptions); `cls`: the backend's class."""
    from commbench.proxies.layouts.parallelism import LayoutError, parse_layout
    from commbench.proxies.setups import SetupError, settle

    text = o.layout
    if text is None:
        return {}
    shape = profile.transformer
    training = o.train
    refusals = [(shape is None, f"--layout needs a transformer's shape, and profile {profile.name} has none "
                                "(llama-tiny, llama3.1-8b/70b/405b, mixtral-8x7b, deepseek-v3)"),
                (not training and not (cls.makes_ddp_calls and cls.runs_rank_groups),  # torch.distributed's calls
                 "--layout replays on --backend torch (gloo or NCCL groups)"),
                (o.batch is not None, "--layout runs micro-batches: give --microbatch (sequences) and "
                                      "--microbatches, not --batch"),
                *(_training_refusals(o) if training or o.validate else [])]  # --validate trains the layout too
    for refused, line in refusals:
        if refused:
            raise UsageFault(line)
    bounds = {"microbatch": MAX_MICROBATCH, "microbatches": MAX_MICROBATCHES, "virtual_stages": MAX_VIRTUAL_STAGES}
    for flag, most in bounds.items():  # as predict-scaling --layout bounds them (10^30 sequences: rank tracebacks)
        value = getattr(o, flag)
        if value is not None and not 1 <= value <= most:
            raise UsageFault(f"--{flag.replace('_', '-')} {value}: must be " +
                             ("at least 1" if value < 1 else f"at most {most:,}"))
    try:
        par = parse_layout(text, o.setup, world, pp_schedule=o.pp_schedule, virtual_stages=o.virtual_stages)
        microbatches = o.microbatches or (2 * par.pp if par.pp > 1 else 1)
        par = replace(par, microbatches=microbatches)
        if par.pp_schedule == "interleaved" and par.pp > 1 and par.virtual_stages < 2:  # as train and predict say
            raise LayoutError("--pp-schedule interleaved needs --virtual-stages 2 or more (1 is 1F1B)")
        par.check(world, ranks_per_node, shape, within_node=("tp",) if ranks_per_node < world else ())
        settle(par.setup)  # a data-parallel part naming no setup is refused here, not on every rank
        if par.dp_shard and not training:  # the ranks replay a layout's data-parallel part on one group
            raise LayoutError(f"{par.name}: a sized HSDP shard group is predict-scaling's; the proxy runs HSDP on "
                              f"one host as one shard group (spell it hsdp{par.dp})")
        if not training and compute == "measured":
            _check_measured(o, par, shape)
        if training:
            from commbench.proxies.layouts.train.local import trained_shape

            trained_shape(par, shape, o.microbatch)
    except (LayoutError, SetupError, ValueError) as exc:
        raise UsageFault(str(exc)) from exc
    return {"layout": par, "microbatch": o.microbatch,
            "checkpointing": o.checkpointing, "setup": par.setup}


def _check_measured(o, par, shape) -> None:
    """The replay's compute timed on each rank's own pieces (proxies/layouts/compute.py): what cannot be
    measured here is one line."""
    from commbench.proxies.layouts.compute import refusal

    why = refusal(par, shape, o.microbatch, on_cpu=not _on_gpu(o))
    if why:
        raise UsageFault(why)


def _on_gpu(o) -> bool:
    """Whether the ranks run on GPUs: --device auto on a GPU host resolves to cuda (torch_dist.resolve_device)."""
    from commbench.backends.torch_lazy import cuda_available

    return o.device == "cuda" or o.torch_backend == "nccl" or \
        (o.device == "auto" and o.torch_backend != "gloo" and cuda_available())


def _training_refusals(o) -> list[tuple[bool, str]]:
    """What `train --layout` (proxies/layouts/train/run.py) cannot run, as layout_fields' refusals."""
    knobs = " ".join(f"--{name.replace('_', '-')}" for name in sorted(o.given_knobs()))
    return [(_on_gpu(o), "train --layout trains on CPU ranks over gloo (give --device cpu on a GPU host)"),
            (bool(knobs), f"train --layout runs DDP and FSDP2 with their defaults: drop {knobs}"),
            (o.amp, "train --layout trains in fp32: drop --amp"),
            (o.checkpointing != "none", "train --layout keeps every activation: --checkpointing none")]
