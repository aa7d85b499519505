"""Build a profile from a real model definition: parameter tensors in registration order,
FLOPs per sample measured with torch.utils.flop_counter, and the order and FLOP count at
which each gradient becomes ready in backward.

The model runs one forward and backward under FlopCounterMode, on the meta device when
the model allows it (no memory, no compute: FLOPs come from shapes) and on the CPU
otherwise. A hook on every parameter (`register_post_accumulate_grad_hook`, the moment
DDP's autograd hook fires too) records the backward FLOPs done so far; that gives both
the gradient-ready order DDP rebuilds its buckets in and each tensor's ready time as a
share of the backward.
"""
from __future__ import annotations

from typing import Any, Callable

from commbench.proxies.catalog import CATALOG, BuiltModel, ModelError, build, build_named, loss_of
from commbench.proxies.profile import DTYPE_BYTES, Profile, TensorSpec

FLOP_BATCH = 2  # FLOPs are counted on 2 samples and halved: batch norm needs more than one in training


def extract(spec: str, input_shape: tuple[int, ...] = (), name: str | None = None,
            default_batch: int | None = None, sample_unit: str | None = None) -> Profile:
    """A profile for a catalog name (resnet50) or any model spec (timm:NAME, module:callable, ...)."""
    import torch

    catalog = CATALOG.get(spec)
    built, counts = _count(lambda: build_named(spec) if catalog else build(spec, input_shape), torch)
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
              "ready_order": "post-accumulate-grad hooks in one backward (the order DDP rebuilds buckets in)"}
    if not catalog:  # how to build it again (train, --compute measured)
        source.update(spec=spec, **({"input_shape": list(input_shape)} if input_shape else {}))
    if catalog:
        source.update({"default_batch": catalog.batch_source, **({"note": catalog.note} if catalog.note else {})})
    if counts["unused"]:
        source["unused_parameters"] = counts["unused"]
    own = built.declared  # what a module:callable's module says of its inputs (INPUT)
    return Profile(name or (catalog.name if catalog else _default_name(spec)), tuple(tensors),
                   counts["forward"], counts["backward"], built.input_shape,
                   sample_unit or (catalog.sample_unit if catalog else own.get("unit", "samples")),
                   default_batch or (catalog.default_batch if catalog else own.get("default_batch", 32)), source)


def _default_name(spec: str) -> str:
    return spec.split(":")[1] if spec.count(":") >= 1 else spec


def _count(make: Callable[[], BuiltModel], torch) -> tuple[BuiltModel, dict[str, Any]]:
    """The model, and its forward/backward FLOPs per sample and, per parameter, (ready FLOPs,
    ready index): built and run on the meta device if every op allows it, else on the CPU."""
    try:
        with torch.device("meta"):
            built = make()
            return built, _count_on(built, "meta")
    except (NotImplementedError, RuntimeError, TypeError):  # an op without a meta kernel
        built = make()
        return built, _count_on(built, "cpu")


def _conv_backward_flops(grad_out_shape, x_shape, w_shape, _bias, _stride, _padding, _dilation, transposed,
                         _output_padding, _groups, output_mask, out_shape=None, **_) -> int:
    """Backward of a convolution: the input gradient and the weight gradient each take as many
    multiply-adds as the forward. (torch's own formula ignores `groups` in the weight gradient
    and counts a depthwise convolution's backward `groups` times too high.)"""
    from torch.utils.flop_counter import conv_flop_count

    forward = conv_flop_count(list(x_shape), list(w_shape), list(grad_out_shape), transposed)
    return forward * (int(bool(output_mask[0])) + int(bool(output_mask[1])))


def _count_on(built: BuiltModel, device: str) -> dict[str, Any]:
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    module = built.module
    module.train()
    params = [p for p in module.parameters() if p.requires_grad]
    counter = FlopCounterMode(display=False, custom_mapping={
        torch.ops.aten.convolution_backward: _conv_backward_flops})
    ready: dict[int, tuple[float, int]] = {}
    forward_total = [0.0]
    hooks = []
    for index, param in enumerate(params):
        def hook(_, index=index):
            if index not in ready:  # tied weights fire once; keep the first
                ready[index] = (float(counter.get_total_flops()) - forward_total[0], len(ready))
        hooks.append(param.register_post_accumulate_grad_hook(hook))
    try:
        args, kwargs = built.make_inputs(FLOP_BATCH, device)
        with counter:
            loss = loss_of(module(*args, **kwargs))
            forward_total[0] = float(counter.get_total_flops())
            loss.backward()
        total = float(counter.get_total_flops())
    finally:
        for handle in hooks:
            handle.remove()
    backward = total - forward_total[0]
    unused = [name for i, (name, p) in enumerate((n, p) for n, p in module.named_parameters() if p.requires_grad)
              if i not in ready]
    for index in range(len(params)):  # unused parameters: DDP (find_unused_parameters) marks them ready last
        ready.setdefault(index, (backward, len(ready)))
    per_sample = {i: (flops / FLOP_BATCH, order) for i, (flops, order) in ready.items()}
    return {"forward": forward_total[0] / FLOP_BATCH, "backward": backward / FLOP_BATCH, "ready": per_sample,
            "device": device, "unused": unused}
