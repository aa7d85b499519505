"""Pipeline schedules as orders of work, and the step they give.

Each pipeline rank runs its forward (F) and backward (B) passes of micro-batches in an order its
schedule fixes; a pass of one virtual stage starts when the rank is free and the pass it depends on
(the previous stage's forward of the same micro-batch, the next stage's backward) has finished and its
activation or gradient has arrived. The step, the bubble and the micro-batches whose activations a
rank holds at once all follow from the order: no bubble formula is pasted on top (the tests check the
orders give the closed forms of Narayanan et al. 2021, "Efficient Large-Scale Language Model Training
on GPU Clusters Using Megatron-LM", section 2.2: (pp - 1) / m of the ideal time for GPipe and 1F1B,
divided by v for the interleaved schedule).

- `gpipe`: all forwards, then all backwards (torch.distributed.pipelining.ScheduleGPipe);
- `1f1b`: PipeDream-Flush: pp - 1 - stage warm-up forwards, then one forward and one backward in turn,
  then the remaining backwards (Megatron-LM schedules.py `forward_backward_pipelining_without_interleaving`;
  torch's Schedule1F1B runs the same steady state);
- `interleaved`: v model chunks per rank (virtual stage j = chunk x pp + stage), micro-batches taken in
  groups of pp per chunk, (pp - 1 - stage) x 2 + (v - 1) x pp warm-up forwards (Megatron-LM
  `forward_backward_pipelining_with_interleaving`; torch's ScheduleInterleaved1F1B).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Pass:
    kind: str  # "F" (forward) or "B" (backward)
    microbatch: int
    chunk: int = 0  # the rank's model chunk: virtual stage chunk x pp + stage


def order(schedule: str, pp: int, stage: int, microbatches: int, virtual_stages: int = 1) -> list[Pass]:
    """The passes pipeline rank `stage` of `pp` runs in one step, in order."""
    m = microbatches
    if schedule == "gpipe":
        return [Pass("F", i) for i in range(m)] + [Pass("B", i) for i in range(m)]
    if schedule == "1f1b":
        return _one_forward_one_backward(m, min(pp - stage - 1, m), lambda k: (k, 0), lambda k: (k, 0))
    if schedule == "interleaved":
        v = virtual_stages
        total = m * v

        def place(k: int, forward: bool) -> tuple[int, int]:
            chunk = (k // pp) % v
            return (k // (pp * v)) * pp + k % pp, (chunk if forward else v - 1 - chunk)
        warmup = total if m == pp else min((pp - stage - 1) * 2 + (v - 1) * pp, total)
        return _one_forward_one_backward(total, warmup, lambda k: place(k, True), lambda k: place(k, False))
    raise ValueError(f"unknown pipeline schedule {schedule!r}")


def _one_forward_one_backward(total: int, warmup: int, forward, backward) -> list[Pass]:
    passes = [Pass("F", *forward(k)) for k in range(warmup)]
    for i in range(total - warmup):
        passes += [Pass("F", *forward(warmup + i)), Pass("B", *backward(i))]
    passes += [Pass("B", *backward(k)) for k in range(total - warmup, total)]
    return passes


def held_at_once(schedule: str, pp: int, stage: int, microbatches: int, virtual_stages: int = 1) -> int:
    """in_flight(order(...)) without building the order: the warm-up's forwards and the first steady one (GPipe:
    every micro-batch). A search asks it of thousands of layouts."""
    m, v = microbatches, virtual_stages
    if schedule == "gpipe":
        return m
    if schedule == "1f1b":
        total, warmup = m, min(pp - stage - 1, m)
    elif schedule == "interleaved":
        total = m * v
        warmup = total if m == pp else min((pp - stage - 1) * 2 + (v - 1) * pp, total)
    else:
        raise ValueError(f"unknown pipeline schedule {schedule!r}")
    return warmup + 1 if total > warmup else total


def in_flight(passes: Sequence[Pass]) -> int:
    """The most micro-batch chunks whose activations the rank holds at once (forwarded, not yet backwarded):
    what its activation memory is sized by."""
    held = most = 0
    for p in passes:
        held += 1 if p.kind == "F" else -1
        most = max(most, held)
    return most


@dataclass(frozen=True)
class PipelineStep:
    step_us: float
    busy_us: tuple[float, ...]  # per pipeline rank: time in its passes
    passes: tuple[tuple[tuple[Pass, float, float], ...], ...]  # per rank: (pass, start, end)

    @property
    def bubble(self) -> float:
        """The share of the step the average rank idles (waiting for its neighbours)."""
        return 1.0 - sum(self.busy_us) / (len(self.busy_us) * self.step_us) if self.step_us > 0 else 0.0


def run(schedule: str, pp: int, microbatches: int, forward_us: Sequence[float], backward_us: Sequence[float],
        transfer_us: float | Sequence[float] = 0.0, *, virtual_stages: int = 1) -> PipelineStep:
    """The step of `schedule` when virtual stage j's forward of one micro-batch takes forward_us[j] and its
    backward backward_us[j], and an activation or gradient takes transfer_us (per boundary j -> j + 1, or one
    figure) to reach the next stage; a rank sends while it computes (asynchronous send/recv)."""
    stages = pp * virtual_stages
    if len(forward_us) != stages or len(backward_us) != stages:
        raise ValueError(f"{stages} virtual stages need {stages} forward and backward times")
    hop = list(transfer_us) if isinstance(transfer_us, Sequence) else [float(transfer_us)] * max(stages - 1, 0)
    orders = [order(schedule, pp, s, microbatches, virtual_stages) for s in range(pp)]
    done: dict[tuple[str, int, int], float] = {}
    timeline: list[list[tuple[Pass, float, float]]] = [[] for _ in range(pp)]
    free, nxt = [0.0] * pp, [0] * pp
    while any(nxt[s] < len(orders[s]) for s in range(pp)):
        progressed = False
        for s in range(pp):
            while nxt[s] < len(orders[s]):
                p = orders[s][nxt[s]]
                j = p.chunk * pp + s
                ready = _ready(p, j, stages, done, hop)
                if ready is None:
                    break
                start = max(free[s], ready)
                end = start + (forward_us[j] if p.kind == "F" else backward_us[j])
                done[(p.kind, p.microbatch, j)] = end
                timeline[s].append((p, start, end))
                free[s], nxt[s], progressed = end, nxt[s] + 1, True
        if not progressed:
            raise ValueError(f"{schedule}: the pipeline's orders wait on each other (a schedule bug)")
    busy = tuple(sum(e - b for _, b, e in row) for row in timeline)
    return PipelineStep(max(free), busy, tuple(tuple(row) for row in timeline))


def _ready(p: Pass, j: int, stages: int, done: dict, hop: list[float]) -> float | None:
    """When pass `p` of virtual stage j may start as far as its inputs go (None: not yet known)."""
    if p.kind == "F":
        if j == 0:
            return 0.0
        before = done.get(("F", p.microbatch, j - 1))
        return None if before is None else before + hop[j - 1]
    own = done.get(("F", p.microbatch, j))
    if own is None:
        return None
    if j == stages - 1:
        return own
    after = done.get(("B", p.microbatch, j + 1))
    return None if after is None else max(own, after + hop[j])
