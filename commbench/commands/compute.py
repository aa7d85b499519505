"""`commbench compute MODEL --layout ... --hw BASE -o HW.json`: the device half of a prediction measured here.

It times the operators one rank of each layout runs (proxies/layouts/layer_ops.py: a decoder layer's products at the
layout's shard, attention by sequence and CP block, the memory-bound work, the head), a real decoder layer
against them for the framework's share, and writes BASE with that `compute` block (costmodel/compute.py):
predict-scaling --layout then costs each layout's operators from it rather than at one --tflops rate.
"""
from __future__ import annotations

import click

from commbench.commands.helpers.common import UsageFault, check_outputs, output_options
from commbench.commands.helpers.hw_option import hw_option
from commbench.commands.helpers.options import Range, check


@click.command("compute", epilog="""
\b
Examples:
  commbench compute llama-tiny --gpus 4 --layout dp4 --layout tp2,dp2 --layout cp2,dp2 --hw shm-hw.json -o hw.json
  commbench compute llama-tiny --gpus 4 --layout pp2,dp2 --microbatch 1 --microbatch 4 --hw fit4.json -o hw.json
  commbench compute llama3.1-8b --gpus 8 --layout tp8,dp1 --layout tp4,dp2 --hw dgx-h100 -o h100.json  (on a GPU)
  commbench predict-scaling llama-tiny --gpus 4 --hw hw.json --layout dp4 --layout tp2,dp2     (uses the block)
""")
@click.argument("model")
@click.option("--layout", "layouts", multiple=True, metavar="SPEC",
              help="A layout whose rank's operators to time (repeat it) [default: the whole model on one device].")
@click.option("--gpus", type=int, default=None, help="The GPUs (or ranks) the layouts split the model over.")
@click.option("--microbatch", "microbatches", type=int, multiple=True, metavar="SEQUENCES",
              help="Sequences per micro-batch (repeat it to time several) [default: 1].")
@click.option("--seq-len", type=int, default=None, help="Tokens per sequence [default: the profile's].")
@click.option("--device", default=None, help="cpu or cuda[:N] [default: cuda where torch sees one, else cpu].")
@click.option("--dtype", type=click.Choice(["float32", "bfloat16", "float16"]), default=None,
              help="Precision of the operators [default: bfloat16 on a GPU, float32 on a CPU, as train runs].")
@click.option("--threads", type=int, default=1, show_default=True,
              help="CPU: torch's threads while timing (1: as the ranks of train and proxy --layout run).")
@click.option("--min-time", type=float, default=0.02, show_default=True,
              help="Seconds each operator repeats for (at least 3 times), after one warm-up.")
@hw_option("The hardware file (or preset) the block is added to: its links stay as they are.", required=True)
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), help="Hardware JSON to write.")
@output_options(append=False)
def compute_command(model, layouts, gpus, microbatches, seq_len, device, dtype, threads, min_time, hw_spec, output,
                    force) -> None:
    """Time a model's operators at the shapes each layout's ranks run, on this device; write the compute block."""
    from dataclasses import replace

    from commbench.commands.helpers.hw_option import load_hw

    microbatches = microbatches or (1,)
    for microbatch in microbatches:
        check({"--microbatch": (Range(1, 1 << 16), microbatch)})
    check({"--threads": (Range(1, 1024), threads),
           "--min-time": (Range(0, 60, low_open=True), min_time), "--gpus": (Range(1, 1 << 20), gpus),
           "--seq-len": (Range(1, 1 << 24), seq_len)})
    hw = load_hw(hw_spec)
    check_outputs(("-o", output), force=force)
    shape, parsed = _layouts(model, layouts, gpus, seq_len)
    device, dtype = _device(device, dtype, threads)
    from commbench.proxies.compute_measure import measure_block

    try:
        block = measure_block(shape, parsed, sorted(set(microbatches)), device, dtype, min_time_s=min_time,
                              say=click.echo)
    except (MemoryError, RuntimeError) as exc:  # a tensor this device cannot hold (torch: RuntimeError)
        raise UsageFault(f"cannot time {model}'s operators at these shapes here: "
                         f"{(str(exc).splitlines() or [type(exc).__name__])[0][:200]}") from exc
    out = replace(hw, compute=block)
    out.save(output)
    click.echo(f"# {block.device}: {len(block.matmul)} products at {_rates(block)} TFLOP/s, "
               f"{len(block.attention)} attention shapes, memory {block.memory_gbps:.1f} GB/s, "
               f"{block.op_us:.2f} us an operator, {_framework(block)}")
    click.echo(f"# wrote {output} ({hw.name}'s links, this device's compute)")


def _layouts(model: str, layouts: tuple[str, ...], gpus: int | None, seq_len: int | None):
    from dataclasses import replace

    from commbench.commands.predict_layouts import transformer_profile
    from commbench.proxies.layouts.layer_ops import unlisted
    from commbench.proxies.layouts.parallelism import LayoutError, parse_layout

    shape = transformer_profile(model, "compute").transformer
    if unlisted(shape):
        raise UsageFault(f"compute lists Llama-style layers, and {model}'s have {unlisted(shape)}: predictions of it "
                         "use one --tflops rate")
    if seq_len is not None:
        shape = replace(shape, seq_len=seq_len)
    try:
        parsed = [parse_layout(text, "ddp", gpus) for text in layouts] or [parse_layout("dp1")]
        parsed = [replace(par, microbatches=par.pp) for par in parsed]  # the operators do not depend on them
        for par in parsed:
            par.check(gpus, None, shape)
    except LayoutError as exc:
        raise UsageFault(str(exc)) from exc
    return shape, parsed


def _device(device: str | None, dtype: str | None, threads: int) -> tuple[str, str]:
    import torch

    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device != "cpu" and not (device.startswith("cuda") and torch.cuda.is_available()):
        raise UsageFault(f"--device {device}: torch sees no GPU here (use --device cpu)")
    if device == "cpu":
        torch.set_num_threads(threads)
    return device, dtype or ("float32" if device == "cpu" else "bfloat16")


def _rates(block) -> str:
    rates = sorted(p.tflops for p in block.matmul)
    return f"{rates[0]:.3g}-{rates[-1]:.3g}" if rates else "-"


def _framework(block) -> str:
    f = block.framework_us
    if not f:
        return "the framework's share not measured"
    return f"the framework's share {f['forward']:.1f} us forward and {f['backward']:.1f} us backward a layer"
