"""What one rank of a parallel layout holds of a model: its pipeline stage's layers, split over the
tensor-parallel ranks (experts over the expert-parallel ranks too), as a profile whose gradients the
data-parallel setup reduces. Shared by the modelled step (analysis/predict_layout.py) and the replay
on real ranks (proxies/layouts/replay.py), so both reduce the same bytes."""
from __future__ import annotations

import math
import re
from dataclasses import replace

from commbench.proxies.layouts import memory as M
from commbench.proxies.layouts.parallelism import Parallelism
from commbench.proxies.profile import Profile, TensorSpec, UnitSpec

_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def stage_layer_ranges(layers: int, par: Parallelism, stage: int) -> list[range]:
    """The layers of each of pipeline rank `stage`'s model chunks (virtual stage chunk x pp + stage)."""
    counts = M.stage_layers(layers, par.pp * par.virtual_stages)
    starts = [sum(counts[:j]) for j in range(len(counts))]
    return [range(starts[j], starts[j] + counts[j]) for j in (c * par.pp + stage for c in range(par.virtual_stages))]


def stage_profile(profile: Profile, layers: int, par: Parallelism, stage: int) -> Profile:
    """`profile` cut to what one rank of pipeline stage `stage` holds: its layers' tensors (the embedding on
    the first stage, the rest outside the layers on the last), each split over the TP ranks and experts' over
    the EP ranks too (reduced on a group ep times smaller, whose ring moves ep times fewer bytes: counted so),
    flattened to its elements (`_split`)."""
    mine = {i for chunk in stage_layer_ranges(layers, par, stage) for i in chunk}
    kept: list[TensorSpec] = []
    for t in profile.tensors:
        layer = _LAYER.search(t.name)
        if layer is not None and int(layer.group(1)) in mine or layer is None and _outside_layers_here(t, stage,
                                                                                                       par.pp):
            kept.append(replace(t, shape=(max(1, math.ceil(math.prod(t.shape or (1,)) / _split(par, t))),)))
    # the stage's backward starts where its first gradient is ready: ready FLOPs and order from there
    low = min(t.ready_flops for t in kept) if kept else 0.0
    ranked = sorted(range(len(kept)), key=lambda i: kept[i].ready_index)
    kept = [replace(t, ready_flops=t.ready_flops - low, ready_index=ranked.index(i)) for i, t in enumerate(kept)]
    index = {t.name: i for i, t in enumerate(kept)}
    units = tuple(UnitSpec(u.name, tuple(index[profile.tensors[i].name] for i in u.tensors
                                         if profile.tensors[i].name in index), u.forward_flops, u.backward_flops)
                  for u in profile.units)
    units = tuple(u for u in units if u.tensors)
    backward = max((t.ready_flops for t in kept), default=0.0)
    forward = sum(u.forward_flops for u in units) or backward / 2
    return replace(profile, tensors=tuple(kept), units=units, forward_flops=forward,
                   backward_flops=max(backward, sum(u.backward_flops for u in units)))


def _split(par: Parallelism, tensor: TensorSpec) -> int:
    """Over how many ranks of its stage a tensor is split: routed experts over ep x the experts' tp, matrices
    over tp; norms and an MoE router (`.gate.weight`, not a gate_proj) are whole on each (by name: a profile may
    hold a layer's matrices flattened to one dimension)."""
    if "expert" in tensor.name and "shared" not in tensor.name:
        return par.ep * (par.expert_tp or par.tp)
    if "norm" in tensor.name or tensor.name.endswith((".gate.weight", ".router.weight")):
        return 1
    return par.tp


def _outside_layers_here(tensor: TensorSpec, stage: int, pp: int) -> bool:
    """A tensor outside the layers: the embedding on the first stage, the final norm and head on the last."""
    embedding = "embed" in tensor.name or "wte" in tensor.name
    return stage == 0 if embedding else stage == pp - 1
