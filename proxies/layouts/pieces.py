"""A rank's compute per micro-batch in the pieces the layout replay spins (`RankCompute`: a decoder layer, a CP
attention block beyond the diagonal, the embedding, the head with its loss, the optimizer's update), and those
pieces costed from a compute block (`from_block`): pure, so that `check` can set a replay's measured pieces against
the block's (analysis/check_layout.py) and the replays can spin the block's (proxies/layouts/compute.py measures
them on the ranks)."""
from __future__ import annotations

from dataclasses import astuple, dataclass, fields

from commbench.proxies.layouts.parallelism import Parallelism
from commbench.proxies.layouts.stage_share import stage_layer_ranges

UPDATE_BYTES_PER_PARAMETER = 5 * 4  # SGD with momentum: the parameter, its gradient and momentum read, two written
LAYER_TENSORS = 9  # a Llama decoder layer's parameter tensors: q, k, v, o, gate, up, down and the two norms


@dataclass(frozen=True)
class RankCompute:
    """One rank's compute per micro-batch, microseconds: a decoder layer, a CP attention block beyond the
    diagonal, the embedding (first stage), the head with its loss (last stage); and the optimizer per step."""
    layer_forward_us: float = 0.0
    layer_backward_us: float = 0.0
    block_forward_us: float = 0.0
    block_backward_us: float = 0.0
    embed_forward_us: float = 0.0
    embed_backward_us: float = 0.0
    head_forward_us: float = 0.0
    head_backward_us: float = 0.0
    optimizer_us: float = 0.0

    def values(self) -> list[float]:
        return list(astuple(self))

    @classmethod
    def of(cls, values) -> RankCompute:
        return cls(*(float(v) for v in values))

    def text(self) -> str:
        return ", ".join(f"{f.name.removesuffix('_us').replace('_', ' ')} {getattr(self, f.name) / 1e3:.3f} ms"
                         for f in fields(self) if getattr(self, f.name))


def from_block(block, par: Parallelism, shape, microbatch: int, stage: int, dtype: str) -> RankCompute:
    """A rank's pieces costed from a compute block (`proxy --layout --compute block`; costmodel/compute.py) as
    predict-scaling --layout costs them (proxies/layouts/layer_ops.py): the layer on its own block (the CP ring's other
    blocks apart, one each), its wrappers' share; the embedding's gather and the optimizer's update (SGD with
    momentum: 5 words a parameter) at the block's memory bandwidth. No core share: the replay's ranks share the
    cores for real."""
    from commbench.proxies.layouts import layer_ops as L
    from commbench.proxies.layouts import memory as M
    from commbench.proxies.setups import SETUPS

    setup = SETUPS.get(par.setup)
    fsdp = setup is not None and setup.trains_as == "fsdp"
    ops = [op for op in L.layer_ops(shape, par, microbatch, 0) if op.label != "attention (cp ring)"]
    layer = L.rank_layer_times(block, ops, dtype, par.tp > 1, fsdp)
    heads, local = shape.heads // par.tp, shape.seq_len // par.cp
    ring = block.attention_us(microbatch * heads, local, local, shape.head_dim, False, dtype) if par.cp > 1 \
        else (0.0, 0.0)
    out = {"layer_forward_us": layer.forward_us, "layer_backward_us": layer.backward_us,
           "block_forward_us": ring[0], "block_backward_us": ring[1]}
    tokens, width = microbatch * local, 4 if dtype == "float32" else 2
    rest = block.framework_us  # what `commbench compute` measured of the real head, embedding and update beyond these
    if stage == 0:
        gather = block.memory_us(2 * tokens * shape.hidden * width) + (block.op_us or 0.0)
        out.update(embed_forward_us=gather + rest.get("embed_forward", 0.0),
                   embed_backward_us=2 * gather + rest.get("embed_backward", 0.0))
    if stage == par.pp - 1:
        head = L.op_times(block, L.head_ops(shape, par, microbatch), dtype, framework=False)
        root = block.framework_us if fsdp else {}
        out.update(head_forward_us=head.forward_us + root.get("fsdp_unit_forward", 0.0) + rest.get("head_forward", 0.0),
                   head_backward_us=head.backward_us + root.get("fsdp_unit_backward", 0.0)
                   + rest.get("head_backward", 0.0))
    dense, experts, _ = M.stage_parameters(shape, par, stage)
    shards = optimizer_shards(par, setup)
    layers = sum(len(chunk) for chunk in stage_layer_ranges(shape.layers, par, stage))
    # the update's tensors: a dense Llama layer's each, the embedding on the first stage, the final norm and the head
    # on the last
    tensors = layers * LAYER_TENSORS + (stage == 0) + 2 * (stage == par.pp - 1)
    out["optimizer_us"] = block.memory_us(UPDATE_BYTES_PER_PARAMETER * (dense + experts) / shards) + \
        tensors * rest.get("optimizer_tensor", 0.0)
    return RankCompute(**out)


def optimizer_shards(par: Parallelism, setup) -> int:
    """How many ranks share each parameter's optimizer step: the data-parallel (and CP) ranks where the setup
    shards the optimizer's states (ZeRO-1 and -2, FSDP: each updates its shard, as proxies/setup_steps.py's
    models charge 1/shards of the step), else 1."""
    return par.dp * par.cp if setup is not None and setup.memory_sharding != "none" else 1
