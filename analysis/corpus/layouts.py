"""The corpus of published multi-dimensional training throughput (layouts.json beside this module): loaded,
checked, and turned into what a layout prediction needs (analysis/predict_layout.py's Job and Parallelism); what
a row's figures mean (tokens a second, the source's FLOPs a token) is analysis/corpus/layout_figures.py's.

A row is one published (source, model, hardware, layout, batch) with the throughput as the source states it (tokens/s
per GPU, TFLOPs per GPU, MFU, aggregate PFLOP/s). Its model is a shipped profile with a transformer shape or an entry
of `shapes` (the hyper-parameters the source states); its hardware a `systems` entry (a preset only where the machine
is that preset, else its own hardware figures and what was assumed). Rows of one `group` share source, hardware and
software: benchmarks/model_layouts.py calibrates the compute rate on a group's first row and predicts the others.

Reading the corpus runs no code (JSON). Every field is checked, and the derived quantities the source prints
beside each other are checked against each other (the layout's product against the GPUs, the gradient
accumulation against the batch, MFU against TFLOPs and the peak, the aggregate against TFLOPs x GPUs, tokens
per batch against batch x sequence): LayoutCorpusError lists every problem found, one line each.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Any

from commbench.analysis.corpus.files import CorpusFormatError, is_int, is_number, objects, read_json, system_hardware
from commbench.analysis.corpus.layout_figures import published_tokens_per_s_per_gpu, source_flops_per_token
from commbench.costmodel import Hardware
from commbench.proxies.layouts.calls import EP_DISPATCHERS
from commbench.proxies.layouts.parallelism import SCHEDULES, LayoutError, Parallelism
from commbench.proxies.profile import ProfileError, load_profile
from commbench.proxies.setups import SETUPS
from commbench.proxies.transformer import TransformerShape, shape_from_dict

CORPUS_PATH = os.path.join(os.path.dirname(__file__), "layouts.json")
PRECISIONS = ("bf16", "fp8", "mixed16", "unstated")
CHECKPOINTING = ("none", "selective", "full")
FLOPS_FORMULAS = ("megatron-eq3", "palm", "megatron-core")  # how a source counts the FLOPs behind its TFLOPs/GPU
THROUGHPUT = ("tokens_per_s_per_gpu", "step_time_s", "tflops_per_gpu", "mfu", "aggregate_pflops")
ROUNDING = 0.015  # printed figures (3 significant digits, percentages) against each other
ASSUMED = {"microbatch": 1, "schedule": "1f1b", "virtual_stages": 1, "checkpointing": "selective",
           "sequence_parallel": None}  # None: sequence parallelism with tp > 1, as Megatron recipes run


class LayoutCorpusError(CorpusFormatError):
    """A layouts corpus that is not what this module reads: one line per problem."""


@dataclass(frozen=True)
class System:
    name: str
    described: str
    hardware: Hardware
    gpus_per_node: int
    assumed: tuple[str, ...]


@dataclass(frozen=True)
class Row:
    index: int
    source: str
    table: str
    group: str
    model: str
    system: str
    gpus: int
    layout: dict[str, Any]
    microbatch: int | None
    global_batch: int
    seq_len: int
    precision: str
    checkpointing: str | None
    throughput: dict[str, float]
    flops_formula: str | None
    memory_gb: float | None
    assumed: tuple[str, ...]
    not_predicted: str | None = None  # why the model cannot lay this row out (kept: it is a published figure)

    @property
    def label(self) -> str:
        lay = self.layout
        parts = [f"{d}{lay[d]}" for d in ("tp", "pp", "cp", "ep") if lay[d] > 1] + [f"dp{lay['dp']}"]
        if (lay.get("virtual_stages") or 1) > 1:
            parts.append(f"v{lay['virtual_stages']}")
        return f"{self.model} {self.gpus} GPUs {','.join(parts)} gbs{self.global_batch}"

    def parallelism(self) -> Parallelism:
        """The row's layout as predict_layout takes it (what the source leaves out: ASSUMED)."""
        lay, mbs = self.layout, self.microbatch or ASSUMED["microbatch"]
        sp = lay.get("sequence_parallel")
        schedule = lay.get("schedule") or ASSUMED["schedule"]
        return Parallelism(lay["tp"], lay["pp"], lay["cp"], lay["ep"], lay["dp"],
                           lay["tp"] > 1 if sp is None else sp, lay["setup"], schedule,
                           self.global_batch // (mbs * lay["dp"]), lay.get("virtual_stages") or 1,
                           lay.get("expert_tp"))


@dataclass(frozen=True)
class LayoutCorpus:
    sources: dict[str, dict[str, str]]
    systems: dict[str, System]
    shapes: dict[str, TransformerShape]
    rows: tuple[Row, ...]

    def shape(self, row: Row) -> TransformerShape:
        """The row's model shape at the row's sequence length."""
        base = self.shapes[row.model] if row.model in self.shapes else load_profile(row.model).transformer
        return replace(base, seq_len=row.seq_len)

    def groups(self) -> dict[str, list[Row]]:
        out: dict[str, list[Row]] = {}
        for row in self.rows:
            out.setdefault(row.group, []).append(row)
        return out


def load_layout_corpus(path: str = CORPUS_PATH) -> LayoutCorpus:
    """The corpus at `path`, every field checked (LayoutCorpusError: one line per problem, naming the file)."""
    try:
        data = read_json(path)
    except CorpusFormatError as exc:
        raise LayoutCorpusError(f"{path}: {exc}") from None
    problems: list[str] = []
    corpus = _corpus(data, problems)
    if problems or corpus is None:
        raise LayoutCorpusError("\n".join(f"{path}: {p}" for p in problems))
    return corpus


def _corpus(data: Any, problems: list[str]) -> LayoutCorpus | None:
    if not isinstance(data, dict) or data.get("schema") != 1:
        problems.append("not a layouts corpus of schema 1")
        return None
    sources = {k: v for k, v in _mapping(data, "sources", problems).items() if _source(k, v, problems)}
    systems = {}
    for name, entry in _mapping(data, "systems", problems).items():
        system = _system(name, entry, problems)
        if system:
            systems[name] = system
    shapes = {}
    for name, entry in _mapping(data, "shapes", problems).items():
        try:
            shapes[name] = shape_from_dict(entry.get("shape"))
        except ValueError as exc:
            problems.append(f"shapes.{name}: {exc}")
        if not entry.get("stated_in"):
            problems.append(f"shapes.{name}.stated_in: say where the source states the shape")
    rows = data.get("rows")
    if not isinstance(rows, list) or not rows:
        problems.append("rows must be a non-empty list")
        return None
    parsed = [_row(i, row, sources, systems, shapes, problems) for i, row in enumerate(rows)]
    return LayoutCorpus(sources, systems, shapes, tuple(r for r in parsed if r is not None))


def _mapping(data: dict, key: str, problems: list[str]) -> dict:
    try:
        return objects(data, key)
    except CorpusFormatError as exc:
        problems.append(str(exc))
        return {}


def _source(name: str, entry: dict, problems: list[str]) -> bool:
    missing = [k for k in ("citation", "address", "organisation") if not isinstance(entry.get(k), str) or not entry[k]]
    for key in missing:
        problems.append(f"sources.{name}.{key} must be a non-empty string")
    return not missing


def _system(name: str, entry: dict, problems: list[str]) -> System | None:
    where = f"systems.{name}"
    try:
        hardware = system_hardware(where, entry)
    except CorpusFormatError as exc:
        problems.append(str(exc))
        return None
    per_node = entry.get("gpus_per_node")
    if not is_int(per_node) or per_node < 1:
        problems.append(f"{where}.gpus_per_node must be a whole number of at least 1")
        return None
    assumed = entry.get("assumed", [])
    if not isinstance(assumed, list) or not all(isinstance(a, str) for a in assumed):
        problems.append(f"{where}.assumed must be a list of strings")
        assumed = []
    if entry.get("hardware") is not None and not assumed:
        problems.append(f"{where}.assumed: a system with its own hardware figures says which the source does not give")
    return System(name, str(entry.get("described", "")), hardware, per_node, tuple(assumed))


def _row(i: int, row: Any, sources: dict, systems: dict, shapes: dict, problems: list[str]) -> Row | None:
    where = f"rows[{i}]"
    if not isinstance(row, dict):
        problems.append(f"{where} must be an object")
        return None
    before = len(problems)
    for key, known in (("source", sources), ("system", systems)):
        if row.get(key) not in known:
            problems.append(f"{where}.{key} {row.get(key)!r} is not in {key}s")
    for key in ("table", "group", "model"):
        if not isinstance(row.get(key), str) or not row[key]:
            problems.append(f"{where}.{key} must be a non-empty string")
    for key in ("gpus", "global_batch", "seq_len"):
        if not is_int(row.get(key)) or row[key] < 1:
            problems.append(f"{where}.{key} must be a whole number of at least 1")
    _choice(row, "precision", PRECISIONS, where, problems)
    _choice(row, "checkpointing", CHECKPOINTING, where, problems, optional=True)
    mbs = row.get("microbatch")
    if mbs is not None and (not is_int(mbs) or mbs < 1):
        problems.append(f"{where}.microbatch must be a whole number of at least 1, or null (not stated)")
    memory = row.get("memory_gb")
    if memory is not None and not (is_number(memory) and memory > 0):
        problems.append(f"{where}.memory_gb must be a positive number, or null (not stated)")
    assumed = row.get("assumed", [])
    if not isinstance(assumed, list) or not all(isinstance(a, str) for a in assumed):
        problems.append(f"{where}.assumed must be a list of strings")
    if row.get("not_predicted") is not None and not (isinstance(row["not_predicted"], str) and row["not_predicted"]):
        problems.append(f"{where}.not_predicted must be a non-empty string (why), or absent")
    _layout(row.get("layout"), where, problems)
    _throughput(row, where, problems)
    if len(problems) > before:
        return None
    shape = _model_shape(row["model"], shapes, where, problems)
    if shape is None:
        return None
    parsed = Row(i, row["source"], row["table"], row["group"], row["model"], row["system"], row["gpus"], row["layout"],
                 mbs, row["global_batch"], row["seq_len"], row["precision"], row.get("checkpointing"),
                 {k: float(v) for k, v in row["throughput"].items()}, row.get("flops_formula"), memory, tuple(assumed),
                 row.get("not_predicted"))
    _derived(parsed, row, shape, systems[parsed.system], where, problems)
    return parsed if len(problems) == before else None


def _choice(row: dict, key: str, choices: tuple, where: str, problems: list[str], optional: bool = False) -> None:
    value = row.get(key)
    if not (optional and value is None) and value not in choices:
        problems.append(f"{where}.{key} must be one of {', '.join(choices)}{' or null' if optional else ''}")


def _layout(lay: Any, where: str, problems: list[str]) -> None:
    if not isinstance(lay, dict):
        problems.append(f"{where}.layout must be an object")
        return
    for dim in ("tp", "pp", "cp", "ep", "dp"):
        if not is_int(lay.get(dim)) or lay[dim] < 1:
            problems.append(f"{where}.layout.{dim} must be a whole number of at least 1")
    vp = lay.get("virtual_stages")
    if vp is not None and (not is_int(vp) or vp < 1):
        problems.append(f"{where}.layout.virtual_stages must be a whole number of at least 1, or null")
    if lay.get("sequence_parallel") not in (True, False, None):
        problems.append(f"{where}.layout.sequence_parallel must be true, false or null")
    for key, choices, null in (("schedule", SCHEDULES, True), ("setup", SETUPS, False),
                               ("ep_dispatcher", EP_DISPATCHERS, True)):  # ep_dispatcher null: alltoall
        if lay.get(key) not in (*choices, *((None,) if null else ())):
            problems.append(f"{where}.layout.{key} must be one of {', '.join(choices)}" + (" or null" if null else ""))
    if lay.get("expert_tp") not in (None, 1, lay.get("tp")):
        problems.append(f"{where}.layout.expert_tp must be 1 (Megatron-Core's ETP 1), the row's tp, or null (tp)")


def _throughput(row: dict, where: str, problems: list[str]) -> None:
    stated = row.get("throughput")
    if not isinstance(stated, dict) or not stated:
        problems.append(f"{where}.throughput must be an object of {', '.join(THROUGHPUT)}")
        return
    for key, value in stated.items():
        if key not in THROUGHPUT:
            problems.append(f"{where}.throughput.{key}: not one of {', '.join(THROUGHPUT)}")
        elif not (is_number(value) and value > 0) or key == "mfu" and value > 1:
            problems.append(f"{where}.throughput.{key} must be a positive number (mfu at most 1)")
    if not {"tokens_per_s_per_gpu", "step_time_s", "tflops_per_gpu"} & set(stated):
        problems.append(f"{where}.throughput: give tokens_per_s_per_gpu, step_time_s or tflops_per_gpu")
    if not {"tokens_per_s_per_gpu", "step_time_s"} & set(stated) and row.get("flops_formula") not in FLOPS_FORMULAS:
        problems.append(f"{where}.flops_formula must be one of {', '.join(FLOPS_FORMULAS)} for a TFLOPs-only row")


def _model_shape(model: str, shapes: dict, where: str, problems: list[str]) -> TransformerShape | None:
    if model in shapes:
        return shapes[model]
    try:
        shape = load_profile(model).transformer
    except ProfileError:
        shape = None
    if shape is None:
        problems.append(f"{where}.model {model!r} is neither in shapes nor a shipped profile with a transformer shape")
    return shape


def _derived(row: Row, raw: dict, shape: TransformerShape, system: System, where: str, problems: list[str]) -> None:
    """The source's figures against each other, and the layout against the model and the machine."""
    lay, mbs = row.layout, row.microbatch or ASSUMED["microbatch"]
    if lay["tp"] * lay["pp"] * lay["cp"] * lay["dp"] != row.gpus:
        problems.append(f"{where}.layout: tp x pp x cp x dp = {lay['tp'] * lay['pp'] * lay['cp'] * lay['dp']}, not the "
                        f"{row.gpus} GPUs")
        return
    if row.global_batch % (mbs * lay["dp"]):
        problems.append(f"{where}: global_batch {row.global_batch} is not a whole number of micro-batches of {mbs} on "
                        f"dp {lay['dp']}")
        return
    ga = raw.get("gradient_accumulation")
    if ga is not None and ga != row.global_batch // (mbs * lay["dp"]):
        problems.append(f"{where}.gradient_accumulation {ga}: the batch gives {row.global_batch // (mbs * lay['dp'])}")
    try:  # a row the model cannot lay out keeps the checks above only (why: its not_predicted)
        if not row.not_predicted:
            row.parallelism().check(row.gpus, system.gpus_per_node, replace(shape, seq_len=row.seq_len),
                                    within_node=("tp",))
    except LayoutError as exc:
        problems.append(f"{where}: {exc}")
    _printed(row, raw, shape, system, where, problems)


def _printed(row: Row, raw: dict, shape: TransformerShape, system: System, where: str, problems: list[str]) -> None:
    """MFU = TFLOPs / peak, aggregate = TFLOPs x GPUs, TFLOPs = tokens x the source's FLOPs a token, tokens a
    batch = batch x sequence, to the printed digits."""
    stated = row.throughput
    tflops = stated.get("tflops_per_gpu")
    peak = system.hardware.device_tflops.get("bf16") or system.hardware.device_tflops.get("fp16")
    if tflops and "mfu" in stated and peak and abs(tflops / peak - stated["mfu"]) > 0.01:
        problems.append(f"{where}.throughput: mfu {stated['mfu']:g} but {tflops:g} TFLOPs of a {peak:g} peak is "
                        f"{tflops / peak:.3f}")
    if tflops and "aggregate_pflops" in stated and \
            abs(tflops * row.gpus / 1e3 / stated["aggregate_pflops"] - 1) > ROUNDING:
        problems.append(f"{where}.throughput: aggregate_pflops {stated['aggregate_pflops']:g} but {tflops:g} TFLOPs x "
                        f"{row.gpus} GPUs = {tflops * row.gpus / 1e3:.1f}")
    if tflops and row.flops_formula and {"tokens_per_s_per_gpu", "step_time_s"} & set(stated):
        sized = replace(shape, seq_len=row.seq_len)
        counted = published_tokens_per_s_per_gpu(row, sized) * source_flops_per_token(row, sized) / 1e12
        if abs(counted / tflops - 1) > ROUNDING:
            problems.append(f"{where}.throughput: {tflops:g} TFLOPs/GPU but its tokens x {row.flops_formula}'s "
                            f"FLOPs a token give {counted:.0f}")
    tokens = raw.get("tokens_per_batch_stated")
    if tokens is not None and (not is_number(tokens) or abs(row.global_batch * row.seq_len / tokens - 1) > 0.05):
        problems.append(f"{where}.tokens_per_batch_stated {tokens!r} but global_batch x seq_len = "
                        f"{row.global_batch * row.seq_len:,}")
