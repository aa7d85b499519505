"""Build a profile from a real model definition: parameter tensors in registration order,
FLOPs per sample measured with torch.utils.flop_counter, and the order and FLOP count at
which each gradient becomes ready in backward.

The model runs one forward and backward under FlopCounterMode, on the meta device when
the model allows it (no memory, no compute: FLOPs come from shapes) and on the CPU
otherwise. A hook on every parameter (`register_post_accumulate_grad_hook`, the moment
DDP's autograd hook fires too) records the backward FLOPs done so far; that gives both
the gradient-ready order DDP rebuilds its buckets in and each tensor's ready time as a
share of the backward.

The same run gives each sharding unit's FLOPs (proxies/units.py chooses the units), read
from the same counter: a unit's forward is what the counter adds between the unit's forward
pre-hook and its forward hook; its backward is what it adds while autograd runs the nodes
the unit's forward created (a pre-hook and a hook on each node of the graph; a node belongs
to the unit whose forward call spans its sequence number). The counter's own per-module
breakdown (torch.utils.module_tracker) does not do for the backward: it keeps a module
"entered" until the gradients of all its inputs are done, so a BART decoder layer, whose
input the encoder's output feeds every decoder layer, was counted again for the layers
after it (the units' backward added up to 2.1e11 FLOPs more than the backward itself).

Mixture-of-experts layers (transformers' Mixtral, DeepSeek-V3) run their experts as one
grouped matrix product (aten._grouped_mm), which the counter does not count and whose meta
kernel takes 16-bit inputs only: such a model is counted on the meta device in bfloat16 (FLOPs
do not depend on the dtype; the profile keeps the parameters' own dtype), with the grouped product
counted here. A decoder-only transformer's profile carries its shape (proxies/transformer.py).
"""
from __future__ import annotations

from typing import Any, Callable

from commbench.proxies.catalog import CATALOG, BuiltModel, ModelError, build, build_named, loss_of
from commbench.proxies.profile import DTYPE_BYTES, Profile, TensorSpec, UnitSpec
from commbench.proxies.transformer import TransformerShape, from_config
from commbench.proxies.units import WrapPolicy, nearest_unit, unit_tensors, wrap_policy

FLOP_BATCH = 2  # FLOPs are counted on 2 samples and halved: batch norm needs more than one in training
# transformers' model_type of the decoder-only models whose shape proxies/transformer.py reads
DECODERS = frozenset({"llama", "mistral", "qwen2", "mixtral", "deepseek_v3"})


def extract(spec: str, input_shape: tuple[int, ...] = (), name: str | None = None,
            default_batch: int | None = None, sample_unit: str | None = None, wrap: tuple[str, ...] = ()) -> Profile:
    """A profile for a catalog name (resnet50) or any model spec (timm:NAME, module:callable, ...);
    `wrap` names the classes whose modules are sharding units (default: proxies/units.py's policy)."""
    import torch

    catalog = CATALOG.get(spec)
    built, counts = _count(lambda: build_named(spec) if catalog else build(spec, input_shape), torch, wrap)
    params = [(n, p) for n, p in built.module.named_parameters() if p.requires_grad]
    tensors = []
    for index, (pname, param) in enumerate(params):
        dtype = str(param.dtype).replace("torch.", "")
        if dtype not in DTYPE_BYTES:
            raise ModelError(f"parameter {pname} has dtype {dtype}; profiles hold {', '.join(DTYPE_BYTES)}")
        ready_flops, ready_index = counts["ready"][index]
        tensors.append(TensorSpec(pname, tuple(param.shape), dtype, ready_flops, ready_index))
    source = {"package": built.package, "version": built.version, "constructor": built.constructor,
              "flop_counter": f"torch.utils.flop_counter.FlopCounterMode, torch {torch.__version__}, "
                              f"batch {FLOP_BATCH} on {counts['device']}, per sample",
              "ready_order": "post-accumulate-grad hooks in one backward (the order DDP rebuilds buckets in)",
              "units": f"{counts['policy'].description}; forward execution order, the root first"}
    if not catalog:  # how to build it again (train, --compute measured)
        source.update(spec=spec, **({"input_shape": list(input_shape)} if input_shape else {}))
    if catalog:
        source.update({"default_batch": catalog.batch_source, **({"note": catalog.note} if catalog.note else {})})
    if counts["unused"]:
        source["unused_parameters"] = counts["unused"]
    if counts["dtype"] != "own":
        source["flop_counter"] += f", parameters in {counts['dtype']} (the meta grouped product takes 16-bit only)"
    shape = _shape(built, tensors)
    own = built.declared  # what a module:callable's module says of its inputs (INPUT)
    return Profile(name or (catalog.name if catalog else _default_name(spec)), tuple(tensors),
                   counts["forward"], counts["backward"], built.input_shape,
                   sample_unit or (catalog.sample_unit if catalog else own.get("unit", "samples")),
                   default_batch or (catalog.default_batch if catalog else own.get("default_batch", 32)), source,
                   counts["units"], shape)


def _shape(built: BuiltModel, tensors: list[TensorSpec]) -> TransformerShape | None:
    """The shape of a decoder-only transformers model, when its parameter count is the tensors'."""
    config = getattr(built.module, "config", None)
    if getattr(config, "model_type", None) not in DECODERS or len(built.input_shape) != 1:
        return None
    shape = from_config(config, seq_len=built.input_shape[0])
    return shape if shape.parameters == sum(t.numel for t in tensors) else None


def _default_name(spec: str) -> str:
    return spec.split(":")[1] if spec.count(":") >= 1 else spec


def _count(make: Callable[[], BuiltModel], torch, wrap: tuple[str, ...]) -> tuple[BuiltModel, dict[str, Any]]:
    """The model, and its forward/backward FLOPs per sample, per parameter (ready FLOPs, ready
    index) and its sharding units: built and run on the meta device if every op allows it, else
    on the CPU."""
    for dtype in (None, torch.bfloat16):  # bfloat16: the meta grouped product (MoE experts) takes no float32
        try:
            with torch.device("meta"):
                built = make()
                own = next(built.module.parameters()).dtype
                if dtype is not None:
                    built.module.to(dtype)
                counts = _count_on(built, "meta", wrap_policy(built.module, wrap))
                built.module.to(own)
                return built, {**counts, "dtype": str(dtype).replace("torch.", "") if dtype else "own"}
        except (NotImplementedError, RuntimeError, TypeError):  # an op without a meta kernel
            continue
    built = make()
    return built, {**_count_on(built, "cpu", wrap_policy(built.module, wrap)), "dtype": "own"}


def _conv_backward_flops(grad_out_shape, x_shape, w_shape, _bias, _stride, _padding, _dilation, transposed,
                         _output_padding, _groups, output_mask, out_shape=None, **_) -> int:
    """Backward of a convolution: the input gradient and the weight gradient each take as many
    multiply-adds as the forward. (torch's own formula ignores `groups` in the weight gradient
    and counts a depthwise convolution's backward `groups` times too high.)"""
    from torch.utils.flop_counter import conv_flop_count

    forward = conv_flop_count(list(x_shape), list(w_shape), list(grad_out_shape), transposed)
    return forward * (int(bool(output_mask[0])) + int(bool(output_mask[1])))


def _grouped_mm_flops(a_shape, b_shape, *_, out_shape=None, **__) -> int:
    """aten._grouped_mm (an MoE layer's experts in one call): 2 FLOPs per multiply-add. Each output
    element is a dot product over a's last dimension, except 2-d x 2-d (a weight gradient), where
    the groups split that dimension: M x K x N in all."""
    import math

    if len(a_shape) == 2 and len(b_shape) == 2:
        return 2 * a_shape[0] * a_shape[1] * b_shape[1]
    return 2 * math.prod(out_shape) * a_shape[-1]


def _count_on(built: BuiltModel, device: str, policy: WrapPolicy) -> dict[str, Any]:
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    module = built.module
    module.train()
    params = [p for p in module.parameters() if p.requires_grad]
    counter = FlopCounterMode(display=False, custom_mapping={
        torch.ops.aten.convolution_backward: _conv_backward_flops, torch.ops.aten._grouped_mm: _grouped_mm_flops})
    ready: dict[int, tuple[float, int]] = {}
    forward_total = [0.0]
    hooks = []
    for index, param in enumerate(params):
        def hook(_, index=index):
            if index not in ready:  # tied weights fire once; keep the first
                ready[index] = (float(counter.get_total_flops()) - forward_total[0], len(ready))
        hooks.append(param.register_post_accumulate_grad_hook(hook))
    units = _UnitCounter(torch, module, policy, counter)
    try:
        args, kwargs = built.make_inputs(FLOP_BATCH, device)
        with counter:
            loss = loss_of(module(*args, **kwargs))
            forward_total[0] = float(counter.get_total_flops())
            units.watch_backward(loss)
            loss.backward()
        total = float(counter.get_total_flops())
    finally:
        units.remove()
        for handle in hooks:
            handle.remove()
    backward = total - forward_total[0]
    unused = [name for i, (name, p) in enumerate((n, p) for n, p in module.named_parameters() if p.requires_grad)
              if i not in ready]
    for index in range(len(params)):  # unused parameters: DDP (find_unused_parameters) marks them ready last
        ready.setdefault(index, (backward, len(ready)))
    per_sample = {i: (flops / FLOP_BATCH, order) for i, (flops, order) in ready.items()}
    return {"forward": forward_total[0] / FLOP_BATCH, "backward": backward / FLOP_BATCH, "ready": per_sample,
            "device": device, "unused": unused, "policy": policy,
            "units": units.specs(params, forward_total[0], backward)}


class _UnitCounter:
    """Each sharding unit's own forward and backward FLOPs in one run under `counter`, and the
    order the forward first runs the units (see the module docstring)."""

    def __init__(self, torch, module, policy: WrapPolicy, counter) -> None:
        self.torch, self.module, self.policy, self.counter = torch, module, policy, counter
        self.started: list[str] = []  # units in the order the forward first enters them
        self.calls: list[tuple[int, int, str]] = []  # (first, last sequence number, unit) per forward call
        self.forward = dict.fromkeys(policy.names, 0.0)  # FLOPs inside the unit's forward, nested units included
        self.backward = dict.fromkeys(policy.names, 0.0)  # FLOPs of the backward of the unit's own nodes
        self.open: list[tuple[int, float]] = []
        self.handles = []
        for name in policy.names:
            sub = module.get_submodule(name)
            self.handles += [sub.register_forward_pre_hook(lambda *_, name=name: self._enter(name)),
                             sub.register_forward_hook(lambda *_, name=name: self._leave(name))]

    def _sequence_number(self) -> int:
        """The autograd sequence number the next node created gets (a probe node: a view, no FLOPs)."""
        with self.torch.enable_grad():
            probe = self.torch.zeros((), requires_grad=True).view(())
        return probe.grad_fn._sequence_nr() + 1

    def _enter(self, name: str) -> None:
        if name not in self.started:
            self.started.append(name)
        self.open.append((self._sequence_number(), float(self.counter.get_total_flops())))

    def _leave(self, name: str) -> None:
        first, flops = self.open.pop()
        self.calls.append((first, self._sequence_number() - 1, name))
        self.forward[name] += float(self.counter.get_total_flops()) - flops

    def _unit_of(self, sequence_number: int) -> str | None:
        """The innermost unit whose forward call created the node (None: the root)."""
        spans = [(first, name) for first, last, name in self.calls if first <= sequence_number <= last]
        return max(spans)[1] if spans else None

    def watch_backward(self, loss) -> None:
        """Hooks on every node of `loss`'s graph that a unit's forward created."""
        seen, stack = set(), [loss.grad_fn]
        while stack:
            node = stack.pop()
            if node is None or node in seen:
                continue
            seen.add(node)
            stack.extend(next_node for next_node, _ in node.next_functions)
            unit = self._unit_of(node._sequence_nr())
            if unit is not None:
                mark = [0.0]
                self.handles += [node.register_prehook(lambda *_, mark=mark: mark.__setitem__(
                                     0, float(self.counter.get_total_flops()))),
                                 node.register_hook(lambda *_, mark=mark, unit=unit: self._add_backward(unit, mark))]

    def _add_backward(self, unit: str, mark: list[float]) -> None:
        self.backward[unit] += float(self.counter.get_total_flops()) - mark[0]

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()

    def specs(self, params: list, forward_total: float, backward_total: float) -> tuple[UnitSpec, ...]:
        """The units in forward execution order (the root first when it holds parameters or FLOPs; units
        the forward never ran last), FLOPs per sample: a unit's forward less its nested units', the
        root's the rest of the run's."""
        names = self.policy.names
        held = unit_tensors(self.module, names, params)
        order = [""] + self.started + [name for name in names if name not in self.started]
        own = {name: [self.forward[name], self.backward[name]] for name in names}
        own[""] = [forward_total, backward_total - sum(self.backward.values())]
        for name in names:
            own[nearest_unit(name, names)][0] -= self.forward[name]
        return tuple(UnitSpec(name, held[name], own[name][0] / FLOP_BATCH, own[name][1] / FLOP_BATCH)
                     for name in order if name or held[""] or any(own[""]))
