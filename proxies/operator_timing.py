"""Operators timed on this device at the shapes proxies/layouts/layer_ops.py lists: the measuring half of the compute
block (commbench/costmodel/compute.py), run by `commbench compute`.

Each operator runs on tensors made beforehand: one warm-up, then repeats until `min_time_s` of them have run
(at least MIN_REPEATS, at most MAX_REPEATS), and the median is kept. The clock is the device's own: on a CPU
the thread's CPU time when torch runs one thread (what the ranks of `train --layout` run: other processes on
the cores do not add their own time to it, though they still slow it through the caches they share), else
wall time; on a GPU CUDA events around each call. Matrix products run as torch.matmul, attention as
scaled_dot_product_attention (forward, then its backward from a gradient of ones), memory-bound work as one
elementwise add over a tensor of a layer's size, the per-operator cost as an add of one element, and the
framework's share as a real decoder layer (transformers' LlamaDecoderLayer, as proxies/layouts/compute.py
builds a rank's shard) against the sum of its operators.
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable

MIN_REPEATS = 3
MAX_REPEATS = 200
WRAPPED_ROUNDS = 4  # rounds of A B C C B A whole-model steps (plain, FSDP2, TP)
TORCH_DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}


class Clock:
    """Times `run()` on `device` in microseconds: CUDA events on a GPU, else this thread's CPU time (one torch
    thread) or wall time."""

    def __init__(self, device: str, min_time_s: float):
        import torch

        self.torch, self.device, self.min_time_s = torch, device, min_time_s
        self.cpu_time = device == "cpu" and torch.get_num_threads() == 1
        self.kind = "CUDA events" if device != "cpu" else "thread CPU time" if self.cpu_time else "wall time"

    def median_us(self, run: Callable[[], object], after: Callable[[object], None] | None = None) -> float:
        """Median microseconds of `run` (or, with `after`, of `after(run())`'s second part: run outside)."""
        samples, spent, start = [], 0.0, time.perf_counter()
        self._once(run, after)
        while len(samples) < MIN_REPEATS or (spent < self.min_time_s and len(samples) < MAX_REPEATS):
            samples.append(self._once(run, after))
            spent = time.perf_counter() - start
        return statistics.median(samples)

    def _once(self, run, after) -> float:
        torch = self.torch
        if self.device != "cpu":
            value = run() if after else None
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            after(value) if after else run()
            end.record()
            end.synchronize()
            return begin.elapsed_time(end) * 1e3
        clock = time.thread_time if self.cpu_time else time.perf_counter
        value = run() if after else None
        t0 = clock()
        after(value) if after else run()
        return (clock() - t0) * 1e6


def time_matmul(clock: Clock, m: int, n: int, k: int, dtype: str) -> float:
    torch = clock.torch
    kind = getattr(torch, TORCH_DTYPES[dtype])
    a = torch.randn(m, k, device=clock.device, dtype=kind)
    b = torch.randn(k, n, device=clock.device, dtype=kind)
    return clock.median_us(lambda: torch.matmul(a, b))


def time_attention(clock: Clock, batch_heads: int, seq_q: int, seq_kv: int, head_dim: int, *, causal: bool,
                   dtype: str) -> tuple[float, float]:
    """(forward, backward) microseconds of scaled_dot_product_attention on (1, batch_heads, seq, head_dim)."""
    torch = clock.torch
    kind = getattr(torch, TORCH_DTYPES[dtype])
    functional = torch.nn.functional

    def tensor(seq: int):
        return torch.randn(1, batch_heads, seq, head_dim, device=clock.device, dtype=kind, requires_grad=True)

    q, k, v = tensor(seq_q), tensor(seq_kv), tensor(seq_kv)
    is_causal = causal and seq_q == seq_kv

    def forward():
        return functional.scaled_dot_product_attention(q, k, v, is_causal=is_causal)

    forward_us = clock.median_us(forward)
    backward_us = clock.median_us(forward, lambda out: out.backward(torch.ones_like(out)))
    return forward_us, backward_us


def memory_gbps(clock: Clock, elements: int, dtype: str) -> float:
    """GB/s of an elementwise add over `elements` (two read, one written)."""
    torch = clock.torch
    kind = getattr(torch, TORCH_DTYPES[dtype])
    x, y = (torch.randn(elements, device=clock.device, dtype=kind) for _ in range(2))
    out = torch.empty_like(x)
    us = clock.median_us(lambda: torch.add(x, y, out=out))
    return 3 * elements * x.element_size() / (max(us - op_us(clock), 1e-3) * 1e3)


def op_us(clock: Clock) -> float:
    """One operator's fixed cost: an add of one element."""
    torch = clock.torch
    x = torch.ones(1, device=clock.device)
    return clock.median_us(lambda: torch.add(x, x))


def time_decoder_layer(clock: Clock, par, shape, microbatch: int) -> tuple[float, float]:
    """(forward, backward) microseconds of one real decoder layer of the rank's shard (layouts/compute.py's pieces)."""
    from commbench.proxies.layouts.compute import RankPieces

    pieces = RankPieces(par, shape, microbatch, 0, clock.device)
    forward_us = clock.median_us(pieces.layer)
    backward_us = clock.median_us(pieces.layer, lambda out: out.backward(clock.torch.ones_like(out)))
    return forward_us, backward_us


def time_rank_pieces(clock: Clock, par, shape, microbatch: int) -> dict[str, tuple[float, ...]]:
    """The rest of a rank's real pieces (layouts/compute.py's, whole on the rank as `train --layout` keeps them):
    {"head": (forward, backward) of the final norm, the output layer and the loss; "embed": (forward, backward) of
    the embedding; "optimizer": (one SGD-with-momentum update of the rank's first stage's tensors, their count,
    their elements)}, microseconds."""
    from commbench.proxies.layouts.compute import RankPieces

    pieces = RankPieces(par, shape, microbatch, 0, clock.device)
    ones = clock.torch.ones_like
    head = (clock.median_us(pieces.head), clock.median_us(pieces.head, lambda out: out.backward()))
    embed = (clock.median_us(pieces.embed), clock.median_us(pieces.embed, lambda out: out.backward(ones(out))))
    optimizer, tensors = pieces.optimizer()
    update = clock.median_us(optimizer.step)
    return {"head": head, "embed": embed,
            "optimizer": (update, float(len(tensors)), float(sum(t.numel() for t in tensors)))}


def time_wrapped_steps(clock: Clock, shape, microbatch: int, store_path: str) -> dict[str, tuple[float, float]]:
    """What the wrappers' own work (hooks, copies, DTensor's dispatch) adds to one training micro-batch of the
    whole model (transformers' Llama at `shape`, `microbatch` sequences), forward and backward microseconds:
    {"plain": the model as it is, "fsdp": FSDP2's addition (fully_shard on each layer and the root), "tp": tensor
    parallelism's (parallelize_module on each layer)}, each on a one-rank mesh of this process. The three run
    interleaved, a step each in the order A B C C B A, WRAPPED_ROUNDS times after two warm-ups, and each addition
    is the median of its per-round differences (a machine that changes speed between rounds moves all three
    alike). Runs in a gloo group of one (a FileStore at `store_path`) that it ends."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    if clock.device != "cpu":
        raise ValueError("the wrappers' share is measured on CPU ranks only")
    dist.init_process_group("gloo", store=dist.FileStore(store_path, 1), rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        plans = {"self_attn.q_proj": ColwiseParallel(), "self_attn.k_proj": ColwiseParallel(),
                 "self_attn.v_proj": ColwiseParallel(), "self_attn.o_proj": RowwiseParallel(),
                 "mlp.gate_proj": ColwiseParallel(), "mlp.up_proj": ColwiseParallel(),
                 "mlp.down_proj": RowwiseParallel()}
        sharded, parallel = _llama(shape), _llama(shape)
        for layer in sharded.model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(sharded, mesh=mesh)
        for layer in parallel.model.layers:
            parallelize_module(layer, mesh, plans)
        steppers = {name: _stepper(clock, model, shape, microbatch)
                    for name, model in (("plain", _llama(shape)), ("fsdp", sharded), ("tp", parallel))}
        for _ in range(2):  # warm-ups: FSDP2's lazy init, the allocator
            for step in steppers.values():
                step()
        rounds = []
        for _ in range(WRAPPED_ROUNDS):
            times: dict[str, list] = {name: [] for name in steppers}
            for name in ("plain", "fsdp", "tp", "tp", "fsdp", "plain"):
                times[name].append(steppers[name]())
            rounds.append({name: [sum(x) / 2 for x in zip(*pair)] for name, pair in times.items()})
        plain = [statistics.median(r["plain"][i] for r in rounds) for i in (0, 1)]
        out = {"plain": tuple(plain)}
        for name in ("fsdp", "tp"):
            out[name] = tuple(statistics.median(r[name][i] - r["plain"][i] for r in rounds) for i in (0, 1))
        return out
    finally:
        dist.destroy_process_group()


def _llama(shape):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(num_hidden_layers=shape.layers, hidden_size=shape.hidden, num_attention_heads=shape.heads,
                         num_key_value_heads=shape.kv_heads, head_dim=shape.head_dim, intermediate_size=shape.ffn,
                         vocab_size=shape.vocab, max_position_embeddings=shape.seq_len, tie_word_embeddings=False)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return LlamaForCausalLM(config)


def _stepper(clock: Clock, model, shape, microbatch: int):
    """A function running one micro-batch of `model` (forward with its loss, backward, then the optimizer's step
    outside the times) that returns its (forward, backward) microseconds."""
    torch = clock.torch
    ids = torch.randint(0, shape.vocab, (microbatch, shape.seq_len))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    timer = time.thread_time if clock.cpu_time else time.perf_counter

    def step() -> tuple[float, float]:
        t0 = timer()
        loss = model(input_ids=ids, labels=ids).loss
        t1 = timer()
        loss.backward()
        t2 = timer()
        optimizer.step()
        optimizer.zero_grad()
        return (t1 - t0) * 1e6, (t2 - t1) * 1e6

    return step
