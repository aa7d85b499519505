"""What the `proxy`, `train` and `profiles` commands call: validate options into a ProxyConfig
and a launch plan (spawn local ranks, join the launcher's job, or predict with the cost
model), the sim prediction, `--validate`'s comparison, and the profile listings."""
from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, replace
from typing import Any

from commbench.proxies import buckets as B
from commbench.proxies.catalog import ModelError
from commbench.proxies.config import ProxyConfig
from commbench.proxies.profile import Profile, ProfileError, load_profile


class ProxyUsageError(ValueError):
    """Bad input to proxy/train/profiles: one line, exit 2."""


@dataclass(frozen=True)
class Plan:
    mode: str  # spawn (local ranks), join (a launcher's job), sim (the cost model, no ranks)
    world: int
    launch: Any = None  # LaunchInfo when joining
    nodes: int = 1
    ranks_per_node: int = 1
    note: str | None = None  # said once before running (e.g. why this is a prediction)


def bucketing_mode(no_bucketing: bool, single_bucket: bool) -> str:
    if no_bucketing and single_bucket:
        raise ProxyUsageError("--no-bucketing and --single-bucket exclude each other")
    return "none" if no_bucketing else "single" if single_bucket else "ddp"


def _check_numbers(options: dict) -> None:
    for flag, minimum in (("batch", 1), ("steps", 1), ("warmup_steps", 0), ("nodes", 1), ("gpus_per_node", 1),
                          ("nprocs", 1)):
        value = options.get(flag)
        if value is not None and value < minimum:
            raise ProxyUsageError(f"--{flag.replace('_', '-')} {value}: must be at least {minimum}")
    for flag in ("bucket_mb", "tflops", "timeout_s"):
        value = options.get(flag)
        if value is not None and not value > 0:
            name = "timeout" if flag == "timeout_s" else flag.replace("_", "-")
            raise ProxyUsageError(f"--{name} {value:g}: must be positive")


def make_config(options: dict) -> tuple[ProxyConfig, Plan]:
    """Everything that can be checked before a rank starts, as (config, plan)."""
    _check_numbers(options)
    try:
        profile = load_profile(options["model"])
    except ProfileError as exc:
        raise ProxyUsageError(str(exc)) from exc
    bucketing = bucketing_mode(options["no_bucketing"], options["single_bucket"])
    compute = options["compute"] or ("flops" if options["tflops"] else "measured")
    if compute == "flops" and not options["tflops"]:
        raise ProxyUsageError("--compute flops needs --tflops RATE (the device's achieved 1e12 FLOP/s)")
    if compute == "measured":
        _check_model_available(profile)
    plan = _plan(options)
    if plan.mode == "sim" and not options["compute"] and not options["tflops"]:
        raise ProxyUsageError("a predicted step needs the cluster's compute rate: give --tflops RATE (the GPUs' "
                              "achieved 1e12 FLOP/s), or --compute none, or --compute measured (this host's)")
    if options.get("validate"):
        _check_validate(plan, bucketing, compute, options["backend"])
    device = _device(options)
    json_path = options["json_path"]
    if options.get("validate") and not json_path:
        json_path = os.path.join(tempfile.mkdtemp(prefix="commbench-validate-"), "proxy.jsonl")
    cfg = ProxyConfig(model=options["model"], batch=options["batch"], bucket_mb=options["bucket_mb"],
                      bucketing=bucketing, compute=compute, tflops=options["tflops"], steps=options["steps"],
                      warmup_steps=options["warmup_steps"], amp=bool(options.get("amp")), backend=options["backend"],
                      torch_backend=options["torch_backend"], device=device, algorithm=options["algorithm"],
                      topology=f"{plan.nodes}x{plan.ranks_per_node}" if options["nodes"] else None,
                      hw=options["hw"], json_path=json_path, timeout_s=options["timeout_s"],
                      monitor=bool(options.get("monitor")))
    if plan.note and is_lead(plan):
        print(f"commbench: note: {plan.note}", flush=True)
    return cfg, plan


def is_lead(plan: Plan) -> bool:
    """Rank 0 of a joined job, or the process itself when it spawns or predicts alone."""
    return plan.launch is None or plan.launch.rank == 0


def _check_validate(plan: Plan, bucketing: str, compute: str, backend: str) -> None:
    """--validate compares like with like: what DDP on torch.distributed really does, with the
    compute of the real model, so a proxy that differs from training in any of these is refused."""
    differs = [what for what, same in (
        ("--backend sim (nothing runs)", plan.mode != "sim"), (f"--backend {backend} (training runs on torch)",
                                                              backend == "torch"),
        ("--no-bucketing/--single-bucket (training uses DDP's buckets)", bucketing == "ddp"),
        (f"--compute {compute} (training runs the real model)", compute == "measured")) if not same]
    if differs:
        raise ProxyUsageError(f"--validate compares the proxy with real DDP training; not with {differs[0]}")


def _check_model_available(profile: Profile) -> None:
    from commbench.proxies.catalog import CATALOG

    spec = profile.source.get("spec") or (CATALOG[profile.name].constructor if profile.name in CATALOG else None)
    if spec is None:
        raise ProxyUsageError(f"{profile.name}: --compute measured needs the model definition, and this profile "
                              f"does not name one; use --tflops RATE or --compute none")
    package = spec.split(":")[0]
    import importlib.util

    if importlib.util.find_spec(package.split(".")[0]) is None:
        raise ProxyUsageError(f"{profile.name}: --compute measured runs the real model, which needs {package}: "
                              f"pip install 'commbench[models]', or use --tflops RATE / --compute none")


def _device(options: dict) -> str:
    if options["backend"] != "torch":
        return "cpu"
    from commbench.backends import BackendError
    from commbench.backends.torch_dist import resolve_device

    try:
        return resolve_device(options["device"], options["torch_backend"])[0]
    except BackendError as exc:
        raise ProxyUsageError(str(exc)) from exc


def _local_gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _plan(options: dict) -> Plan:
    """Spawn, join or predict; a job smaller than --nodes asks for is said in one line."""
    from commbench import launch as L
    from commbench.backends import BackendError, backend_class

    backend, nodes = options["backend"], options["nodes"]
    try:
        backend_class(backend)
    except BackendError as exc:
        raise ProxyUsageError(str(exc)) from exc
    per_node = options["gpus_per_node"] or (_local_gpus() or 1)
    env = os.environ
    launcher = None if options["launcher"] == "auto" else options["launcher"]
    launcher = launcher or L.detect_launcher(env)
    joined = launcher not in (None, "spawn") or L.SPAWN_VAR in env
    info = None
    if joined:
        try:
            info = L.from_environment(env, launcher or "spawn")
        except L.LaunchError as exc:
            raise ProxyUsageError(str(exc)) from exc
    if backend == "sim":
        world = nodes * per_node if nodes else (options["nprocs"] or 2)
        return replace(_sim_plan(options, nodes or 1, per_node if nodes else world, None), launch=info)
    if joined:
        if nodes and info.world_size != nodes * per_node:
            return replace(_sim_plan(options, nodes, per_node, f"the job has {info.world_size} rank(s), not the "
                                                               f"{nodes} x {per_node} that --nodes asks for"),
                           launch=info)
        return Plan("join", info.world_size, info, info.nnodes, info.local_world_size)
    if nodes:
        if options["spawn_local"]:
            return Plan("spawn", nodes * per_node, None, nodes, per_node)
        return _sim_plan(options, nodes, per_node, f"this host is not a job of {nodes} x {per_node} ranks")
    world = options["nprocs"] or (_local_gpus() or 2)
    return Plan("spawn", world, None, 1, world)


def _sim_plan(options: dict, nodes: int, per_node: int, why: str | None) -> Plan:
    if not options["hw"]:
        hint = "; add --local to spawn them all here, or --hw PRESET|FILE to predict them with the cost model" \
            if why else ""
        raise ProxyUsageError((why or "--backend sim predicts with the cost model") + hint +
                              ("" if why else ": give --hw PRESET|FILE"))
    from commbench.analysis.costmodel import HardwareError, load_hardware

    try:
        load_hardware(options["hw"])
    except HardwareError as exc:
        raise ProxyUsageError(str(exc)) from exc
    note = f"{why}: predicting {nodes} x {per_node} ranks with the cost model of {options['hw']} " \
           f"(kind: predicted, nothing measured)" if why else None
    return Plan("sim", nodes * per_node, None, nodes, per_node, note)


# ---------------------------------------------------------------- sim


def predict_proxy(cfg: ProxyConfig, plan: Plan, argv: list[str]) -> int:
    """A proxy step predicted by the cost model (no ranks): the table and a kind=predicted record.
    Under a launcher only rank 0 predicts and writes."""
    if not is_lead(plan):
        return 0
    from commbench.analysis.costmodel import load_hardware, with_topology
    from commbench.analysis.scaling import predict_step
    from commbench.proxies.steps import ProxyResult, StepLog
    from commbench.proxies.timeline import flops_times_us
    from commbench.topology import Topology

    profile = load_profile(cfg.model)
    batch = cfg.batch or profile.default_batch
    topo = Topology(plan.nodes, plan.ranks_per_node)
    hw = with_topology(load_hardware(cfg.hw), topo)
    if cfg.compute == "flops":
        forward, backward, update, label = (*flops_times_us(profile, batch, cfg.tflops), 0.0,
                                            f"flops at {cfg.tflops:g} TFLOP/s")
    elif cfg.compute == "measured":
        forward, backward, update = _measure_here(profile, batch, cfg)
        label = "measured on this host"
    else:
        forward = backward = update = 0.0
        label = "none"
    algorithm = "nccl" if cfg.algorithm == "auto" else cfg.algorithm  # the library's ring unless told
    pred = predict_step(profile, batch, topo, hw, forward, backward, update, cfg.bucket_mb, cfg.bucketing, algorithm)
    log = StepLog(cfg.json_path, True, batch * topo.world)
    log.header({"kind": "predicted", "model": profile.name, "command": " ".join(argv), "config": json.loads(cfg.to_json()),
                "hardware": hw.name, "topology": str(topo), "buckets": B.describe(pred.buckets)},
               [f"predicted {profile.name} on {topo} ({topo.world} ranks) of {hw.name}: {len(pred.buckets)} bucket(s), "
                f"allreduce {algorithm} from the cost model; compute {label}"])
    t = pred.times
    log.step(1, False, {"compute_us": t.compute_us, "comm_us": t.comm_us, "exposed_comm_us": t.exposed_comm_us,
                        "step_us": t.step_us})
    log.summary(ProxyResult(kind="predicted", model=profile.name, backend="model", library=hw.name, device="-",
                            world_size=topo.world, nnodes=topo.nodes, batch=batch, bucket_mb=cfg.bucket_mb,
                            bucketing=cfg.bucketing, buckets=len(pred.buckets), gradient_bytes=profile.nbytes,
                            compute=label, steps=1, warmup_steps=0, compute_us_p50=t.compute_us,
                            compute_us_p90=t.compute_us, comm_us_p50=t.comm_us, comm_us_p90=t.comm_us,
                            exposed_comm_us_p50=t.exposed_comm_us, exposed_comm_us_p90=t.exposed_comm_us,
                            step_us_p50=t.step_us, step_us_p90=t.step_us,
                            samples_per_s=t.samples_per_s(batch * topo.world), run_id=log.run_id))
    return 0


def _measure_here(profile: Profile, batch: int, cfg: ProxyConfig) -> tuple[float, float, float]:
    import torch

    from commbench.proxies.train import measure_compute

    try:
        return measure_compute(profile, batch, torch.device("cuda" if cfg.device == "cuda" else "cpu"), cfg.amp)[0]
    except (MemoryError, ModelError) as exc:
        raise ProxyUsageError(str(exc).splitlines()[0]) from exc


# ---------------------------------------------------------------- --validate


def train_twin(cfg: ProxyConfig) -> ProxyConfig:
    """The training run that checks a proxy: same model, batch, ranks, buckets, backend, steps."""
    base = cfg.json_path[:-6] if cfg.json_path.endswith(".jsonl") else cfg.json_path
    return replace(cfg, json_path=f"{base}.train.jsonl", compute="measured", tflops=None)


def summary_of(path: str) -> dict[str, Any] | None:
    from commbench.results import read_records

    if not os.path.exists(path):
        return None
    records = [r for r in read_records(path) if r.get("record") == "proxy"]
    return records[-1] if records else None


def report_validation(cfg: ProxyConfig, train_cfg: ProxyConfig) -> None:
    proxy, real = summary_of(cfg.json_path), summary_of(train_cfg.json_path)
    if not proxy or not real or not real["step_us_p50"]:
        print("# validate: a run wrote no summary; nothing to compare")
        return
    error = (proxy["step_us_p50"] - real["step_us_p50"]) / real["step_us_p50"]
    print(f"# validate: proxy step {proxy['step_us_p50'] / 1e3:.2f} ms vs real training {real['step_us_p50'] / 1e3:.2f} ms "
          f"(medians): proxy error {100 * error:+.1f}%")
    print(f"#           records: {cfg.json_path} (proxy), {train_cfg.json_path} (training)")
    with open(cfg.json_path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps({"record": "validate", "model": proxy["model"], "world_size": proxy["world_size"],
                                 "batch": proxy["batch"], "proxy_step_us": proxy["step_us_p50"],
                                 "train_step_us": real["step_us_p50"], "error": error,
                                 "train_json": train_cfg.json_path}) + "\n")


# ---------------------------------------------------------------- profiles


def show_profile(model: str, show_buckets: bool, bucket_mb: float | None, mode: str, as_json: bool) -> str:
    try:
        profile = load_profile(model)
        layout = B.assign(profile, bucket_mb, mode)
    except (ProfileError, ValueError) as exc:
        raise ProxyUsageError(str(exc)) from exc
    if show_buckets:
        described = {"model": profile.name, "bucket_mb": bucket_mb, "bucketing": mode, **B.describe(layout)}
        if as_json:
            return json.dumps(described)
        lines = [f"# {profile.name}: {len(layout)} bucket(s), {profile.nbytes:,d} bytes, launch order "
                 f"({'DDP default: 25 MiB, first bucket 1 MiB' if bucket_mb is None else f'cap {bucket_mb:g} MiB'})",
                 f"# {'bucket':>6} {'bytes':>14} {'MiB':>9} {'tensors':>8}  first .. last gradient"]
        for b in layout:
            first, last = profile.tensors[b.tensors[0]].name, profile.tensors[b.tensors[-1]].name
            lines.append(f"  {b.index:>6} {b.nbytes:>14,d} {b.nbytes / 2**20:>9.3f} {len(b.tensors):>8}  {first} .. {last}")
        return "\n".join(lines)
    if as_json:
        return json.dumps(profile.to_dict())
    lines = [f"# {profile.name}: {profile.parameters:,d} parameters in {len(profile.tensors)} tensors "
             f"({profile.nbytes / 2**20:.1f} MiB), {profile.forward_flops / 1e9:.3f} GFLOP forward and "
             f"{profile.backward_flops / 1e9:.3f} GFLOP backward per sample",
             f"# input {'x'.join(map(str, profile.input_shape))} per sample ({profile.sample_unit}), "
             f"default batch {profile.default_batch}",
             *(f"# {key}: {value}" for key, value in profile.source.items()),
             f"# {'tensor':48s} {'shape':>20s} {'dtype':>9s} {'ready at':>9s}"]
    for t in profile.tensors:
        share = t.ready_flops / profile.backward_flops if profile.backward_flops else 1.0
        lines.append(f"  {t.name:48s} {'x'.join(map(str, t.shape)):>20s} {t.dtype:>9s} {100 * share:>8.1f}%")
    return "\n".join(lines)


def extract_profile(spec: str, input_shape: str | None, name: str | None, batch: int | None,
                    unit: str | None) -> Profile:
    from commbench.proxies.extract import extract

    try:
        shape = tuple(int(d) for d in input_shape.replace("x", ",").split(",")) if input_shape else ()
    except ValueError as exc:
        raise ProxyUsageError(f"--input-shape {input_shape!r}: expected integers like 3,224,224") from exc
    if batch is not None and batch < 1:
        raise ProxyUsageError(f"--batch {batch}: must be at least 1")
    try:
        return extract(spec, shape, name, batch, unit)
    except ModelError as exc:
        raise ProxyUsageError(str(exc)) from exc
    except (RuntimeError, TypeError, ValueError) as exc:  # the model rejected the inputs (a bad --input-shape)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ProxyUsageError(f"{spec}: one forward and backward failed: {first}") from exc
