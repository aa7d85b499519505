"""`commbench predict-scaling MODEL --layout tp8,fsdp32 --layout tp4,pp2,fsdp32 ...`: parallel layouts of a
transformer ranked by predicted throughput, with memory per GPU beside (analysis/predict_layout.py), and
acc_ratio of each against the top row. The options live here; predict-scaling hands over when --layout is
given."""
from __future__ import annotations

import click

from commbench.commands.helpers.common import UsageFault

MAX_MICROBATCHES = 4096  # a step's micro-batches per rank: the pipeline's work grows with them
LAYOUT_PARAMS = ("layouts", "microbatch", "global_batch", "pp_schedule", "virtual_stages", "checkpointing", "seq_len",
                 "max_tp", "top")
GB = 1e9  # as GPU vendors state memory


CHECKPOINTING_HELP = ("activation checkpointing: none keeps every activation; selective recomputes the attention "
                      "core in the backward (Korthikanti et al. 2022); full the whole forward, its calls included")


def schedule_options(checkpointing: str, why: str, microbatches: str = "") -> list:
    """What a layout's step runs beside its degrees, spelled alike on predict-scaling, proxy and train: the size of
    a micro-batch (--microbatch; how many a step runs, --microbatches, is `microbatches`'s help where the command
    takes it), the pipeline's schedule and virtual stages, activation checkpointing (default `checkpointing`,
    `why` says why)."""
    count = f" (how many a step runs: {microbatches})" if microbatches else ""
    return [
        click.option("--microbatch", type=int, default=1, show_default=True, metavar="SEQUENCES",
                     help=f"With --layout: the size of one micro-batch, in sequences{count}."),
        click.option("--pp-schedule", type=click.Choice(["gpipe", "1f1b", "interleaved"]), default="1f1b",
                     show_default=True, help="With --layout: the schedule of a layout with a pipeline that names "
                                             "none (its own: pp2,fsdp8@gpipe); none applies without one."),
        click.option("--virtual-stages", type=int, default=1, show_default=True,
                     help="With --layout: model chunks per pipeline rank (interleaved 1F1B; its own: "
                          "pp4,fsdp8@interleaved:2)."),
        click.option("--checkpointing", type=click.Choice(["none", "selective", "full"]), default=checkpointing,
                     help=f"With --layout: {CHECKPOINTING_HELP} [default: {checkpointing}: {why}]."),
    ]


def layout_options(fn):
    """--layout and what a layout's step depends on beside it."""
    options = [
        click.option("--layout", "layouts", multiple=True, metavar="SPEC",
                     help="A parallel layout to predict and rank (repeat it): tp8,fsdp32; tp4,pp2,fsdp32; "
                          "tp8sp,pp16,dp64 (sp: sequence parallelism); cp2, ep8, etp1; the data-parallel part as "
                          "dpN (--setup), ddpN, fsdpN, hsdpN (sharded inside a node), hsdpRxS (R replicas of "
                          "S-rank shard groups) or SETUP:N; a pipeline's own schedule after @ "
                          "(tp8sp,pp4,fsdp32@interleaved:2, pp2,fsdp8@gpipe); auto: search every layout that can run "
                          "(--max-tp, --top). Needs a profile with a transformer shape."),
        *schedule_options("selective", "the attention scores not stored, as FlashAttention does too: the "
                                       "Llama 3 paper's 405B layout fits 80 GB only so, docs/layouts.md",
                          "--global-batch / (dp x --microbatch) on each rank"),
        click.option("--global-batch", type=int, default=None, metavar="SEQUENCES",
                     help="Sequences per optimizer step, all GPUs [default: one --microbatch a GPU, whatever the "
                          "layouts; in every record]."),
        click.option("--seq-len", type=int, default=None, help="Tokens per sequence [default: the profile's]."),
        click.option("--max-tp", type=int, default=None,
                     help="With --layout auto: the largest tensor-parallel degree searched [default: the node's "
                          "GPUs]."),
        click.option("--top", type=int, default=10, show_default=True,
                     help="With --layout auto: the fastest layouts that fit to print (the JSON has all of them)."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def predict_layouts(model: str, hw, gpus: int, gpus_per_node: int, tflops: float | None, precision: str,
                    algorithm: str, setup: str, flags: dict):
    """(predictions ranked, the Job they share, the top row's layout) for `flags["layouts"]`."""
    from dataclasses import replace

    from commbench.analysis.predict_layout import Job, rank_layouts
    from commbench.proxies.layouts.parallelism import LayoutError
    from commbench.proxies.setups import SetupError

    profile = transformer_profile(model, "--layout")
    shape = profile.transformer
    if flags["seq_len"] is not None:
        shape = replace(shape, seq_len=_positive("--seq-len", flags["seq_len"], MAX_SEQ_LEN))
    searching = "auto" in (text.strip().lower() for text in flags["layouts"])
    if searching and len(flags["layouts"]) > 1:
        raise UsageFault("--layout auto searches every layout: give it alone")
    ignored = [flag for flag, given in (("--pp-schedule", flags["pp_schedule"] != "1f1b"),
                                        ("--virtual-stages", flags["virtual_stages"] != 1)) if given and searching]
    ignored += [flag for flag, given in (("--max-tp", flags["max_tp"] is not None), ("--top", flags["top"] != 10))
                if given and not searching]
    if ignored:
        raise UsageFault(f"{', '.join(ignored)}: " + ("--layout auto searches 1F1B and interleaved:2 itself" if
                                                      searching else "options of --layout auto's search"))
    try:
        layouts = [] if searching else _layouts(flags, setup, gpus, gpus_per_node, shape)
    except (LayoutError, SetupError) as exc:
        raise UsageFault(str(exc)) from exc
    peak = hw.device_tflops.get("bf16") or hw.device_tflops.get("fp16")
    block, dtype = (None, "") if tflops else compute_block(hw, shape)
    rate, source = (0.0, f"compute block:{dtype}") if block else compute_rate(hw, tflops, precision)
    job = Job(shape, profile, hw, gpus_per_node, flags["microbatch"], rate, flags["checkpointing"], algorithm,
              peak or None, rate_source=source, compute=block, compute_dtype=dtype or "bfloat16")
    if searching:
        return _searched(job, shape, setup, gpus, gpus_per_node, flags)
    predictions = rank_layouts(job, layouts)
    return predictions, job, predictions[0].layout, []


def _searched(job, shape, setup: str, gpus: int, gpus_per_node: int, flags: dict):
    """--layout auto: (the layouts that fit, fastest first; the Job; the top row's layout; lines said after)."""
    from commbench.analysis.layout_search import SearchSpace, search
    from commbench.proxies.layouts.parallelism import LayoutError

    microbatch = _positive("--microbatch", flags["microbatch"], MAX_MICROBATCH)
    top = _positive("--top", flags["top"], 1000)
    max_tp = None if flags["max_tp"] is None else _positive("--max-tp", flags["max_tp"], gpus_per_node)
    setups = tuple(dict.fromkeys((setup, "fsdp-full")))
    space = SearchSpace(gpus, gpus_per_node, global_batch(flags["global_batch"], gpus, microbatch), microbatch,
                        setups, max_tp)
    try:
        found = search(job, shape, space)
    except LayoutError as exc:
        raise UsageFault(str(exc)) from exc
    if not found.ranked:
        nearest = found.too_big[0] if found.too_big else None
        raise UsageFault(f"--layout auto: none of {found.searched:,} layouts fits {job.hw.name}'s GPUs" +
                         (f" (the smallest, {nearest[0].name}, needs {nearest[1] / GB:.1f} GB)" if nearest else ""))
    fit = f"{len(found.ranked):,} fit" if job.hw.device_memory_gb else \
        f"{len(found.ranked):,} predicted ({job.hw.name} gives no device memory: none refused)"
    notes = [f"# searched {found.searched:,} layouts: {fit}, the top {min(top, len(found.ranked))} above; the JSON has "
             "every one that fits",
             f"#   (tp up to {max_tp or gpus_per_node} with sp, pp with 1F1B and interleaved:2, cp up to "
             f"{space.max_cp}, {' and '.join(setups)} on dp)"]
    if found.too_big:
        par, nbytes = found.too_big[0]
        notes.append(f"# {len(found.too_big):,} do not fit; the nearest, {par.name}, needs {nbytes / GB:.1f} GB")
    return found.ranked, job, found.ranked[0].layout, notes


def transformer_profile(model: str, what: str):
    """The profile `model` with its transformer shape, or one line saying why not (`what` needs the shape)."""
    from commbench.proxies.profile import ProfileError, load_profile

    try:
        profile = load_profile(model)
    except ProfileError as exc:
        raise UsageFault(str(exc)) from exc
    if profile.transformer is None:
        raise UsageFault(f"{what} needs a transformer's shape, and profile {profile.name} has none (layouts: "
                         "llama3.1-8b/70b/405b, mixtral-8x7b, deepseek-v3, llama-tiny, or `profiles extract` of a "
                         "transformers model)")
    return profile


def compute_block(hw, shape):
    """(the hardware's compute block, the precision to read it in) where it has what a layout's layers need,
    else (None, "") with a warning that says what it lacks (the prediction then falls back to one rate)."""
    from commbench.proxies.layouts import layer_ops

    block = hw.compute
    if block is None:
        return None, ""
    wanted = layer_ops.model_dtype(shape)
    dtype, lacks = layer_ops.reading(block, shape)
    if lacks:
        click.echo(f"warning: {hw.name}'s compute block lacks {', '.join(lacks)}: one rate instead", err=True)
        return None, ""
    if dtype != wanted:
        click.echo(f"warning: {hw.name}'s compute block was measured in {dtype}, not the model's {wanted}: "
                   f"its {dtype} times are used", err=True)
    return block, dtype


def compute_rate(hw, tflops: float | None, precision: str) -> tuple[float, str]:
    """(TFLOP/s a GPU, where it comes from): `tflops` ("given"), else the hardware's peak for `precision`
    ("peak:fp32", "peak:bf16"), said on stderr: a peak is no rate a real step achieves, so the step it gives
    is optimistic (issue 48: Llama 3.1 70B at the FP32 peak printed MFU 0.069, at the BF16 peak 0.75)."""
    import click as _click

    if tflops:
        return tflops, "given"
    key = next((k for k in (("bf16", "fp16") if precision == "amp" else ("fp32",)) if hw.device_tflops.get(k)), None)
    if key is None:
        raise UsageFault(f"{hw.name} gives no device_tflops for {precision}: pass --tflops (the achieved rate)")
    rate = hw.device_tflops[key]
    _click.echo(f"warning: no --tflops: every operator runs at {hw.name}'s {key} peak, {rate:g} TFLOPS, which no "
                "real step achieves; the steps are optimistic. Pass --tflops with the rate your runs achieve "
                "(model FLOPs / GPUs / step time)", err=True)
    return rate, f"peak:{key}"


MAX_SEQ_LEN = 1 << 24  # tokens: beyond any published context, and a shape's dimensions stay exact
MAX_MICROBATCH = 1 << 16  # sequences a micro-batch
MAX_VIRTUAL_STAGES = 1024


def _positive(flag: str, value: int, most: int | None = None) -> int:
    if value < 1:
        raise UsageFault(f"{flag} {value}: must be at least 1")
    if most is not None and value > most:
        raise UsageFault(f"{flag} {value if value < 1e12 else f'{value:.3g}'}: at most {most:,}")
    return value


def _layouts(flags: dict, setup: str, gpus: int, gpus_per_node: int, shape) -> list:
    """Each --layout spelled (once: a layout given twice is ranked once), sized to the global batch and checked
    against the GPUs, the node and the model. The default global batch is one micro-batch a GPU: it depends on
    the GPUs only, so adding a candidate never changes the others' steps or their order."""
    from dataclasses import replace

    from commbench.proxies.layouts.parallelism import LayoutError, parse_layout
    from commbench.proxies.setups import settle

    microbatch = _positive("--microbatch", flags["microbatch"], MAX_MICROBATCH)
    virtual = _positive("--virtual-stages", flags["virtual_stages"], MAX_VIRTUAL_STAGES)
    if flags["pp_schedule"] == "interleaved" and virtual < 2:
        raise LayoutError("--pp-schedule interleaved needs --virtual-stages 2 or more (1 is 1F1B)")
    parsed = []
    for text in flags["layouts"]:
        par = parse_layout(text, setup, gpus, pp_schedule=flags["pp_schedule"], virtual_stages=virtual)
        settle(par.setup)  # a setup the table does not have is one line
        if par not in parsed:
            parsed.append(par)
    batch = global_batch(flags["global_batch"], gpus, microbatch)
    if batch // microbatch // min(p.dp for p in parsed) > MAX_MICROBATCHES:
        raise LayoutError(f"--global-batch {batch}: more than {MAX_MICROBATCHES:,} micro-batches on a rank")
    out = []
    for par in parsed:
        per_step = par.dp * microbatch
        if batch % per_step:
            raise LayoutError(f"{par.name}: a global batch of {batch} sequences is not a whole number of micro-batches "
                              f"of {microbatch} on {par.dp} data-parallel ranks")
        par = replace(par, microbatches=batch // per_step)
        par.check(gpus, gpus_per_node, shape, within_node=("tp",))
        out.append(par)
    return out


def global_batch(given: int | None, gpus: int, microbatch: int) -> int:
    """Sequences per optimizer step: `given`, else one micro-batch a GPU (every layout's dp divides the GPUs, so
    each runs a whole number of micro-batches: tp x pp x cp of them on a rank)."""
    most = MAX_MICROBATCHES * gpus * microbatch
    return gpus * microbatch if given is None else _positive("--global-batch", given, most)


def layout_lines(predictions, job, first_layout, model: str, hw, gpus: int) -> list[str]:
    """The ranking as the terminal shows it; acc_ratio against `first_layout` (the top row)."""
    first = next(p for p in predictions if p.layout == first_layout)
    shape = job.shape
    tokens = first.layout.microbatches * job.microbatch * first.layout.dp * shape.seq_len
    rate = _rate_text(job, hw)
    width = max(22, *(len(p.layout.name) for p in predictions))
    lines = [f"# predict-scaling {model} --layout: {len(predictions)} layout(s) on {gpus} GPUs of {hw.name} "
             f"({gpus // job.gpus_per_node} nodes x {job.gpus_per_node})",
             f"# a step: {tokens:,} tokens ({tokens // shape.seq_len:,} sequences of {shape.seq_len:,}), "
             + ("no" if job.checkpointing == "none" else job.checkpointing) + " activation checkpointing",
             f"# compute: {rate}",
             "# step, tokens/s and MFU modelled (analysis/predict_layout.py); tp/cp/ep, pp, dp: what the step",
             "#   waited for on each dimension (exposed); GB/GPU: the fullest GPU's (proxies/layouts/memory.py)",
             f"# {'rank':>4}  {'layout':<{width}} {'step(ms)':>10} {'tokens/s':>12} {'MFU':>6} {'bubble':>7} "
             f"{'tp/cp/ep(ms)':>13} {'pp(ms)':>9} {'dp(ms)':>9} {'GB/GPU':>8} {'fits':>5} {'vs #1':>9}"]
    for rank, p in enumerate(predictions, 1):
        inner = sum(p.exposed_us.get(d, 0.0) for d in ("tp", "cp", "ep"))
        fits = "-" if p.fits is None else "yes" if p.fits else "NO"
        mfu = "-" if p.mfu is None else f"{p.mfu:.3f}"
        lines.append(f"  {rank:>4}  {p.layout.name:<{width}} {p.step_us / 1e3:>10.1f} {p.tokens_per_s:>12,.0f} "
                     f"{mfu:>6} {p.bubble:>7.3f} {inner / 1e3:>13.1f} {p.exposed_us.get('pp', 0.0) / 1e3:>9.1f} "
                     f"{p.exposed_us.get('dp', 0.0) / 1e3:>9.1f} {p.memory.total_nbytes / GB:>8.1f} {fits:>5} "
                     f"{p.tokens_per_s / first.tokens_per_s:>9.3f}")
    if hw.device_memory_gb:
        lines.append(f"# fits: at most {0.9 * hw.device_memory_gb:g} GB of the GPU's {hw.device_memory_gb:g} GB "
                     "(10% kept for the allocator, the CUDA context and NCCL); NO: ranked last")
    else:
        lines.append(f"# fits: -, {hw.name} gives no device_memory_gb")
    lines.append(f"# vs #1: tokens/s against {first.layout.name}, the top row (acc_ratio)")
    return lines


def _rate_text(job, hw) -> str:
    if job.compute is not None:
        return f"each operator from the compute block of {job.compute.device} ({job.compute_dtype})"
    if job.rate_source == "given":
        return f"{job.tflops:g} TFLOPS a GPU (--tflops: one rate for every operator)"
    return f"{job.tflops:g} TFLOPS a GPU ({hw.name}'s {job.rate_source[5:]} peak: optimistic)"


def layout_records(predictions, job, first_layout, model: str, run_id: str) -> list:
    """One record per layout (record: layout, kind: predicted)."""
    from commbench.results import LayoutRecord

    first = next(p for p in predictions if p.layout == first_layout)
    return [LayoutRecord(model=model, hardware=job.hw.name, gpus=p.layout.world, gpus_per_node=job.gpus_per_node,
                         layout=p.layout.to_dict(), microbatch=job.microbatch, seq_len=job.shape.seq_len,
                         global_batch=p.layout.microbatches * job.microbatch * p.layout.dp,
                         tflops=job.tflops, tflops_source=job.rate_source, checkpointing=job.checkpointing,
                         algorithm=job.algorithm,
                         step_us=p.step_us, compute_us=p.compute_us, tokens_per_s=p.tokens_per_s, mfu=p.mfu,
                         bubble=p.bubble, comm_us=dict(p.comm_us), exposed_us=dict(p.exposed_us),
                         memory_nbytes={"parameters": p.memory.parameters_nbytes,
                                        "gradients": p.memory.gradients_nbytes,
                                        "optimizer": p.memory.optimizer_nbytes,
                                        "activations": p.memory.activations_nbytes,
                                        "buffers": p.memory.buffers_nbytes,
                                        "backward_buffers": p.memory.backward_buffers_nbytes,
                                        "total": p.memory.total_nbytes,
                                        "gradients_held": p.memory.gradients_held},
                         fits=p.fits, acc_ratio=p.tokens_per_s / first.tokens_per_s, baseline=first.layout.name,
                         run_id=run_id)
            for p in predictions]


def only_data_parallel(given: dict) -> None:
    """Options of the data-parallel curves are one line under --layout, not silently dropped."""
    named = [flag for flag, value in given.items() if value is not None]
    if named:
        raise UsageFault(f"{', '.join(named)}: data-parallel curves' option(s), not --layout's (a layout's batch is "
                         "--microbatch and --global-batch, its compute --tflops, its setup named in the layout)")


def layouts_command(model, hw_spec, scale, gpus_per_node, tflops, precision, algorithm, setup, flags, json_path,
                     append) -> None:
    """predict-scaling --layout: the layouts ranked at one GPU count, printed and written."""
    from commbench.commands.helpers.common import write_records
    from commbench.commands.helpers.hw_option import load_hw
    from commbench.costmodel import ALLREDUCE_ALGORITHMS
    from commbench.results import new_run_id

    if len(scale[1]) != 1:
        raise UsageFault("--layout ranks layouts at one scale: give one --gpus (or --nodes) count")
    if algorithm not in ALLREDUCE_ALGORITHMS:
        raise UsageFault(f"unknown allreduce algorithm {algorithm!r}; choose from {', '.join(ALLREDUCE_ALGORITHMS)}")
    hw = load_hw(hw_spec)
    per_node = gpus_per_node or hw.ranks_per_node
    count = scale[1][0] * (per_node if scale[0] == "nodes" else 1)
    if not gpus_per_node and count < per_node:  # fewer GPUs than the hardware's node: one node of them
        per_node = count
    predictions, job, first, notes = predict_layouts(model, hw, count, per_node, tflops, precision, algorithm, setup,
                                                     flags)
    for line in layout_lines(predictions[:flags["top"]] if notes else predictions, job, first, model, hw, count):
        click.echo(line)
    for line in notes:
        click.echo(line)
    if json_path:
        write_records(json_path, layout_records(predictions, job, first, model, new_run_id()), append)
