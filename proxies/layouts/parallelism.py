"""Parallel layouts: how a training job splits a transformer over its GPUs beyond data parallelism.

A layout gives each parallel dimension its degree: tensor (`tp`, optionally with sequence
parallelism), pipeline (`pp`, with its schedule, micro-batches and virtual stages), context (`cp`),
expert (`ep`) and data (`dp`, run as one of the setups of proxies/setups.py: ddp, fsdp-full, ...).
`tp x pp x cp x dp` is the number of GPUs; expert parallelism is carved out of the data- and
context-parallel ranks of one tensor and pipeline position (torchtitan borrows its EP ranks from
dp_shard x cp), so `ep` divides `dp x cp`; with the experts' own tensor parallelism at 1 (`etp1`,
Megatron-Core's `--expert-tensor-parallel-size 1`, which its MoE recipes set), the tensor-parallel ranks
join them: EP groups are then `ep` consecutive ranks of the flattened dp x cp x tp ranks of a pipeline
stage, so an EP group of 8 fills a node under TP 2, and `ep` divides `dp x cp x tp`. On a model with
experts `etp1` under TP needs sequence parallelism (`tp2sp`), as Megatron-Core's MoELayer refuses to train
MoE layers under TP without it (megatron/core/transformer/moe/moe_layer.py @ 00119989).

Ranks are laid out on a mesh (pp, dp, cp, tp), tensor innermost: consecutive ranks form a TP group,
so TP stays inside a node, then CP, then DP, with pipeline stages outermost (Megatron-LM's default
order "tp-cp-ep-dp-pp", arguments.py `--rank-order`, read outermost last). torch's
`init_device_mesh(device, (pp, dp, cp, tp), mesh_dim_names=("pp", "dp", "cp", "tp"))` gives the
same groups (tests/unit/proxies/layouts/test_parallelism.py checks it).

Spelling (`--layout` on predict-scaling and friends): comma-separated degrees, each a dimension and
its size, `tp8`, `tp8sp` (with sequence parallelism), `pp4`, `cp2`, `ep8`, `etp1` (the experts
without tensor parallelism), and the data-parallel part as `dpN` (the command's `--setup`), `ddpN`,
`fsdpN` (fsdp-full), `hsdpN` (fsdp-hybrid: sharded over the replicas inside a node, replicated across
nodes), `hsdpRxS` (fsdp-hybrid with its shard group sized: R replicas of S-rank shard groups, torchtitan's
dp_replicate x dp_shard, `hsdp8x16`) or `SETUP:N` for any setup (`zero1:32`). A dimension left
out has degree 1; `dp` may be left out and is then what the GPUs leave (`tp8,pp2` on 256 GPUs: dp 16).
A layout with a pipeline may carry its own schedule after `@`: `tp8sp,pp4,fsdp32@interleaved:2` (interleaved
1F1B, 2 virtual stages a rank), `pp2,fsdp8@gpipe`; without one it takes the command's (`--pp-schedule`,
`--virtual-stages`). A layout without a pipeline has no schedule: the command's do not apply to it, and one
written after `@` is refused.
"""
from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass

from commbench.proxies.setups import SETUPS

SCHEDULES = ("gpipe", "1f1b", "interleaved")  # torch.distributed.pipelining: ScheduleGPipe, Schedule1F1B, ...
MESH = ("pp", "dp", "cp", "tp")  # the mesh's dimensions, outermost first
DP_SHORTHANDS = {"ddp": "ddp", "fsdp": "fsdp-full", "hsdp": "fsdp-hybrid"}  # dp (no name): the command's --setup
EXAMPLE = ("tp8,pp2,fsdp16 (dimensions tp, tpNsp, pp, cp, ep and the data-parallel part dpN/ddpN/fsdpN/hsdpN/hsdpRxS/"
           "SETUP:N)")


class LayoutError(ValueError):
    """A layout that cannot be: bad spelling, degrees that do not multiply to the GPUs, a degree that does
    not divide what it splits. One line for the user."""


@dataclass(frozen=True)
class Parallelism:
    """A layout's degrees and pipeline schedule; `setup` runs the data-parallel dimension."""
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    dp: int = 1
    sequence_parallel: bool = False
    setup: str = "ddp"
    pp_schedule: str = "1f1b"
    microbatches: int = 1
    virtual_stages: int = 1  # model chunks per pipeline rank (interleaved 1F1B)
    expert_tp: int | None = None  # the experts' tensor parallelism: None (tp, Megatron-Core's default) or 1
    # HSDP (fsdp-hybrid) only: the dp ranks one shard group spans, consecutive on the dp axis (torchtitan's
    # dp_shard; FSDP shards over dp_shard x cp); None: the replicas inside one node
    dp_shard: int | None = None

    @property
    def world(self) -> int:
        return self.tp * self.pp * self.cp * self.dp

    @property
    def name(self) -> str:
        """The layout as `--layout` spells it (degree-1 dimensions left out)."""
        parts = [f"tp{self.tp}{'sp' if self.sequence_parallel else ''}" if self.tp > 1 else "",
                 f"pp{self.pp}" if self.pp > 1 else "", f"cp{self.cp}" if self.cp > 1 else "",
                 f"ep{self.ep}" if self.ep > 1 else "", "etp1" if self.expert_tp == 1 and self.tp > 1 else ""]
        short = {v: k for k, v in DP_SHORTHANDS.items()}
        if self.dp_shard:
            parts.append(f"hsdp{self.dp // self.dp_shard}x{self.dp_shard}")
        else:
            parts.append(f"{short[self.setup]}{self.dp}" if self.setup in short else f"{self.setup}:{self.dp}")
        return ",".join(p for p in parts if p) + self.schedule_suffix

    @property
    def schedule_suffix(self) -> str:
        """`@gpipe`, `@interleaved:2`: the pipeline's schedule as a layout spells it; "" for 1F1B or no pipeline."""
        if self.pp == 1 or (self.pp_schedule == "1f1b" and self.virtual_stages == 1):
            return ""
        return f"@{self.pp_schedule}" + (f":{self.virtual_stages}" if self.virtual_stages > 1 else "")

    def to_dict(self) -> dict:
        return {"layout": self.name, **asdict(self)}

    # ------------------------------------------------------------ the mesh

    def coords(self, rank: int) -> dict[str, int]:
        """The rank's position on the mesh (pp, dp, cp, tp), tensor innermost."""
        sizes = {"pp": self.pp, "dp": self.dp, "cp": self.cp, "tp": self.tp}
        out, rest = {}, rank
        for dim in reversed(MESH):
            out[dim] = rest % sizes[dim]
            rest //= sizes[dim]
        return {dim: out[dim] for dim in MESH}

    def rank_of(self, coords: dict[str, int]) -> int:
        rank = 0
        for dim in MESH:
            rank = rank * getattr(self, dim) + coords[dim]
        return rank

    def group(self, rank: int, dim: str) -> tuple[int, ...]:
        """The ranks of `rank`'s group along `dim`: a mesh dimension, `ep` (ep consecutive ranks of the
        flattened dp x cp ranks at this rank's pp and tp) or `edp` (the expert-data-parallel ranks: the same
        place in each EP group)."""
        at = self.coords(rank)
        if dim in MESH:
            return tuple(self.rank_of({**at, dim: i}) for i in range(getattr(self, dim)))
        inner = self.tp if self.expert_tp == 1 else 1  # the TP ranks join the experts' ranks under etp1
        flat = (at["dp"] * self.cp + at["cp"]) * inner + (at["tp"] if inner > 1 else 0)
        if dim == "ep":
            members = [flat - flat % self.ep + i for i in range(self.ep)]
        elif dim == "edp":
            members = [flat % self.ep + i * self.ep for i in range(self.dp * self.cp * inner // self.ep)]
        else:
            raise KeyError(dim)
        return tuple(self.rank_of({**at, "dp": f // inner // self.cp, "cp": f // inner % self.cp,
                                   "tp": f % inner if inner > 1 else at["tp"]}) for f in members)

    def hsdp_groups(self, rank: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """HSDP's (shard group, replicate group) of `rank`: the ranks its shard spans (dp_shard consecutive dp
        positions, each with every cp position, as torchtitan's dp_shard_cp), and the ranks holding the same
        shard (the same place in each shard group). Without dp_shard: one shard group of every dp x cp rank."""
        at, size = self.coords(rank), self.dp_shard or self.dp
        first = at["dp"] - at["dp"] % size
        shard = tuple(self.rank_of({**at, "dp": first + i, "cp": c}) for i in range(size) for c in range(self.cp))
        replicate = tuple(self.rank_of({**at, "dp": at["dp"] % size + j * size}) for j in range(self.dp // size))
        return shard, replicate

    def nodes_spanned(self, dim: str, ranks_per_node: int) -> tuple[int, int]:
        """(nodes, ranks per node) of one group along `dim` when nodes hold `ranks_per_node` consecutive ranks."""
        members = self.group(0, dim)
        nodes = len({r // ranks_per_node for r in members})
        return nodes, len(members) // nodes

    # ------------------------------------------------------------ checks

    def check(self, gpus: int | None = None, ranks_per_node: int | None = None, shape=None,
              within_node: tuple[str, ...] = ()) -> None:
        """LayoutError unless the layout can run: degrees at least 1, their product `gpus`, the schedule's
        micro-batches, `shape` (a model's TransformerShape: heads, kv_heads, layers, experts, seq_len) split
        evenly, and the dimensions in `within_node` inside one node of `ranks_per_node` ranks."""
        for dim in ("tp", "pp", "cp", "ep", "dp", "microbatches", "virtual_stages"):
            if getattr(self, dim) < 1:
                raise LayoutError(f"{self.name}: {dim} must be at least 1 (got {getattr(self, dim)})")
        if shape is not None and self.ep > 1 and not shape.experts:
            raise LayoutError(f"{self.name}: ep {self.ep} on a model without experts")
        if gpus is not None and self.world != gpus:
            carved = " (ep is carved out of dp x cp: it does not multiply)" if self.ep > 1 else ""
            raise LayoutError(f"{self.name}: tp x pp x cp x dp = {self.tp} x {self.pp} x {self.cp} x {self.dp} = "
                              f"{self.world} GPUs, not {gpus}{carved}")
        if self.expert_tp not in (None, 1, self.tp):
            raise LayoutError(f"{self.name}: the experts' tensor parallelism is tp ({self.tp}) or 1 (etp1)")
        if self.expert_tp == 1 and self.tp > 1:
            if (self.dp * self.cp * self.tp) % self.ep:
                raise LayoutError(f"{self.name}: ep {self.ep} must divide dp x cp x tp = {self.dp * self.cp * self.tp} "
                                  "(under etp1, expert-parallel ranks are data-, context- or tensor-parallel ranks)")
        elif (self.dp * self.cp) % self.ep:
            raise LayoutError(f"{self.name}: ep {self.ep} must divide dp x cp = {self.dp * self.cp} (expert-parallel "
                              "ranks are data- or context-parallel ranks; etp1 lets tensor-parallel ranks join)")
        hybrid = self.setup in SETUPS and dict(SETUPS[self.setup].fixed).get("shard_group") == "node"
        if self.dp_shard is not None and (not hybrid or self.dp_shard < 1 or self.dp % self.dp_shard):
            raise LayoutError(f"{self.name}: a shard group size is HSDP's (hsdpRxS, R x S = dp), not {self.setup}'s "
                              f"with dp {self.dp}")
        self._check_schedule()
        if shape is not None:
            self._check_shape(shape)
        for dim in within_node:
            if ranks_per_node and self.nodes_spanned(dim, ranks_per_node)[0] > 1:
                raise LayoutError(f"{self.name}: the {dim} groups cross nodes of {ranks_per_node} GPUs")

    def _check_schedule(self) -> None:
        if self.pp_schedule not in SCHEDULES:
            raise LayoutError(f"pipeline schedule {self.pp_schedule!r}: choose from {', '.join(SCHEDULES)}")
        if self.virtual_stages > 1 and self.pp_schedule != "interleaved":
            raise LayoutError(f"{self.name}: --virtual-stages {self.virtual_stages} needs --pp-schedule interleaved")
        if self.pp_schedule == "interleaved" and self.pp > 1 and self.microbatches % self.pp:
            raise LayoutError(f"{self.name}: interleaved 1F1B runs micro-batches in groups of pp = {self.pp}; "
                              f"{self.microbatches} micro-batches is not a multiple (Megatron-LM refuses it too)")

    def _check_shape(self, shape) -> None:
        if shape.kv_heads % self.tp and self.tp % shape.kv_heads:
            raise LayoutError(f"{self.name}: tp {self.tp} neither divides the model's {shape.kv_heads} key/value heads "
                              "nor is a multiple of them (each TP rank holds whole key/value heads, or copies)")
        stages = self.pp * self.virtual_stages
        if stages > shape.layers:
            raise LayoutError(f"{self.name}: {stages} pipeline stages for the model's {shape.layers} layers (a stage "
                              "holds one layer at least)")
        if shape.layers % stages and ((shape.layers + 2) % stages or stages < 3 or shape.layers + 2 < 2 * stages):
            virtual = " x virtual stages" if self.virtual_stages > 1 else ""
            raise LayoutError(f"{self.name}: pp{virtual} = {stages} does not divide the model's {shape.layers} layers "
                              "(nor do they divide with one layer fewer on the first and last stage, as Llama 3 "
                              "balanced its pipeline)")
        splits = [("tp", self.tp, "attention heads", shape.heads),
                  ("cp", 2 * self.cp if self.cp > 1 else 1, "sequence length (2 x cp chunks, load-balanced)",
                   shape.seq_len)]
        if self.ep > 1:
            splits.append(("ep", self.ep, "experts", shape.experts))
        for dim, degree, what, total in splits:
            if total % degree:
                raise LayoutError(f"{self.name}: {dim} = {degree} does not divide the model's {total} {what}")
        if self.expert_tp == 1 and self.tp > 1 and not self.sequence_parallel and shape.experts:
            raise LayoutError(f"{self.name}: etp1 under tp needs sequence parallelism (tp{self.tp}sp): Megatron-Core "
                              "refuses to train MoE layers under tensor parallelism without it")


def parse_layout(text: str, setup: str = "ddp", gpus: int | None = None, **schedule) -> Parallelism:
    """A layout from its spelling (module docstring); `setup` runs a `dpN` part; `gpus` gives dp when the
    spelling leaves it out; `schedule`: pp_schedule, microbatches, virtual_stages, the command's: a schedule
    after `@` in the spelling replaces them, and a layout without a pipeline takes neither pp_schedule nor
    virtual_stages. Checks degrees only: `Parallelism.check` checks the rest."""
    if not text or not text.strip():
        raise LayoutError(f"empty layout; spell it like {EXAMPLE}")
    text, at, suffix = text.partition("@")
    own = _schedule_suffix(text, suffix) if at else {}
    degrees: dict = {}
    for part in (p.strip() for p in text.split(",")):
        key, value = _part(part, setup)
        if key in degrees or (key == "setup" and "dp" in degrees):
            raise LayoutError(f"layout {text!r}: {part!r} gives a dimension twice")
        degrees.update(value)
    if "dp" not in degrees:
        rest = math.prod(degrees.get(d, 1) for d in ("tp", "pp", "cp"))
        if gpus is None or gpus % rest:
            raise LayoutError(f"layout {text!r} names no data-parallel part and {gpus} GPUs do not divide by "
                              f"tp x pp x cp = {rest}" if gpus else f"layout {text!r}: name the data-parallel part "
                              f"(e.g. fsdp16), or give the GPUs")
        degrees["dp"] = gpus // rest
    degrees.setdefault("setup", setup)
    schedule = {k: v for k, v in schedule.items() if v is not None}
    if degrees.get("pp", 1) == 1:
        if own:
            raise LayoutError(f"layout {text}@{suffix}: a schedule for a layout without a pipeline (add ppN)")
        schedule = {k: v for k, v in schedule.items() if k not in PIPELINE_ONLY}
    return Parallelism(**degrees, **{**schedule, **own})


PIPELINE_ONLY = ("pp_schedule", "virtual_stages")  # what a layout without a pipeline does not take


def _schedule_suffix(text: str, suffix: str) -> dict:
    """`gpipe`, `1f1b`, `interleaved:V` (after a layout's `@`): its pipeline_schedule and virtual_stages."""
    name, colon, digits = suffix.strip().lower().partition(":")
    if name not in SCHEDULES or (colon and not (digits.isascii() and digits.isdigit())) \
            or (name == "interleaved") != bool(colon):
        raise LayoutError(f"layout {text}@{suffix}: spell a pipeline schedule @gpipe, @1f1b or @interleaved:V "
                          "(V virtual stages a rank, 2 or more)")
    virtual = _degree(f"@{suffix}", digits) if colon else 1
    if name == "interleaved" and virtual < 2:
        raise LayoutError(f"layout {text}@{suffix}: interleaved needs 2 virtual stages or more (1 is 1F1B)")
    return {"pp_schedule": name, "virtual_stages": virtual}


_PART = re.compile(r"^(tp|pp|cp|ep|etp)(\d+)(sp)?$|^(dp|ddp|fsdp|hsdp)(\d+)(?:x(\d+))?$|^([a-z][a-z0-9-]*):(\d+)$",
                   re.ASCII)


def _part(part: str, setup: str) -> tuple[str, dict]:
    match = _PART.match(part.lower())
    if not match or (match.group(3) and match.group(1) != "tp") or (match.group(6) and match.group(4) != "hsdp"):
        raise LayoutError(f"layout part {part!r}: spell a layout like {EXAMPLE}")
    dim, size, sp, dp_name, dp_size, shard_size, named, named_size = match.groups()
    if dim == "etp":
        if size != "1":
            raise LayoutError(f"layout part {part!r}: the experts' tensor parallelism is tp (leave it out) or etp1")
        return "expert_tp", {"expert_tp": 1}
    if dim:
        return dim, {dim: _degree(part, size), **({"sequence_parallel": True} if sp else {})}
    name = (DP_SHORTHANDS[dp_name] if dp_name != "dp" else setup) if dp_name else DP_SHORTHANDS.get(named, named)
    if shard_size:  # hsdpRxS: R replicas of S-rank shard groups
        replicas, shards = _degree(part, dp_size), _degree(part, shard_size)
        return "dp", {"dp": _degree(part, str(replicas * shards)), "setup": name, "dp_shard": shards}
    return "dp", {"dp": _degree(part, dp_size or named_size), "setup": name}


def _degree(part: str, digits: str) -> int:
    if not (digits.isascii() and digits.isdigit()):
        raise LayoutError(f"layout part {part!r}: a degree is written in ASCII digits")
    value = int(digits)
    if not 1 <= value <= 1 << 20:
        raise LayoutError(f"layout part {part!r}: a degree is 1 to {1 << 20}")
    return value
