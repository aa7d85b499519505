"""`proxy` and `train` options, validated into a ProxyConfig and a job plan: spawn local
ranks, join the launcher's job, or predict with the cost model (mode `local`: nothing runs
but the model)."""
from __future__ import annotations

import os
import tempfile
from dataclasses import replace

from commbench import job
from commbench.commands.emulate import emulated_shape
from commbench.commands.helpers.common import UsageFault, find_job
from commbench.commands.helpers.setup_flags import check_trainable, settle_setup
from commbench.commands.proxy_options import ProxyOptions
from commbench.proxies.config import ProxyConfig
from commbench.proxies.profile import Profile, ProfileError, load_profile


def bucketing_mode(no_bucketing: bool, single_bucket: bool) -> str:
    if no_bucketing and single_bucket:
        raise UsageFault("--no-bucketing and --single-bucket exclude each other")
    return "none" if no_bucketing else "single" if single_bucket else "ddp"


def _check_numbers(o: ProxyOptions) -> None:
    from commbench.commands.helpers import options as O

    counts = {f"--{flag.replace('_', '-')}": (O.NONNEGATIVE_COUNT if flag == "warmup_steps" else O.COUNT,
                                              getattr(o, flag))
              for flag in ("batch", "steps", "warmup_steps", "nodes", "gpus_per_node", "nprocs")}
    O.check({**counts, "--bucket-mb": (O.Range(0, 1 << 20, low_open=True), o.bucket_mb),
             "--tflops": (O.Range(0, 1e9, low_open=True), o.tflops), "--timeout": (O.TIMEOUT, o.timeout_s)})


def make_config(o: ProxyOptions) -> tuple[ProxyConfig, job.Plan]:
    """Everything that can be checked before a rank starts, as (config, plan)."""
    from commbench.commands.helpers import options as O
    from commbench.commands.helpers.backend_options import backend_class_of
    from commbench.commands.proxy_parallel import layout_fields

    _check_numbers(o)
    bucketing = _check_setup_flags(o)
    o = _settle_layout(o)
    profile, compute = _profile_and_compute(o)
    cls = backend_class_of(o.backend)
    plan = _plan(o, cls)
    if plan.mode == "local" and o.layout:  # predicted, no ranks: the DP proxy's model would drop the layout
        raise UsageFault(f"--layout {o.layout} is replayed on real ranks; to predict a layout on --hw use "
                         f"`commbench predict-scaling {o.model} --hw HW --gpus N --layout {o.layout}`")
    layout = layout_fields(o, cls, profile, compute, plan.world, plan.ranks_per_node)
    _check_compute_time(profile, o, compute, plan)
    if plan.mode in ("spawn", "emulate"):  # an emulated cluster's ranks all run on this host too
        O.check_local_ranks(plan.world, o.oversubscribe)
    backend = _settle_backend(o, plan, cls)
    if plan.mode == "local" and not o.compute and compute == "measured":
        raise UsageFault("a predicted step needs the cluster's compute rate: give --tflops RATE (the GPUs' "
                         "achieved 1e12 FLOP/s), or --compute none, or --compute measured (this host's)")
    if o.validate:
        _check_validate(plan, bucketing, "measured" if o.layout else compute, cls)  # a layout's: any compute
    choice = settle_setup(o.setup, o.given_knobs(), plan.nodes, plan.ranks_per_node,
                          "cpu" if backend.device == "cpu" else "cuda", plan.world)
    if plan.mode != "local" and not cls.runs_rank_groups and not choice.setup.allreduce_only:
        raise UsageFault(f"setup {choice.name} issues all-gathers and reduce-scatters on groups of ranks: replay it "
                         f"on --backend torch (commbench's schedules replay the allreduce setups)")
    json_path = o.json_path
    if o.validate and not json_path:  # both runs' records, compared; proxy_command removes the folder
        json_path = os.path.join(tempfile.mkdtemp(prefix="commbench-validate-"), "proxy.jsonl")
    cfg = ProxyConfig(model=o.model, batch=o.batch, bucket_mb=o.bucket_mb, bucketing=bucketing, compute=compute,
                      tflops=o.tflops, remeasure=o.remeasure,
                      steps=o.steps, warmup_steps=o.warmup_steps, amp=o.amp, backend=backend,
                      hw=o.hw, json_path=json_path, monitor=o.monitor, trust_profile_code=o.trust_profile_code,
                      setup=choice.name, knobs=dict(o.knobs),
                      compute_block=_block_of(o, profile).to_dict() if compute == "block" else None)
    return replace(cfg, **layout), plan


def _profile_and_compute(o: ProxyOptions) -> tuple[Profile, str]:
    """The model's profile and where the step's compute comes from (measured, flops, trace, none), checked:
    a traced profile's is its traced time (it counts no FLOPs and names no model to run)."""
    try:
        profile = load_profile(o.model)
    except ProfileError as exc:
        raise UsageFault(str(exc)) from exc
    traced = profile.traced
    compute = o.compute or ("flops" if o.tflops else "trace" if traced else "measured")
    if traced is not None and compute in ("flops", "measured"):
        given = "--tflops" if compute == "flops" and not o.compute else f"--compute {compute}"
        raise UsageFault(f"{given}: {profile.name} is a traced profile (no FLOPs, no model to run): its compute is the "
                         f"time traced on {traced.device}, --compute trace (its default), or --compute none")
    if compute == "trace" and traced is None:
        raise UsageFault(f"--compute trace: {profile.name} holds no traced compute (a profile from `commbench profiles "
                         f"extract --from-trace` does); use --tflops RATE, --compute measured or none")
    if compute == "flops" and not o.tflops:
        raise UsageFault("--compute flops needs --tflops RATE (the device's achieved 1e12 FLOP/s)")
    if compute == "measured":
        _check_model_available(o.model, profile, o.trust_profile_code)
    if compute == "block":
        _block_of(o, profile)
    return profile, compute


def _block_of(o: ProxyOptions, profile: Profile):
    """--compute block: the compute block of --hw that a layout's replay costs its operators from, or one line."""
    from commbench.commands.helpers.hw_option import load_hw
    from commbench.proxies.layouts.layer_ops import missing, unlisted

    if not o.hw:
        raise UsageFault("--compute block costs a transformer's operators from a hardware file's compute block: "
                         "give --hw FILE (from `commbench compute`)")
    if profile.transformer is None:
        raise UsageFault(f"--compute block costs a transformer's operators, and profile {profile.name} has no "
                         "transformer shape: use --tflops RATE or --compute measured")
    if o.tflops:
        raise UsageFault("--compute block times each operator from the block: drop --tflops (one rate)")
    block = load_hw(o.hw).compute
    if block is None:
        layout = f" --layout {o.layout}" if o.layout else ""
        raise UsageFault(f"--compute block: {o.hw} has no compute block (write one with `commbench compute "
                         f"{o.model}{layout} --hw {o.hw} -o FILE`)")
    lacks = missing(block, block.meta.get("dtype", "float32")) + \
        ([unlisted(profile.transformer)] if profile.transformer is not None and unlisted(profile.transformer) else [])
    if lacks:
        raise UsageFault(f"--compute block: {o.hw}'s block lacks {', '.join(lacks)}")
    return block


def _check_setup_flags(o: ProxyOptions) -> str:
    """The setup's flags, checked before anything slow (loading the model, its library, a rank): a knob the
    setup does not take, a setup `train` cannot run, DDP's bucketing flags on another setup. The knobs'
    fit to the layout is checked once the layout is known. Returns the bucketing mode."""
    bucketing = bucketing_mode(o.no_bucketing, o.single_bucket)
    choice = settle_setup(o.setup, o.given_knobs())
    if o.train or o.validate:
        check_trainable(choice)
    if not choice.setup.proxy_buckets and bucketing != "ddp":
        raise UsageFault(f"--no-bucketing/--single-bucket are DDP's; setup {choice.name} has its own calls")
    return bucketing


def _settle_backend(o: ProxyOptions, plan: job.Plan, cls):
    """The BackendConfig the ranks read, built and settled once by the backend's class as the sweep's is (an
    option it does not take is refused, its `auto` choices resolved), with an allreduce it runs (an unknown
    --algorithm is one line here, not one per rank). A predicted run starts no backend: as given, its device
    resolved. The layout (--nodes x --gpus-per-node) is the job's, not a choice of commbench's algorithms: the
    backend settles without it when it runs the library's own (it has no use for it)."""
    from commbench import collectives as C
    from commbench.backends import BackendConfig, BackendError
    from commbench.commands.helpers.backend_options import settle_backend

    layout = f"{plan.nodes}x{plan.ranks_per_node}" if o.nodes else None
    request = BackendConfig(backend=o.backend, torch_backend=o.torch_backend, device=o.device, algorithm=o.algorithm,
                            topology=layout, nprocs=plan.world, timeout_s=o.timeout_s, tuning=o.tuning)
    if plan.mode == "local":
        _check_predicted_algorithm(o.algorithm)
    try:
        device, library = cls.resolve_device(request)
        if plan.mode == "local":
            return replace(request, device=device)
        # the ranks' launcher: a proxy spawns its ranks as processes even where a sweep would run them in
        # one (cuda's peer and virtual modes), so a spawn settles as "spawn" (cuda: ipc, one process a GPU)
        launcher = {"emulate": "torchrun", "spawn": "spawn"}.get(plan.mode) or job.launcher_of(o.launcher)
        _, settled = settle_backend(replace(request, device=device, topology=layout if cls.runs_schedules else None),
                                    launcher)
        settled = replace(settled, topology=layout)
        cls.check_request(settled, library, ["allreduce"], C.resolve_dtype("float32"), "sum", plan.world)
    except BackendError as exc:
        raise UsageFault(str(exc)) from exc
    return settled


def _check_predicted_algorithm(algorithm: str) -> None:
    """Predicted: the cost model takes the library's allreduce or any table entry."""
    from commbench.algorithms import AUTO
    from commbench.costmodel import ALLREDUCE_ALGORITHMS

    if algorithm not in (AUTO, *ALLREDUCE_ALGORITHMS):
        raise UsageFault(f"no algorithm {algorithm!r} for allreduce; available: {', '.join(ALLREDUCE_ALGORITHMS)}, "
                         f"{AUTO}")


def _settle_layout(o: ProxyOptions) -> ProxyOptions:
    """--topology NxG folded into --nodes/--gpus-per-node, a part not given taken from --nprocs; values
    that disagree are one line (commands/scale.py)."""
    from commbench.commands import scale as L

    if o.emulate and o.topology:
        raise UsageFault("--emulate NODESxRANKS sets the job's layout and launch: drop --topology")
    said = L.settle(o.topology, o.nodes, o.gpus_per_node, o.nprocs)
    if said.given and o.nprocs is not None:
        said = L.complete(said, o.nprocs, 1)
    return replace(o, nodes=said.nodes, gpus_per_node=said.per_node)


def _check_validate(plan: job.Plan, bucketing: str, compute: str, cls) -> None:
    """--validate compares like with like: what DDP on torch.distributed really does, with the
    compute of the real model, so a proxy that differs from training in any of these is refused."""
    differs = [what for what, same in (
        ("--backend sim (nothing runs)", plan.mode != "local"), (f"--backend {cls.name} (training runs on torch)",
                                                              cls.makes_ddp_calls),
        ("--no-bucketing/--single-bucket (training uses DDP's buckets)", bucketing == "ddp"),
        (f"--compute {compute} (training runs the real model)", compute == "measured")) if not same]
    if differs:
        raise UsageFault(f"--validate compares the proxy with real training (torch DDP or FSDP, as --setup says); "
                         f"not with {differs[0]}")


def _check_model_available(model: str, profile: Profile, trust_code: bool) -> None:
    """--compute measured and train build the real model: from the catalog, a library, commbench's
    own definitions, or (only with --trust-profile-code) code the profile file names."""
    from commbench.proxies.catalog import CATALOG, foreign_code_refusal, runs_foreign_code

    spec = profile.source.get("spec") or (CATALOG[profile.name].constructor if profile.name in CATALOG else None)
    if spec is None:
        raise UsageFault(f"{profile.name}: --compute measured needs the model definition, and this profile "
                              f"does not name one; use --tflops RATE or --compute none")
    if not isinstance(spec, str) or not spec.split(":")[0].split(".")[0].isidentifier():
        raise UsageFault(f"{model}: source.spec {spec!r} is not a model spec (package:name or module:callable)")
    if not trust_code and runs_foreign_code(spec):
        raise UsageFault(foreign_code_refusal(model, spec))
    package = spec.split(":")[0]
    import importlib.util

    if importlib.util.find_spec(package.split(".")[0]) is None:  # the top-level name only: nothing is imported
        raise UsageFault(f"{profile.name}: --compute measured runs the real model, which needs {package}: "
                              f"pip install 'commbench[models]', or use --tflops RATE / --compute none")


def _check_compute_time(profile: Profile, o: ProxyOptions, compute: str, plan: job.Plan) -> None:
    """The step's emulated compute from the profile's FLOPs, batch and --tflops (or its traced time and the
    batch): a replayed step longer than --timeout would spin until the run is stopped, and a predicted one
    longer than a day comes from a wrong rate; both are refused up front with the numbers."""
    from commbench.analysis.predict_scaling import LONGEST_STEP_S
    from commbench.proxies.timeline import flops_times_us

    if compute not in ("flops", "trace"):
        return
    batch, tflops, timeout_s = o.batch or profile.default_batch, o.tflops, o.timeout_s
    times = profile.traced.times_us(batch) if compute == "trace" else flops_times_us(profile, batch, tflops)
    step_s = sum(times) / 1e6
    limit_s, limit = (LONGEST_STEP_S, "a day") if plan.mode == "local" else (timeout_s, f"--timeout {timeout_s:g} s")
    if step_s <= limit_s:
        return
    if compute == "trace":
        raise UsageFault(f"--batch {batch}: one step of {profile.name} at its traced time per sample computes for "
                         f"{step_s:.3g} s, longer than {limit}; give a smaller --batch"
                         + ("" if plan.mode == "local" else " or a longer --timeout"))
    flops = profile.forward_flops + profile.backward_flops
    raise UsageFault(f"--tflops {tflops:g}: one step of {profile.name} (batch {batch}, {flops:.3g} FLOP per sample "
                     f"forward and backward) computes for {step_s:.3g} s, longer than {limit}; give the device's "
                     f"achieved rate (e.g. --tflops 100)" + ("" if plan.mode == "local" else " or a longer --timeout"))


def _local_gpus() -> int:
    from commbench.backends.torch_lazy import local_gpu_count

    return local_gpu_count()


def _plan(o: ProxyOptions, cls) -> job.Plan:
    """Spawn, join or predict; a job smaller than --nodes asks for is said in one line."""
    nodes, predicted = o.nodes, cls.kind == "predicted"  # sim: the cost model, no ranks
    shape = emulated_shape(o.emulate, o.link, {"--nodes": nodes, "--gpus-per-node": o.gpus_per_node,
                                               "--nprocs": o.nprocs, "--launcher": o.launcher != "auto",
                                               "--local": o.spawn_local, "--hw": o.hw})
    if shape:
        if predicted:
            raise UsageFault(f"--backend {o.backend} predicts the run with the cost model: nothing to run on an "
                             f"emulated cluster (try --backend torch or hybrid)")
        if cls.one_host and shape[0] > 1:
            raise UsageFault(f"--backend {o.backend} needs every rank on one host: --emulate {o.emulate} has "
                             f"{shape[0]} nodes (try --backend hybrid: shared memory inside a node)")
        return job.Plan("emulate", shape[0] * shape[1], None, shape[0], shape[1], link_bps=shape[2])
    per_node = o.gpus_per_node or (_local_gpus() or 1)
    _, info = find_job(o.launcher)
    if predicted:
        return replace(_predicted_layout(o), launch=info)
    if info is not None:  # joined a launcher's job
        if nodes and info.world_size != nodes * per_node:
            return replace(_sim_plan(o, nodes, per_node, f"the job has {info.world_size} rank(s), not the "
                                                         f"{nodes} x {per_node} that --nodes asks for"),
                           launch=info)
        return job.Plan("join", info.world_size, info, info.nnodes, info.local_world_size)
    if nodes:
        if o.spawn_local:
            return job.Plan("spawn", nodes * per_node, None, nodes, per_node)
        return _sim_plan(o, nodes, per_node, f"this host is not a job of {nodes} x {per_node} ranks")
    world = o.nprocs or (_local_gpus() or 2)
    return job.Plan("spawn", world, None, 1, world)


def _predicted_layout(o: ProxyOptions) -> job.Plan:
    """--backend sim: nodes of the hardware's own size unless --gpus-per-node says otherwise; --nodes,
    or --nprocs ranks laid out on such nodes. The layout is said in one note: 32 GPUs of dgx-a100 are
    4 x 8, never one 32-GPU node in silence."""
    hw = _hardware(o)
    per_node = o.gpus_per_node or hw.ranks_per_node
    if o.nodes:
        nodes = o.nodes
    else:
        world = o.nprocs or 2
        per_node = min(per_node, world)
        if world % per_node:
            raise UsageFault(f"--nprocs {world} does not fill nodes of {per_node} GPU(s) ({hw.name}); give "
                             f"--nodes N --gpus-per-node G")
        nodes = world // per_node
    return job.Plan("local", nodes * per_node, None, nodes, per_node,
                    f"predicting {nodes} x {per_node} ranks ({nodes} node(s) of {per_node}) with the cost model of "
                    f"{o.hw} (kind: predicted, nothing measured)")


def _hardware(o: ProxyOptions):
    """--hw loaded (once for the command: the ranks' cost model loads its own), or one line; a poor fit said
    (commands/fit.load_hw, the loader of every command that reads --hw)."""
    from commbench.commands.helpers.hw_option import load_hw

    if not o.hw:
        raise UsageFault("--backend sim predicts with the cost model: give --hw PRESET|FILE")
    return load_hw(o.hw)


def _sim_plan(o: ProxyOptions, nodes: int, per_node: int, why: str) -> job.Plan:
    """A job that is not here (`why`), predicted with the cost model of --hw instead."""
    if not o.hw:
        raise UsageFault(f"{why}; add --local to spawn them all here, or --hw PRESET|FILE to predict them with the "
                         f"cost model")
    _hardware(o)
    return job.Plan("local", nodes * per_node, None, nodes, per_node,
                    f"{why}: predicting {nodes} x {per_node} ranks with the cost model of {o.hw} (kind: predicted, "
                    f"nothing measured)")


def say_note(plan: job.Plan) -> None:
    """The plan's note (why a run is predicted, its layout), once, when the run goes ahead."""
    if plan.note and plan.lead:
        print(f"commbench: note: {plan.note}", flush=True)
