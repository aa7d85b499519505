"""A compute block measured on this device for a model's layouts (`commbench compute`): every operator
proxies/layouts/layer_ops.py lists for one rank of each layout, timed by proxies/operator_timing.py, once per shape.
"""
from __future__ import annotations

import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace

from commbench.costmodel.compute import AttentionPoint, ComputeBlock, MatmulPoint
from commbench.proxies import operator_timing as T
from commbench.proxies.layouts import layer_ops as L


def shapes_of(shape, layouts, microbatches: list[int]) -> tuple[list[tuple[int, int, int]], list[tuple]]:
    """The distinct matrix products (m, n, k) and attention calls (batch_heads, seq_q, seq_kv, head_dim, causal)
    one rank of each layout runs at each micro-batch: a dense and an MoE layer where the model has them, and the
    head."""
    products, attention = [], []
    for par, microbatch in ((p, m) for p in layouts for m in microbatches):
        kinds = sorted({0, shape.dense_layers}) if shape.moe and shape.dense_layers < shape.layers else [0]
        ops = [op for index in kinds for op in L.layer_ops(shape, par, microbatch, index)]
        ops += L.head_ops(shape, par, microbatch)
        for op in L.matmuls(ops):
            if (op.m, op.n, op.k) not in products:
                products.append((op.m, op.n, op.k))
        for op in ops:
            key = (op.batch_heads, op.seq_q, op.seq_kv, op.head_dim, op.causal) if isinstance(op, L.Attention) else None
            if key and key not in attention:
                attention.append(key)
    return products, attention


def measure_block(shape, layouts, microbatches: list[int], device: str, dtype: str, *, min_time_s: float = 0.02,
                  say: Callable[[str], None] = print, framework: bool = True) -> ComputeBlock:
    """Time every operator of `layouts` (Parallelism values) on `device` in `dtype`; with `framework`, a real
    decoder layer of each dense layout too, whose time beyond its operators is the block's framework_us."""
    clock = T.Clock(device, min_time_s)
    products, attention = shapes_of(shape, layouts, microbatches)
    started = time.perf_counter()
    say(f"# timing {len(products)} matrix products and {len(attention)} attention shapes on {describe(device)} "
        f"({dtype}, {clock.kind}, median of {T.MIN_REPEATS}+ after a warm-up)")
    matmul = tuple(MatmulPoint(m, n, k, dtype, T.time_matmul(clock, m, n, k, dtype)) for m, n, k in products)
    points = []
    for bh, sq, skv, d, causal in attention:
        forward, backward = T.time_attention(clock, bh, sq, skv, d, causal=causal, dtype=dtype)
        points.append(AttentionPoint(bh, sq, skv, d, causal, dtype, forward, backward))
    tokens = max(microbatches) * shape.seq_len
    elements = max(4096, tokens * max(shape.hidden, shape.ffn // max(p.tp for p in layouts)))
    block = ComputeBlock(describe(device), matmul, tuple(points), T.memory_gbps(clock, elements, dtype),
                         T.op_us(clock), {}, {"memory_gbps": "measured", "op_us": "measured"},
                         {"dtype": dtype, "clock": clock.kind, "min_time_s": min_time_s,
                          "threads": clock.torch.get_num_threads() if device == "cpu" else None,
                          "cpus": os.cpu_count() if device == "cpu" else None,
                          "torch": clock.torch.__version__, "layouts": [p.name for p in layouts],
                          "microbatches": list(microbatches), "seq_len": shape.seq_len,
                          "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    if framework and L.unlisted(shape) is None and not shape.moe:
        block = _with_framework(block, clock, shape, layouts, microbatches, dtype, say=say)
    say(f"# measured in {time.perf_counter() - started:.1f} s")
    return block


def _with_framework(block: ComputeBlock, clock, shape, layouts, microbatches: list[int], dtype: str, *,
                    say) -> ComputeBlock:
    """framework_us: a real decoder layer's forward and backward beyond the sum of its operators (the median over
    the layouts and micro-batches; at least 0), or none where transformers is missing."""
    try:
        import transformers  # noqa: F401
    except ImportError:
        say("# framework time not measured: transformers is not installed (pip install 'commbench[models]')")
        return replace(block, sources={**block.sources, "framework_us": "defaulted"})
    extra_f, extra_b = [], []
    for par, microbatch in ((p, m) for p in layouts for m in microbatches):
        real_f, real_b = T.time_decoder_layer(clock, par, shape, microbatch)
        listed = [op for op in L.layer_ops(shape, par, microbatch, 0) if op.label != "attention (cp ring)"]
        ops = L.op_times(block, listed, dtype, framework=False)  # the real layer runs its own block only
        extra_f.append(real_f - ops.forward_us)
        extra_b.append(real_b - ops.backward_us)
        say(f"#   {par.name}, micro-batch {microbatch}: a decoder layer {real_f:.1f} us forward, {real_b:.1f} us "
            f"backward; its operators {ops.forward_us:.1f} and {ops.backward_us:.1f}")
    framework = {"forward": max(0.0, statistics.median(extra_f)), "backward": max(0.0, statistics.median(extra_b))}
    framework.update(_rest_of_a_rank(block, clock, shape, layouts[0], max(microbatches), dtype, say=say))
    framework.update(_wrappers(clock, shape, max(microbatches), say))
    return replace(block, framework_us=framework, sources={**block.sources, "framework_us": "measured"})


REST_PARAMETER_LIMIT = 1e8  # a rank's parameters beyond which the real update's tensors (and its head) take gigabytes


def _rest_of_a_rank(block: ComputeBlock, clock, shape, par, microbatch: int, dtype: str, *,
                    say) -> dict[str, float]:
    """The real head (with its loss), embedding and update of one rank against what the block's operators give them
    (proxies/layouts/pieces.from_block's model: the head's listed operators, the embedding's gather and the update's
    bytes at the memory bandwidth): the head's and the embedding's excess per phase, the update's per tensor. The
    head is whole on the rank, as `train --layout` keeps it."""
    from commbench.proxies.layouts import memory as M
    from commbench.proxies.layouts.parallelism import Parallelism
    from commbench.proxies.layouts.pieces import UPDATE_BYTES_PER_PARAMETER

    dense, experts, _ = M.stage_parameters(shape, par, 0)
    if dense + experts > REST_PARAMETER_LIMIT:
        say(f"# the rest of a rank (head, embedding, update) not measured: {(dense + experts) / 1e6:.0f} M parameters "
            f"on a {par.name} rank (over {REST_PARAMETER_LIMIT / 1e6:.0f} M: their update's tensors alone would take "
            "gigabytes here)")
        return {}
    real = T.time_rank_pieces(clock, par, shape, microbatch)
    head = L.op_times(block, L.head_ops(shape, Parallelism(cp=par.cp), microbatch), dtype, framework=False)
    gather = block.memory_us(2 * microbatch * shape.seq_len // par.cp * shape.hidden * (4 if dtype == "float32" else 2))
    gather += block.op_us or 0.0
    update_us, tensors, elements = real["optimizer"]
    out = {"head_forward": real["head"][0] - head.forward_us, "head_backward": real["head"][1] - head.backward_us,
           "embed_forward": real["embed"][0] - gather, "embed_backward": real["embed"][1] - 2 * gather,
           "optimizer_tensor": (update_us - block.memory_us(UPDATE_BYTES_PER_PARAMETER * elements)) / tensors}
    say(f"#   the rest of a {par.name} rank, micro-batch {microbatch}: the head and its loss "
        f"{sum(real['head']):.1f} us (its operators {head.forward_us + head.backward_us:.1f}), the embedding "
        f"{sum(real['embed']):.1f} us, the update {update_us:.1f} us over {tensors:.0f} tensors")
    return {key: max(0.0, value) for key, value in out.items()}


WRAPPED_STEP_FLOP_LIMIT = 2e11  # a whole model's micro-batch on a CPU beyond which three of them take minutes


def _wrappers(clock, shape, microbatch: int, say) -> dict[str, float]:
    """FSDP2's share per unit (each layer and the root) and DTensor's per layer, from the whole model's
    micro-batch with and without each wrapper on a one-rank mesh (CPU only: a GPU's is for its own run)."""
    flops = 3 * microbatch * shape.seq_len * shape.forward_flops_per_token()
    if clock.device != "cpu" or flops > WRAPPED_STEP_FLOP_LIMIT:
        say("# the wrappers' share (FSDP2, DTensor) not measured: " + ("CPU ranks only" if clock.device != "cpu"
            else f"the whole model's micro-batch is {flops / 1e9:.0f} GFLOP here"))
        return {}
    with tempfile.TemporaryDirectory() as folder:
        steps = T.time_wrapped_steps(clock, shape, microbatch, os.path.join(folder, "store"))
    plain, units = steps["plain"], shape.layers + 1
    out = {f"fsdp_unit_{phase}": max(0.0, steps["fsdp"][i] / units) for i, phase in enumerate(("forward", "backward"))}
    out.update({f"tp_layer_{phase}": max(0.0, steps["tp"][i] / shape.layers)
                for i, phase in enumerate(("forward", "backward"))})
    say(f"#   the whole model, micro-batch {microbatch}: {sum(plain) / 1e3:.1f} ms as it is; FSDP2 adds "
        f"{sum(steps['fsdp']) / 1e3:.1f} ms, DTensor's TP {sum(steps['tp']) / 1e3:.1f} ms (one rank, paired rounds)")
    return out


def describe(device: str) -> str:
    """The device as a block names it: the GPU's name, or the CPU's model and the threads torch runs."""
    import torch

    if device != "cpu":
        return torch.cuda.get_device_name(torch.device(device))
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            model = next((line.split(":", 1)[1].strip() for line in handle if line.startswith("model name")), model)
    except OSError:
        pass
    return f"cpu ({model}, {torch.get_num_threads()} thread{'s' if torch.get_num_threads() > 1 else ''})"
