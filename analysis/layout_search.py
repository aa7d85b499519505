"""`predict-scaling MODEL --layout auto`: every layout that can run a model on N GPUs, predicted and ranked.

A user planning a run asks "what is the best layout for this model on N GPUs", not "which of these five". The
search enumerates the layouts Parallelism.check accepts (docs/layouts.md, "Searching"):
- tp: the divisors of the node's GPUs up to `max_tp` that split the heads (and the key/value heads, or copy
  them), with sequence parallelism (Megatron-LM's recipes pair them; SP only saves memory in the model);
- pp: the degrees whose stages split the layers (evenly, or Llama 3's one layer fewer on the first and last),
  each with 1F1B and, where the micro-batches allow, interleaved 1F1B of 2 virtual stages;
- cp: powers of two up to `max_cp` that split the sequence in 2 x cp chunks;
- ep: on a model with experts, the divisors of the experts that fit in dp x cp;
- dp: what is left, run by each of `setups`.
Each is sized to the one global batch (one micro-batch a GPU unless given) and its memory checked first: the
step is predicted only for the layouts that fit, fastest first; of the rest the search says how many and which
came nearest.
"""
from __future__ import annotations

from dataclasses import dataclass

from commbench.proxies.layouts.parallelism import LayoutError, Parallelism

MAX_CANDIDATES = 20_000  # layouts a search may enumerate before it is refused (bounds its time)
MAX_MICROBATCHES = 4096  # a rank's micro-batches a step (commands/predict_layouts.py's, setups' accumulate)


@dataclass(frozen=True)
class SearchSpace:
    gpus: int
    gpus_per_node: int
    global_batch: int  # sequences
    microbatch: int
    setups: tuple[str, ...] = ("fsdp-full", "ddp")
    max_tp: int | None = None  # default: the node's GPUs
    max_cp: int = 16


def candidates(shape, space: SearchSpace) -> list[Parallelism]:
    """Every layout of `shape` on the space's GPUs that Parallelism.check accepts, sized to its global batch."""
    out = []
    max_tp = min(space.max_tp or space.gpus_per_node, space.gpus_per_node)
    for tp in (d for d in _divisors(space.gpus_per_node) if d <= max_tp):
        for cp in (c for c in _powers_of_two(space.max_cp) if space.gpus % (tp * c) == 0):
            for pp in _divisors(space.gpus // (tp * cp)):
                for par in _with_rest(shape, space, tp, cp, pp):
                    try:
                        par.check(space.gpus, space.gpus_per_node, shape, within_node=("tp",))
                    except LayoutError:
                        continue
                    out.append(par)
                    if len(out) > MAX_CANDIDATES:
                        raise LayoutError(f"--layout auto: more than {MAX_CANDIDATES:,} layouts to search; bound "
                                          f"it with --max-tp or fewer GPUs")
    return out


def _with_rest(shape, space: SearchSpace, tp: int, cp: int, pp: int):
    """The layouts of these degrees: each setup on dp, each expert degree, each schedule."""
    dp = space.gpus // (tp * cp * pp)
    if pp > shape.layers or space.global_batch % (dp * space.microbatch):
        return
    microbatches = space.global_batch // (dp * space.microbatch)
    if microbatches > MAX_MICROBATCHES:  # a step's plan lays each out (predict-scaling's bound, setups' accumulate)
        return
    schedules = [("1f1b", 1)] + ([("interleaved", 2)] if pp > 1 and microbatches % pp == 0
                                 and shape.layers % (2 * pp) == 0 else [])
    experts = [e for e in _divisors(shape.experts) if (dp * cp) % e == 0] if shape.experts else [1]
    for setup in space.setups:
        for ep in experts:
            for schedule, virtual in schedules:
                yield Parallelism(tp=tp, pp=pp, cp=cp, ep=ep, dp=dp, sequence_parallel=tp > 1, setup=setup,
                                  pp_schedule=schedule if pp > 1 else "1f1b", microbatches=microbatches,
                                  virtual_stages=virtual if pp > 1 else 1)


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(n ** 0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def _powers_of_two(most: int) -> list[int]:
    out, value = [], 1
    while value <= most:
        out.append(value)
        value *= 2
    return out


@dataclass(frozen=True)
class SearchResult:
    ranked: list  # LayoutPrediction of the layouts that fit (or all, where the hardware gives no memory), fastest first
    searched: int
    too_big: list  # (Parallelism, total bytes) of those that do not fit, smallest first


def search(job, shape, space: SearchSpace) -> SearchResult:
    """Enumerate, check memory, predict what fits (analysis/predict_layout.py), rank."""
    from commbench.analysis.predict_layout import RESERVED_FRACTION, layout_memory, predict_layout
    from commbench.proxies.layouts import memory as M

    layouts = candidates(shape, space)
    gpu_bytes = job.hw.device_memory_gb * 1e9 if job.hw.device_memory_gb else None
    fitting, too_big = [], []
    for par in layouts:
        memory = layout_memory(job, par)
        if gpu_bytes is None or M.fits(memory, gpu_bytes, RESERVED_FRACTION):
            fitting.append(par)
        else:
            too_big.append((par, memory.total_nbytes))
    ranked = sorted((predict_layout(job, par) for par in fitting), key=lambda p: -p.tokens_per_s)
    return SearchResult(ranked, len(layouts), sorted(too_big, key=lambda item: item[1]))
