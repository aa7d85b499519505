"""Where each model definition comes from, and how to feed it: the one place that imports
torchvision, timm, transformers or commbench's own definitions (proxies/models/).

A model spec names a constructor:
  torchvision:NAME                  torchvision.models.get_model(NAME, weights=None)
  timm:NAME                         timm.create_model(NAME, pretrained=False)
  transformers:CLASS[:key=value,..] CLASS(CLASS.config_class(key=value, ...)) (a config, no weights)
  package.module:callable           callable() returns the module; the module's `example_inputs(batch)`
                                    feeds it, or --input-shape does
Every model is built with random weights; nothing is downloaded.

A spec read from a profile file (its `source.spec`) is built only if `runs_foreign_code` says no:
a model that torchvision, timm or transformers registers under a plain name, or one of commbench's
own definitions. Anything else imports and runs code the file names, which only the user may ask
for (`--trust-profile-code`; `profiles extract SPEC` names the code on the command line).
"""
from __future__ import annotations

import importlib
import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable


class ModelError(ValueError):
    """A model spec that cannot be built here (one line for the user)."""


@dataclass(frozen=True)
class ModelSpec:
    name: str
    constructor: str  # a spec string as above
    input_shape: tuple[int, ...] = ()  # one sample (image C,H,W; tokens (seq,)); () = the module's own inputs
    sample_unit: str = "images"
    default_batch: int = 32
    batch_source: str = ""  # where the default batch comes from
    note: str = ""


# TorchBench (pytorch/benchmark) is the reference for batches and input shapes: its
# models' DEFAULT_TRAIN_BSIZE and example inputs (files named in each `batch_source`).
_TB = "pytorch/benchmark torchbenchmark/models/{}/__init__.py DEFAULT_TRAIN_BSIZE"
_HF = "pytorch/benchmark torchbenchmark/util/framework/huggingface/model_factory.py (train_max_length)"
# The LLM-shaped models: a published config's hyper-parameters on the transformers class (random weights),
# with the tokens per sample and per-GPU batch of a published training setup.
_DS_GPT2 = ("microsoft/DeepSpeedExamples Megatron-LM/scripts/ds_pretrain_gpt2.sh: --batch-size 8 --seq-length 1024 "
            "per GPU (its GPT-2 345M script)")
_TITAN = "pytorch/torchtitan train_configs/{}.toml: batch_size {} (per rank), seq_len {} (FSDP)"
_LLAMA2 = ("hidden_size={},intermediate_size={},num_hidden_layers={},num_attention_heads={},vocab_size=32000,"
           "max_position_embeddings=4096,rms_norm_eps=1e-05,tie_word_embeddings=false")
# Llama 3.1: Meta's config.json for each size (meta-llama/Llama-3.1-8B, -70B, -405B) and the Llama 3 paper (Dubey et
# al. 2024, "The Llama 3 Herd of Models", Table 3); rope_scaling (type llama3) and rope_theta 500000 are left at the
# class defaults: they change no shape or FLOP, and an override holds numbers only.
_LLAMA3 = ("hidden_size={},intermediate_size={},num_hidden_layers={},num_attention_heads={},num_key_value_heads=8,"
           "vocab_size=128256,max_position_embeddings=131072,rms_norm_eps=1e-05,tie_word_embeddings=false")
_LLAMA3_BATCH = ("one sequence of 8192 tokens per micro-batch: the Llama 3 paper, sec. 3.4.1 and Table 4, trains at "
                 "sequence 8192 with 16-32 sequences per data-parallel group split into micro-batches over the "
                 "pipeline; the micro-batch size is chosen, not stated there")
_LLAMA3_NOTE = ("Llama 3.1 {} (meta-llama/Llama-3.1-{} config.json): hidden {}, {} layers, {} heads, 8 key-value "
                "heads, intermediate {}, vocab 128256, context 131072")
CATALOG: dict[str, ModelSpec] = {spec.name: spec for spec in (
    ModelSpec("alexnet", "torchvision:alexnet", (3, 224, 224), "images", 128, _TB.format("alexnet")),
    ModelSpec("resnet18", "torchvision:resnet18", (3, 224, 224), "images", 16, _TB.format("resnet18")),
    ModelSpec("resnet50", "torchvision:resnet50", (3, 224, 224), "images", 32, _TB.format("resnet50")),
    ModelSpec("resnet101", "torchvision:resnet101", (3, 224, 224), "images", 32,
              "not in TorchBench; resnet50's batch"),
    ModelSpec("vgg16", "torchvision:vgg16", (3, 224, 224), "images", 64, _TB.format("vgg16")),
    ModelSpec("inception_v3", "torchvision:inception_v3", (3, 299, 299), "images", 32,
              "not in TorchBench; resnet50's batch", note="aux_logits=True (torchvision's default)"),
    ModelSpec("mobilenet_v2", "torchvision:mobilenet_v2", (3, 224, 224), "images", 96, _TB.format("mobilenet_v2")),
    ModelSpec("vovnet39a", "timm:vovnet39a", (3, 224, 224), "images", 32, _TB.format("timm_vovnet")),
    ModelSpec("vit_small_patch16_224", "timm:vit_small_patch16_224", (3, 224, 224), "images", 32,
              _TB.format("timm_vision_transformer")),
    ModelSpec("unet", "commbench.proxies.models.unet:build", (), "images", 1, _TB.format("pytorch_unet"),
              note="Pytorch-UNet's default (bilinear=False, transposed-convolution up-sampling); TorchBench's "
                   "pytorch_unet builds bilinear=True (17.3 M parameters): "
                   "`commbench profiles extract commbench.proxies.models.unet:build_bilinear`"),
    ModelSpec("bert-base", "transformers:BertForMaskedLM", (512,), "sequences", 4, _TB.format("hf_Bert") + "; " + _HF),
    ModelSpec("bert-large", "transformers:BertForMaskedLM:hidden_size=1024,num_hidden_layers=24,"
              "num_attention_heads=16,intermediate_size=4096", (512,), "sequences", 4,
              _TB.format("hf_Bert_large") + "; " + _HF),
    ModelSpec("bart-base", "transformers:BartForConditionalGeneration:d_model=768,encoder_layers=6,decoder_layers=6,"
              "encoder_attention_heads=12,decoder_attention_heads=12,encoder_ffn_dim=3072,decoder_ffn_dim=3072",
              (512,), "sequences", 4, _TB.format("hf_Bart") + "; " + _HF,
              note="facebook/bart-base's hyper-parameters (its config.json) on BartConfig"),
    ModelSpec("gpt2", "transformers:GPT2LMHeadModel", (512,), "sequences", 4, _TB.format("hf_GPT2") + "; " + _HF),
    ModelSpec("gpt2-xl", "transformers:GPT2LMHeadModel:n_layer=48,n_embd=1600,n_head=25,n_positions=1024,"
              "vocab_size=50257", (1024,), "sequences", 8, _DS_GPT2,
              note="GPT-2 XL (1558M; Radford et al. 2019, Table 2: 48 layers, d_model 1600; openai-community/gpt2-xl "
                   "config.json: n_head 25, n_positions 1024, vocab 50257); 1024 tokens, its context"),
    ModelSpec("llama-1b", "transformers:LlamaForCausalLM:hidden_size=2048,intermediate_size=5632,num_hidden_layers=22,"
              "num_attention_heads=32,num_key_value_heads=4,vocab_size=32000,max_position_embeddings=2048,"
              "rms_norm_eps=1e-05,tie_word_embeddings=false", (2048,), "sequences", 8,
              "jzhang38/TinyLlama pretrain/tinyllama.py: micro_batch_size 8 of 2048 tokens per GPU (FSDP, "
              "auto_wrap_policy={Block})",
              note="TinyLlama-1.1B's config.json (TinyLlama/TinyLlama-1.1B-Chat-v1.0): hidden 2048, "
                   "22 layers, 32 heads, 4 key-value heads, intermediate 5632, vocab 32000"),
    ModelSpec("llama-7b", "transformers:LlamaForCausalLM:" + _LLAMA2.format(4096, 11008, 32, 32), (2048,), "sequences",
              8, _TITAN.format("llama2_7b", 8, 2048),
              note="Llama 2 7B's config.json (meta-llama/Llama-2-7b-hf; Touvron et al. 2023): hidden 4096, 32 layers, "
                   "32 heads, intermediate 11008, vocab 32000, context 4096"),
    ModelSpec("llama-13b", "transformers:LlamaForCausalLM:" + _LLAMA2.format(5120, 13824, 40, 40), (4096,),
              "sequences", 2, _TITAN.format("llama2_13b", 2, 4096),
              note="Llama 2 13B's config.json (meta-llama/Llama-2-13b-hf; Touvron et al. 2023): hidden 5120, "
                   "40 layers, 40 heads, intermediate 13824, vocab 32000, context 4096"),
    ModelSpec("llama3.1-8b", "transformers:LlamaForCausalLM:" + _LLAMA3.format(4096, 14336, 32, 32), (8192,),
              "sequences", 1, _LLAMA3_BATCH, note=_LLAMA3_NOTE.format("8B", "8B", 4096, 32, 32, 14336)),
    ModelSpec("llama3.1-70b", "transformers:LlamaForCausalLM:" + _LLAMA3.format(8192, 28672, 80, 64), (8192,),
              "sequences", 1, _LLAMA3_BATCH, note=_LLAMA3_NOTE.format("70B", "70B", 8192, 80, 64, 28672)),
    ModelSpec("llama3.1-405b", "transformers:LlamaForCausalLM:" + _LLAMA3.format(16384, 53248, 126, 128), (8192,),
              "sequences", 1, _LLAMA3_BATCH, note=_LLAMA3_NOTE.format("405B", "405B", 16384, 126, 128, 53248)),
    ModelSpec("mixtral-8x7b", "transformers:MixtralForCausalLM:hidden_size=4096,intermediate_size=14336,"
              "num_hidden_layers=32,num_attention_heads=32,num_key_value_heads=8,vocab_size=32000,num_local_experts=8,"
              "num_experts_per_tok=2,max_position_embeddings=32768,rms_norm_eps=1e-05,tie_word_embeddings=false",
              (4096,), "sequences", 1, "one sequence per micro-batch (a layout's micro-batch; chosen, not sourced); "
              "4096 tokens chosen for training (the paper states a 32768-token context, no training length)",
              note="Mixtral 8x7B (Jiang et al. 2024, Table 1; mistralai/Mixtral-8x7B-v0.1 config.json): hidden 4096, "
                   "32 layers, 32 heads, 8 key-value heads, expert FFN 14336, 8 experts, top-2, vocab 32000; "
                   "rope_theta 1e6 left at the class default (it changes no shape or FLOP)"),
    ModelSpec("deepseek-v3", "transformers:DeepseekV3ForCausalLM:hidden_size=7168,intermediate_size=18432,"
              "moe_intermediate_size=2048,num_hidden_layers=61,first_k_dense_replace=3,num_attention_heads=128,"
              "num_key_value_heads=128,n_routed_experts=256,n_shared_experts=1,num_experts_per_tok=8,n_group=8,"
              "topk_group=4,q_lora_rank=1536,kv_lora_rank=512,qk_nope_head_dim=128,qk_rope_head_dim=64,"
              "v_head_dim=128,vocab_size=129280,tie_word_embeddings=false", (4096,), "sequences", 1,
              "one sequence per micro-batch (chosen, not sourced); 4096 tokens: DeepSeek-V3 technical report "
              "(arXiv 2412.19437) sec. 4.2, pre-training sequence length 4K",
              note="DeepSeek-V3 (deepseek-ai/DeepSeek-V3 config.json): hidden 7168, 61 layers (the first 3 dense, "
                   "FFN 18432), 256 routed experts of FFN 2048 and 1 shared, top-8, 128 heads with multi-head latent "
                   "attention (q rank 1536, kv rank 512, rope 64, nope 128, v 128), vocab 129280; the multi-token "
                   "prediction module (num_nextn_predict_layers 1) is not built by transformers and not counted"),
    ModelSpec("llama-tiny", "transformers:LlamaForCausalLM:hidden_size=64,intermediate_size=176,num_hidden_layers=4,"
              "num_attention_heads=4,num_key_value_heads=2,vocab_size=1024,max_position_embeddings=64,"
              "tie_word_embeddings=false", (64,), "sequences", 4,
              "commbench's own choice: small enough to train on 4 CPU ranks in seconds",
              note="a Llama-shaped model made up for tests (4 layers, hidden 64, 4 heads, 2 key-value heads)"),
    ModelSpec("mixtral-tiny", "transformers:MixtralForCausalLM:hidden_size=64,intermediate_size=176,"
              "num_hidden_layers=4,num_attention_heads=4,num_key_value_heads=2,vocab_size=1024,"
              "max_position_embeddings=64,tie_word_embeddings=false,num_local_experts=4,num_experts_per_tok=2",
              (64,), "sequences", 4, "commbench's own choice, as llama-tiny's",
              note="llama-tiny's shape with every MLP a mixture of 4 experts of its FFN (top 2), made up so that "
                   "expert parallelism trains on 4 CPU ranks (--layout ep2,fsdp2)"),
    ModelSpec("speech_transformer", "commbench.proxies.models.speech_transformer:build", (), "utterances", 10,
              _TB.format("speech_transformer") + " declares 32, but its frame-budget batching of a 10-utterance "
              "training set gives 10 per step (pytorch/benchmark issue #1560)"),
    ModelSpec("tts_angular", "commbench.proxies.models.tts_angular:build", (), "utterances", 64,
              _TB.format("tts_angular")),
)}


# commbench's own definitions (proxies/models/), the code a profile may name without --trust-profile-code.
OWN_DEFINITIONS = frozenset({spec.constructor for spec in CATALOG.values() if spec.constructor.startswith("commbench.")}
                            | {"commbench.proxies.models.unet:build_bilinear",
                               "commbench.proxies.models.transformer_xl:build",
                               "commbench.proxies.models.transformer_xl_large:build"})
# A library's registered model by a plain name: no hub prefix (timm's hf-hub:, local-dir:), no path, and
# transformers' config overrides numbers or booleans only (a string field can name code to fetch and run).
_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_OVERRIDE = _NAME + r"=(true|false|-?[0-9]+(\.[0-9]*)?([eE][-+]?[0-9]+)?)"
_LIBRARY_NAMES = {"torchvision": re.compile(_NAME), "timm": re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]*"),
                  "transformers": re.compile(rf"{_NAME}(:({_OVERRIDE}(,{_OVERRIDE})*)?)?")}


def runs_foreign_code(constructor: str) -> bool:
    """Whether building `constructor` would import and run code other than a model torchvision, timm or
    transformers registers under a plain name, or commbench's own definitions: a `module:callable`
    anywhere on sys.path, which a profile file must not be able to run by being read."""
    if constructor in OWN_DEFINITIONS:
        return False
    kind, _, rest = constructor.partition(":")
    pattern = _LIBRARY_NAMES.get(kind)
    return pattern is None or not pattern.fullmatch(rest)


def foreign_code_refusal(model: str, spec: str) -> str:
    """The one line that refuses to build `spec`, a profile's source.spec, without --trust-profile-code."""
    return (f"{model}: the profile names code to import and run for its model (source.spec {spec!r}); "
            f"reading a profile runs no code: add --trust-profile-code to run it")


@dataclass
class BuiltModel:
    """A constructed model and how to make a batch of synthetic inputs for it."""
    module: Any  # torch.nn.Module
    make_inputs: Callable[[int, Any], tuple[tuple, dict]]  # (batch, device) -> (args, kwargs)
    input_shape: tuple[int, ...]
    package: str
    version: str | None
    constructor: str
    declared: dict[str, Any] = field(default_factory=dict)  # a module's own INPUT (shape, unit, default_batch)


def build(constructor: str, input_shape: tuple[int, ...] = ()) -> BuiltModel:
    """Construct a model from a spec string (random weights) with its input maker."""
    kind, _, rest = constructor.partition(":")
    if not rest:
        raise ModelError(f"bad model spec {constructor!r}: expected torchvision:NAME, timm:NAME, "
                         f"transformers:CLASS[:key=value,...] or package.module:callable")
    builders = {"torchvision": _torchvision, "timm": _timm, "transformers": _transformers}
    return builders.get(kind, _callable)(kind, rest, tuple(input_shape))


def _import(package: str):
    try:
        return importlib.import_module(package)
    except ImportError as exc:
        raise ModelError(f"{package} is not installed: pip install 'commbench[models]' ({exc})") from exc


def _version(module) -> str | None:
    return getattr(module, "__version__", None)


def _images(shape: tuple[int, ...]):
    def make(batch: int, device: Any = "cpu"):
        import torch

        return (torch.randn(batch, *shape, device=device),), {}
    return make


def _torchvision(_, name: str, shape: tuple[int, ...]) -> BuiltModel:
    tv = _import("torchvision")
    try:
        kwargs = {"init_weights": True} if name in ("inception_v3", "googlenet") else {}
        module = tv.models.get_model(name, weights=None, **kwargs)
    except ValueError as exc:
        raise ModelError(f"torchvision has no model {name!r}") from exc
    shape = shape or ((3, 299, 299) if name == "inception_v3" else (3, 224, 224))
    return BuiltModel(module, _images(shape), shape, "torchvision", _version(tv),
                      f"torchvision.models.get_model({name!r}, weights=None)")


def _timm(_, name: str, shape: tuple[int, ...]) -> BuiltModel:
    if not _LIBRARY_NAMES["timm"].fullmatch(name):  # hf-hub:ORG/NAME, local-dir:PATH would fetch or read files
        raise ModelError(f"timm:{name}: give a model timm registers by a plain name (no hub prefix, no path): "
                         f"nothing is downloaded")
    timm = _import("timm")
    try:
        module = timm.create_model(name, pretrained=False)
    except RuntimeError as exc:  # timm: "Unknown model (...)"
        raise ModelError(f"timm: {str(exc).splitlines()[0]}") from exc
    shape = shape or tuple(module.pretrained_cfg.get("input_size", (3, 224, 224)))
    return BuiltModel(module, _images(shape), shape, "timm", _version(timm),
                      f"timm.create_model({name!r}, pretrained=False)")


def _transformers(_, rest: str, shape: tuple[int, ...]) -> BuiltModel:
    class_name, _, overrides = rest.partition(":")
    kwargs = _parse_overrides(overrides)  # refused before the (slow) import
    transformers = _import("transformers")
    transformers.logging.set_verbosity_error()  # no advice about configs and loss types per model built
    cls = getattr(transformers, class_name, None)
    if cls is None or not hasattr(cls, "config_class"):
        raise ModelError(f"transformers has no model class {class_name!r}")
    unknown = [key for key in kwargs if not hasattr(cls.config_class(), key)]
    if unknown:  # a config takes any keyword: a misspelt one would silently change nothing
        raise ModelError(f"{cls.config_class.__name__} has no field {unknown[0]!r}")
    try:  # a value of the wrong kind for its field (num_hidden_layers=2.5): the config's own check, one line
        config = cls.config_class(**kwargs)
    except Exception as exc:  # noqa: BLE001 - transformers raises its own validation errors, not ValueError
        first = [line.strip() for line in str(exc).strip().splitlines()[:2]]
        raise ModelError(f"transformers:{rest}: {' '.join(first) if first else type(exc).__name__}") from None
    module = cls(config)  # out of memory here is the job's to say
    seq = shape or (min(512, getattr(config, "max_position_embeddings", 512) or 512),)
    vocab = config.vocab_size

    def make(batch: int, device: Any = "cpu"):
        import torch

        tokens = torch.randint(0, vocab, (batch, *seq), device=device)
        return (), {"input_ids": tokens, "labels": tokens}  # TorchBench's training inputs: ids and labels
    args = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
    return BuiltModel(module, make, tuple(seq), "transformers", _version(transformers),
                      f"transformers.{class_name}(transformers.{cls.config_class.__name__}({args}))")


def _parse_overrides(text: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep:
            raise ModelError(f"bad override {item!r}: expected key=value")
        if not re.fullmatch(_OVERRIDE, item, re.IGNORECASE):  # a string could name code or files to fetch
            raise ModelError(f"bad override {item!r}: a value is a number, true or false")
        for cast in (int, float):
            try:
                out[key] = cast(value)
                break
            except ValueError:
                continue
        else:
            out[key] = {"true": True, "false": False}[value.lower()]
        if isinstance(out[key], float) and not math.isfinite(out[key]):
            raise ModelError(f"bad override {item!r}: a value must be a finite number")
    return out


def _callable(module_name: str, attr: str, shape: tuple[int, ...]) -> BuiltModel:
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ModelError(f"cannot import {module_name!r}: {exc}") from exc
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise ModelError(f"{module_name} has no callable {attr!r}")
    model = factory()
    own_inputs = getattr(module, "example_inputs", None)
    declared = dict(getattr(module, "INPUT", {}) or {})
    if shape:  # an explicit --input-shape: one float tensor of that shape per sample
        make = _images(shape)
    elif own_inputs is not None:  # the module knows its inputs (several tensors, token ids, lengths)
        def make(batch: int, device: Any = "cpu"):
            return tuple(own_inputs(batch, device)), {}
        shape = tuple(declared.get("shape", ()))
    else:
        raise ModelError(f"{module_name}:{attr}: give --input-shape (e.g. 3,224,224), or define "
                         f"example_inputs(batch, device) in {module_name}")
    package = module_name.split(".")[0]
    return BuiltModel(model, make, shape, package, _version(importlib.import_module(package)),
                      f"{module_name}.{attr}()", declared)


def build_named(name: str) -> BuiltModel:
    """A catalog model by name (resnet50, bert-base, ...)."""
    if name not in CATALOG:
        raise ModelError(f"unknown model {name!r}; known: {', '.join(CATALOG)}")
    spec = CATALOG[name]
    return build(spec.constructor, spec.input_shape)


def loss_of(output: Any):
    """A scalar to call backward on, whatever the model returns: the model's own loss when it
    computes one (transformers with labels), else the mean of every tensor it returns."""
    import torch

    loss = getattr(output, "loss", None)
    if loss is not None:
        return loss
    if isinstance(output, torch.Tensor):
        return output.float().mean()
    if isinstance(output, dict):  # transformers' ModelOutput without a loss
        values = output.values()
    elif isinstance(output, (tuple, list)):  # e.g. inception_v3's (logits, aux_logits) in training
        values = output
    else:
        raise ModelError(f"cannot take a loss from a {type(output).__name__} output")
    tensors = [v for v in values if isinstance(v, torch.Tensor)]
    if not tensors:
        raise ModelError("the model's output holds no tensor to take a loss from")
    return sum(t.float().mean() for t in tensors)
