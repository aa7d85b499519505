"""Model proxies: `proxy` (replay DDP's gradient traffic), `train` (real DDP training) and
`profiles` (list, show, extract). Library code lives in proxies/ (commbench.proxies)."""
from __future__ import annotations

import json
import os
import shutil
import sys

import click

from commbench.commands.emulate import emulate_options
from commbench.commands.helpers.common import UsageFault, check_writable, output_options
from commbench.commands.helpers.hw_option import hw_option
from commbench.commands.helpers.setup_flags import setup_options
from commbench.commands.proxy_parallel import layout_replay_options
from commbench.errors import EXIT_OK

PROXY_EXAMPLES = """
\b
Examples:
  commbench proxy resnet50 --nprocs 2 --batch 16                 # replay on 2 local CPU ranks (gloo)
  commbench proxy bert-base --nprocs 2 --bucket-mb 25 --steps 30 --json p.jsonl
  commbench proxy resnet50 --nprocs 2 --batch 16 --validate       # and real DDP training; error %
  commbench proxy resnet50 --nodes 4 --gpus-per-node 8 --hw dgx-a100 --tflops 100   # predicted (sim)
  commbench proxy llama-tiny --layout tp2,pp2 -N 4 --tflops 0.01   # a parallel layout on 4 CPU ranks
  torchrun --nnodes 4 --nproc-per-node 8 ... -m commbench proxy resnet50 --tflops 100  # real, 32 ranks

\b
Exit codes: 0 ok, 2 bad input (or a model too large for memory), 3 a rank failed, 130 interrupted.
"""


def _common(fn):
    """Options `proxy` and `train` share."""
    fn = setup_options(emulate_options(fn))
    options = [
        click.argument("model"),
        click.option("--batch", type=int, default=None, help="Samples per rank per step [default: the profile's]."),
        click.option("--bucket-mb", type=float, default=None,
                     help="DDP bucket_cap_mb [default: DDP's own: 25 MiB, with a 1 MiB first bucket]."),
        click.option("--steps", type=int, default=30, show_default=True, help="Measured steps."),
        click.option("--warmup-steps", type=int, default=5, show_default=True,
                     help="Steps run first and left out of the statistics."),
        click.option("--torch-backend", type=click.Choice(["auto", "gloo", "nccl"]), default="auto", show_default=True),
        click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True),
        click.option("--nprocs", "-N", type=int, default=None,
                     help="Local ranks to spawn when no launcher started this process [default: GPUs, or 2]."),
        click.option("--oversubscribe", is_flag=True,
                     help="Spawn more local ranks than this host carries (4 per core, about 400 MiB each)."),
        click.option("--launcher", type=click.Choice(["auto", "spawn", "torchrun", "slurm", "mpi"]), default="auto",
                     show_default=True),
        click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
                     help="JSON Lines: a header, one record per step (flushed as it ends), a summary."),
        click.option("--timeout", "timeout_s", type=float, default=300.0, show_default=True, metavar="SECONDS",
                     help="A dead or hung rank stops the run within this long."),
        click.option("--trust-profile-code", is_flag=True,
                     help="Build the model from code a profile file names (source.spec module:callable): runs it."),
        click.option("--monitor", is_flag=True,
                     help="GPU (NVML) and CPU/NIC (psutil) telemetry per step and for the run (rank 0's host)."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return output_options(append=False)(fn)


@click.command("proxy", epilog=PROXY_EXAMPLES)
@_common
@click.option("--no-bucketing", is_flag=True, help="One allreduce per gradient tensor.")
@click.option("--single-bucket", is_flag=True, help="One allreduce of every gradient after the backward.")
@click.option("--compute", type=click.Choice(["measured", "flops", "trace", "block", "none"]), default=None,
              help="Backward/forward time: measured (run the real model here once), flops (the profile's FLOPs "
                   "at --tflops), trace (a traced profile's time, `profiles extract --from-trace`), block (a "
                   "transformer's operators from --hw's compute block, `commbench compute`), none [default: "
                   "flops with --tflops, trace for a traced profile, else measured].")
@click.option("--tflops", type=float, default=None, help="Achieved device rate, 1e12 FLOP/s, for --compute flops.")
@click.option("--remeasure", is_flag=True,
              help="--compute measured: time the model again, though an earlier run of the same model, batch and "
                   "setup on this host kept its figures (proxies/compute_cache.py).")
@click.option("--backend", "-b", default="torch", show_default=True,
              help="torch (gloo/NCCL), shm, p2p, hybrid (commbench's schedules), or sim (the cost model, --hw).")
@click.option("--algorithm", "-A", default="auto", show_default=True, help="Schedule backends and sim: the allreduce.")
@click.option("--tuning", "tuning", default=None, metavar="FILE",
              help="Schedule backends: the tuning table `auto` follows (commbench tune writes one).")
@click.option("--nodes", type=int, default=None, help="Replay at NODES x --gpus-per-node ranks (see --local, --hw).")
@click.option("--gpus-per-node", type=int, default=None,
              help="Ranks per node with --nodes [default: local GPUs, or 1].")
@click.option("--topology", "-T", default=None, metavar="NODESxRANKS",
              help="Short for --nodes NODES --gpus-per-node RANKS.")
@click.option("--local", "spawn_local", is_flag=True, help="With --nodes: spawn all NODES x GPUS ranks on this host.")
@hw_option("Cost model for --backend sim (or --nodes larger than the job): predicted, not measured.", name="hw")
@click.option("--validate", is_flag=True, help="Also train the real model with the same settings; print the error.")
@layout_replay_options("proxy")
def proxy_command(**options) -> None:
    """Replay the gradient allreduces DDP issues for MODEL, with the backward compute emulated.

    MODEL is a profile name (`commbench profiles list`) or a profile file. Each step
    emulates forward and backward, starts each bucket's allreduce when its last
    gradient is ready (overlapped with the rest of the backward, as DDP does), and
    reports compute, communication, exposed communication (the wait for it after the
    backward), other (the rest of the step) and step time: step = compute + exposed + other.
    """
    from commbench import job
    from commbench.commands.proxy_options import ProxyOptions
    from commbench.commands.proxy_plan import make_config, say_note
    from commbench.proxies.replay import PROXY_JOB

    o = ProxyOptions.from_click(options)
    cfg, plan = make_config(o)
    if plan.mode == "local":  # predicted by the cost model: no ranks
        from commbench.analysis.predict_proxy import predict_proxy
        from commbench.commands.helpers.hw_option import load_hw

        check_writable(cfg.json_path, "--json", o.force)
        say_note(plan)
        hw = load_hw(cfg.hw, say_poor=False)  # the one --hw parsed (a poor fit was said then), not read again
        sys.exit(_usage(lambda: predict_proxy(cfg, plan, sys.argv, hw)))
    if o.validate and o.json_path:  # the training twin's file, refused before any work
        from commbench.proxies.run import train_twin

        check_writable(train_twin(cfg).json_path, "--validate", o.force)
    try:
        code = _launch(PROXY_JOB, cfg, plan, o.force)
        if code == EXIT_OK and o.validate:
            code = _validate(cfg, plan, keep=bool(o.json_path), force=o.force)
    finally:
        if o.validate and not o.json_path:  # records in a folder of our own: kept with --json only
            shutil.rmtree(os.path.dirname(cfg.json_path), ignore_errors=True)
    job.end(code, plan)


@click.command("train", epilog="""
\b
Examples:
  commbench train resnet50 --nprocs 2 --batch 16 --steps 40        # 2 CPU ranks, gloo
  torchrun --nproc-per-node 8 -m commbench train resnet50 --amp --warmup-steps 20 --steps 100
  commbench train llama-tiny --layout tp2,fsdp2 -N 4               # a parallel layout on 4 CPU ranks
  commbench train llama-tiny --layout tp2,ddp2 -N 4                # DDP as the data-parallel part
  commbench train llama-tiny --layout pp2,fsdp2 --microbatches 4 -N 4 --emulate 2x2
""")
@_common
@click.option("--amp", is_flag=True, help="Mixed precision (fp16 autocast with a grad scaler) on GPU.")
@layout_replay_options("train")
def train_command(**options) -> None:
    """Train MODEL for real as --setup says (torch DDP or FSDP2; random weights, synthetic data) and time each step."""
    from commbench import job
    from commbench.commands.proxy_options import ProxyOptions
    from commbench.commands.proxy_plan import make_config
    from commbench.proxies.train import TRAIN_JOB

    o = ProxyOptions.from_click(options, train=True)  # what train has no option for keeps its default: torch, real
    cfg, plan = make_config(o)
    job.end(_launch(TRAIN_JOB, cfg, plan, o.force), plan)


def _usage(call):
    """Run `call`; a ValueError it raises (ProxyUsageError, a prediction out of the model's
    reach) is bad input: one line, exit 2."""
    from commbench.results import OutputError

    try:
        return call()
    except (ValueError, OutputError) as exc:
        raise UsageFault(str(exc).splitlines()[0] if str(exc) else type(exc).__name__) from exc


def _launch(run_job, cfg, plan, force: bool) -> int:
    from commbench import job
    from commbench.commands.proxy_plan import say_note

    check_writable(cfg.json_path, "--json", force)
    say_note(plan)
    return job.run(run_job, cfg, plan, sys.argv)


def _validate(cfg, plan, keep: bool, force: bool) -> int:
    from commbench.proxies import run as R

    lead = plan.lead
    if lead:
        what = f"layout {cfg.layout.name}" if cfg.layout else f"setup {cfg.setup}"
        click.echo(f"# validate: real training of {what} with the same model, batch, ranks, knobs and "
                   f"backend" + _validate_eta(cfg))
    train_cfg = R.train_twin(cfg)
    from commbench.proxies.train import TRAIN_JOB

    code = _launch(TRAIN_JOB, train_cfg, plan, force)
    if code == EXIT_OK and lead:
        R.report_validation(cfg, train_cfg, show_paths=keep)
    return code


def _validate_eta(cfg) -> str:
    """How long the training will take at the replay's median step (its summary in cfg.json_path)."""
    from commbench.results import RecordError, read_records

    try:
        summary = next((r for r in reversed(read_records(cfg.json_path)) if r.get("record") == "proxy"), None)
    except (OSError, RecordError):
        summary = None
    if not summary or not summary.get("step_us_p50"):
        return ""
    steps = cfg.warmup_steps + cfg.steps
    seconds = steps * summary["step_us_p50"] / 1e6
    shown = f"{seconds:.1f}" if seconds < 10 else f"{seconds:.0f}"
    return f": {steps} steps, about {shown} s at the replay's median step, and the model's build"


# ---------------------------------------------------------------- profiles


@click.group("profiles")
def profiles_group() -> None:
    """Model profiles: the parameter tensors, FLOPs and gradient-ready order a proxy replays."""


@profiles_group.command("list")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per profile.")
def profiles_list(as_json: bool) -> None:
    """The profiles that ship with commbench."""
    from commbench.proxies.profile import load_profile, shipped

    click.echo("" if as_json else f"# {'model':24s} {'parameters':>14s} {'tensors':>8s} {'GFLOP/sample fwd':>17s} "
               f"{'input':>14s} {'batch':>6s}  source")
    for name in shipped():
        p = load_profile(name)
        row = {"model": p.name, "parameters": p.parameters, "tensors": len(p.tensors),
               "forward_gflops": p.forward_flops / 1e9, "input_shape": list(p.input_shape),
               "sample_unit": p.sample_unit, "default_batch": p.default_batch, "package": p.source.get("package")}
        if as_json:
            click.echo(json.dumps(row))
        else:
            shape = "x".join(map(str, p.input_shape))
            click.echo(f"  {p.name:24s} {p.parameters:>14,d} {len(p.tensors):>8d} {p.forward_flops / 1e9:>17.2f} "
                       f"{shape:>14s} {p.default_batch:>6d}  {p.source.get('package')}")


@profiles_group.command("show")
@click.argument("model")
@click.option("--buckets", "show_buckets", is_flag=True, help="The DDP bucket layout, in launch order.")
@click.option("--bucket-mb", type=float, default=None, help="DDP bucket_cap_mb [default: DDP's].")
@click.option("--no-bucketing", is_flag=True)
@click.option("--single-bucket", is_flag=True)
@click.option("--units", "show_units", is_flag=True, help="The sharding units (FSDP wrapping), in forward order.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def profiles_show(model, show_buckets, bucket_mb, no_bucketing, single_bucket, show_units, as_json) -> None:
    """A profile's summary and tensors, with --buckets its DDP bucket layout, with --units its sharding units."""
    from commbench.commands.helpers import options as O
    from commbench.commands.proxy_plan import bucketing_mode
    from commbench.proxies import run as R

    O.check({"--bucket-mb": (O.Range(0, 1 << 20, low_open=True), bucket_mb)})
    try:
        text = R.show_profile(model, show_buckets, bucket_mb, bucketing_mode(no_bucketing, single_bucket), as_json,
                              show_units)
    except R.ProxyUsageError as exc:
        raise UsageFault(str(exc)) from exc
    click.echo(text)


@profiles_group.command("extract")
@click.argument("spec")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), help="Profile JSON to write.")
@click.option("--input-shape", default=None, metavar="C,H,W|SEQ", help="One sample's input shape.")
@click.option("--name", default=None, help="The profile's name [default: from SPEC].")
@click.option("--batch", "default_batch", type=int, default=None, help="The profile's default batch.")
@click.option("--unit", "sample_unit", default=None, help="What a sample is: images, sequences, ...")
@click.option("--wrap", default=None, metavar="CLASS[,CLASS...]",
              help="Classes whose modules are sharding units [default: the model family's FSDP wrapping].")
@click.option("--from-trace", is_flag=True,
              help="SPEC is one rank's PyTorch profiler trace of a data-parallel job (docs/replay.md).")
@output_options(append=False)
def profiles_extract(spec, output, input_shape, name, default_batch, sample_unit, wrap, from_trace, force) -> None:
    """Build a profile from a model definition (random weights; nothing is downloaded).

    \b
    SPEC: a profile name (resnet50), torchvision:NAME, timm:NAME,
    transformers:CLASS[:key=value,...] (e.g. transformers:BertForMaskedLM:num_hidden_layers=24),
    or package.module:callable (returning an nn.Module).
    """
    from commbench.proxies import run as R

    check_writable(output, "-o", force)
    try:
        profile = (_profile_from_trace(spec, input_shape, name, default_batch, sample_unit, wrap) if from_trace else
                   R.extract_profile(spec, input_shape, name, default_batch, sample_unit, wrap))
    except R.ProxyUsageError as exc:
        raise UsageFault(str(exc)) from exc
    try:
        profile.save(output)
    except OSError as exc:
        raise UsageFault(f"cannot write {output}: {exc.strerror or exc}") from exc
    click.echo(f"# {profile.name}: {profile.parameters:,d} parameters in {len(profile.tensors)} tensors, "
               f"{R.compute_words(profile)}, {len(profile.units)} sharding unit(s); wrote {os.path.abspath(output)}")


def _profile_from_trace(path, input_shape, name, default_batch, sample_unit, wrap):
    """profiles extract --from-trace: the gradients and compute of a traced DDP job
    (proxies/traces/extracted_profile.py)."""
    from commbench.proxies.traces.calls import TraceError
    from commbench.proxies.traces.extracted_profile import profile_from_trace

    if input_shape or wrap:
        raise UsageFault("--input-shape and --wrap describe a model definition: a trace has neither (--from-trace)")
    try:
        return profile_from_trace(path, name, default_batch or 1, sample_unit or "samples")
    except TraceError as exc:
        raise UsageFault(str(exc)) from exc
