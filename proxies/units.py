"""Sharding units: the modules an FSDP wrapping policy wraps in a model, chosen as FSDP users wrap
each family, and the parameter tensors each unit holds.

- transformers models: every module whose class is in the model's `_no_split_modules`
  (LlamaDecoderLayer, GPT2Block, BertLayer and BertEmbeddings, ...): what accelerate's FSDP plugin,
  and transformers' Trainer through it, hands to `transformer_auto_wrap_policy` under
  TRANSFORMER_BASED_WRAP when no class is named (accelerate src/accelerate/utils/dataclasses.py,
  `FullyShardedDataParallelPlugin.set_auto_wrap_policy`);
- CNNs and ViTs: every residual block (`BLOCKS`, by the model's class): torchvision ResNet's
  BasicBlock/Bottleneck in layer1..layer4, timm ViT's `blocks.N`, ...;
- plain Sequentials (VGG, AlexNet): every module with parameters of their own directly in
  `features` and `classifier` (`LAYERS`);
- commbench's U-Net: every top-level module with parameters (`CHILDREN`);
- any other model: the root alone (FSDP without an auto_wrap_policy), unless classes are named.

The root module "" holds the parameters no wrapped module holds. A parameter belongs to the innermost
wrapped module holding it (FSDP's rule: a nested unit's parameters are not its parent's).

Tied parameters (BERT's word embeddings and its masked-LM decoder, GPT-2's wte and lm_head) must sit
in one FSDP group: FSDP2 refuses a parameter "shared with a parameter already managed by another FSDP
group". So a module that holds a parameter also held by a module outside it is not wrapped (`untie`):
its parameters go to the nearest unit holding every module that shares them, the root at the latest.
BERT's BertEmbeddings is therefore not a unit; its tensors are the root's. Nothing here imports torch:
the functions read a module's `named_modules()` and `parameters()`.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from commbench.proxies.catalog import ModelError

# The model's class -> its residual blocks' classes (each wrapped, as ModuleWrapPolicy({...}) wraps them).
BLOCKS: dict[str, tuple[str, ...]] = {
    "ResNet": ("BasicBlock", "Bottleneck"),  # torchvision resnet*, resnext*, wide_resnet*
    "Inception3": ("InceptionA", "InceptionB", "InceptionC", "InceptionD", "InceptionE", "InceptionAux"),
    "MobileNetV2": ("InvertedResidual",),  # torchvision
    "VovNet": ("OsaBlock",),  # timm
    "VisionTransformer": ("Block", "EncoderBlock"),  # timm's blocks.N, torchvision's encoder.layers.encoder_layer_N
    "SpeechTransformer": ("EncoderLayer", "DecoderLayer"),  # proxies/models/speech_transformer.py
    "SpeakerEncoder": ("LSTMWithProjection",),  # proxies/models/tts_angular.py
}
# Plain Sequential models: every module with parameters directly in these children.
LAYERS: dict[str, tuple[str, ...]] = {"VGG": ("features", "classifier"), "AlexNet": ("features", "classifier")}
# Models wrapped module by top-level module.
CHILDREN = frozenset({"UNet"})  # proxies/models/unet.py: inc, down1..4, up1..4, outc


@dataclass(frozen=True)
class WrapPolicy:
    description: str  # what the profile's source.units says
    names: tuple[str, ...]  # paths of the wrapped modules, in registration order (the root "" not among them)


def wrap_policy(module: Any, classes: Iterable[str] = ()) -> WrapPolicy:
    """The modules FSDP users wrap in `module` (see the module docstring); `classes` names the classes
    to wrap instead, as `--wrap` does."""
    kind = type(module).__name__
    named = [(name, sub) for name, sub in module.named_modules() if name]
    classes = tuple(classes)
    no_split = sorted(getattr(module, "_no_split_modules", None) or ())
    if classes:
        present = {type(sub).__name__ for _, sub in named}
        missing = [name for name in classes if name not in present]
        if missing:
            raise ModelError(f"--wrap {','.join(classes)}: {kind} has no module of class {missing[0]}; its classes "
                             f"with parameters: {', '.join(sorted(_classes_with_parameters(named)))}")
        chosen, why = classes, f"every module of class {', '.join(classes)} (named with --wrap)"
    elif no_split:
        chosen, why = tuple(no_split), (f"every module of class {', '.join(no_split)}: the model's _no_split_modules, "
                                        "what accelerate's FSDP plugin wraps under TRANSFORMER_BASED_WRAP when no "
                                        "class is named (transformer_auto_wrap_policy)")
    elif kind in BLOCKS:
        chosen, why = BLOCKS[kind], f"every residual block ({kind}: modules of class {', '.join(BLOCKS[kind])})"
    elif kind in LAYERS:
        parents = LAYERS[kind]
        names = tuple(name for name, sub in named if name.partition(".")[0] in parents and name.count(".") == 1
                      and _has_own_parameters(sub))
        return _untied(module, f"every module with parameters directly in {' and '.join(parents)} ({kind})", names)
    elif kind in CHILDREN:
        names = tuple(name for name, sub in named if "." not in name and _has_parameters(sub))
        return _untied(module, f"every top-level module with parameters ({kind})", names)
    else:
        return WrapPolicy(f"the root alone: no wrapping policy known for {kind} (FSDP without an auto_wrap_policy); "
                          "`profiles extract --wrap CLASS,...` names the classes to wrap", ())
    return _untied(module, why, tuple(name for name, sub in named if type(sub).__name__ in chosen))


def _untied(module: Any, why: str, names: tuple[str, ...]) -> WrapPolicy:
    kept = untie(module, names)
    left = [name for name in names if name not in kept]
    if left:
        why += (f"; not {', '.join(left)}: {'they hold' if len(left) > 1 else 'it holds'} a parameter tied to a "
                "module outside (FSDP keeps tied parameters in one group), left to the unit holding both")
    return WrapPolicy(why, kept)


def untie(module: Any, names: Iterable[str]) -> tuple[str, ...]:
    """`names` without the modules that hold a parameter also held by a module outside them (tied weights),
    which FSDP cannot shard as a unit of their own."""
    holders: dict[int, list[str]] = {}  # parameter -> the modules holding it directly
    for path, sub in module.named_modules(remove_duplicate=False):
        for param in sub.parameters(recurse=False):
            holders.setdefault(id(param), []).append(path)
    tied = [paths for paths in holders.values() if len(set(paths)) > 1]
    return tuple(name for name in names
                 if not any(any(_within(p, name) for p in paths) and not all(_within(p, name) for p in paths)
                            for paths in tied))


def _within(path: str, unit: str) -> bool:
    """Whether the module at `path` is the unit `unit` or nested in it."""
    return path == unit or _inside(path, unit)


def _classes_with_parameters(named: list[tuple[str, Any]]) -> set[str]:
    return {type(sub).__name__ for _, sub in named if _has_parameters(sub)}


def _has_own_parameters(module: Any) -> bool:
    return any(True for _ in module.parameters(recurse=False))


def _has_parameters(module: Any) -> bool:
    return any(True for _ in module.parameters())


def _inside(inner: str, outer: str) -> bool:
    """Whether the module at path `inner` is nested in the one at `outer` ("" is the root)."""
    return outer == "" or inner.startswith(outer + ".")


def nearest_unit(name: str, names: Iterable[str]) -> str:
    """The innermost unit that `name` (a unit's path) is nested in; "" (the root) if none."""
    return max((other for other in names if other != name and _inside(name, other)), key=len, default="")


def unit_tensors(module: Any, names: Iterable[str], params: list[Any]) -> dict[str, tuple[int, ...]]:
    """Unit path -> the indices (into `params`, the profile's tensors) of the parameters it holds:
    each parameter in the innermost unit holding it, the rest in the root ""."""
    position = {id(p): i for i, p in enumerate(params)}
    owner: dict[int, str] = {}
    for name in names:
        for param in module.get_submodule(name).parameters():
            index = position.get(id(param))
            if index is not None and (index not in owner or _inside(name, owner[index])):
                owner[index] = name
    held: dict[str, list[int]] = {"": [i for i in range(len(params)) if i not in owner]}
    for name in names:
        held[name] = []
    for index in sorted(owner):
        held[owner[index]].append(index)
    return {name: tuple(indices) for name, indices in held.items()}
