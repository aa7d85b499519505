"""`proxy` and `train` options, validated into a ProxyConfig and a job plan: spawn local
ranks, join the launcher's job, or predict with the cost model (mode `local`: nothing runs
but the model)."""
from __future__ import annotations

import os
import tempfile
from dataclasses import replace

from commbench import job
from commbench.commands.common import UsageFault, find_job
from commbench.commands.emulate import emulated_shape
from commbench.commands.setup_flags import check_trainable, given_knobs, settle_setup
from commbench.proxies.config import ProxyConfig
from commbench.proxies.profile import Profile, ProfileError, load_profile


def bucketing_mode(no_bucketing: bool, single_bucket: bool) -> str:
    if no_bucketing and single_bucket:
        raise UsageFault("--no-bucketing and --single-bucket exclude each other")
    return "none" if no_bucketing else "single" if single_bucket else "ddp"


def _check_numbers(options: dict) -> None:
    from commbench.commands import options as O

    counts = {f"--{flag.replace('_', '-')}": (O.NONNEGATIVE_COUNT if flag == "warmup_steps" else O.COUNT,
                                              options.get(flag))
              for flag in ("batch", "steps", "warmup_steps", "nodes", "gpus_per_node", "nprocs")}
    O.check({**counts, "--bucket-mb": (O.Range(0, 1 << 20, low_open=True), options.get("bucket_mb")),
             "--tflops": (O.Range(0, 1e9, low_open=True), options.get("tflops")),
             "--timeout": (O.TIMEOUT, options.get("timeout_s"))})


def _check_ranks(options: dict, plan: job.Plan) -> None:
    """Before any rank starts: a host not oversubscribed by the spawn, and an allreduce the backend
    runs (an unknown --algorithm is one line here, not one per rank)."""
    from commbench import collectives as C
    from commbench.backends import BackendConfig, BackendError, backend_class
    from commbench.commands import options as O

    if plan.mode in ("spawn", "emulate"):  # an emulated cluster's ranks all run on this host too
        O.check_local_ranks(plan.world, options.get("oversubscribe", False))
    if plan.mode == "local":  # predicted: the cost model takes the library's allreduce or any table entry
        from commbench.algorithms import LIBRARY, available
        from commbench.analysis.scaling import LIBRARY_RING

        known = [LIBRARY, LIBRARY_RING, *available("allreduce", gpu=True)]
        if options["algorithm"] not in ("auto", *known):
            raise UsageFault(f"no algorithm {options['algorithm']!r} for allreduce; available: {', '.join(known)}, "
                             f"auto")
        return
    request = BackendConfig(backend=options["backend"], torch_backend=options["torch_backend"],
                            device=options["device"], algorithm=options["algorithm"], nprocs=plan.world,
                            topology=f"{plan.nodes}x{plan.ranks_per_node}" if options["nodes"] else None)
    try:
        cls = backend_class(request.backend)
        library = cls.resolve_device(request)[1]
        cls.check_request(request, library, ["allreduce"], C.resolve_dtype("float32"), "sum", plan.world)
    except BackendError as exc:
        raise UsageFault(str(exc)) from exc


def make_config(options: dict) -> tuple[ProxyConfig, job.Plan]:
    """Everything that can be checked before a rank starts, as (config, plan)."""
    _check_numbers(options)
    bucketing = _check_setup_flags(options)
    options = _settle_layout(options)
    try:
        profile = load_profile(options["model"])
    except ProfileError as exc:
        raise UsageFault(str(exc)) from exc
    compute = options["compute"] or ("flops" if options["tflops"] else "measured")
    if compute == "flops" and not options["tflops"]:
        raise UsageFault("--compute flops needs --tflops RATE (the device's achieved 1e12 FLOP/s)")
    if compute == "measured":
        _check_model_available(options["model"], profile, bool(options.get("trust_profile_code")))
    plan = _plan(options)
    from commbench.commands.proxy_parallel import layout_fields

    layout = layout_fields(options, profile, compute, plan.world, plan.ranks_per_node)
    _check_compute_time(profile, options, compute, plan)
    _check_ranks(options, plan)
    if plan.mode == "local" and not options["compute"] and not options["tflops"]:
        raise UsageFault("a predicted step needs the cluster's compute rate: give --tflops RATE (the GPUs' "
                              "achieved 1e12 FLOP/s), or --compute none, or --compute measured (this host's)")
    from commbench.commands.backend_options import backend_class_of

    cls = backend_class_of(options["backend"])
    if options.get("validate"):
        _check_validate(plan, bucketing, compute, cls)
    device = _device(options)
    choice = settle_setup(options.get("setup") or "ddp", options, plan.nodes, plan.ranks_per_node,
                          "cpu" if device == "cpu" else "cuda", plan.world)
    if plan.mode != "local" and not cls.runs_rank_groups and not choice.setup.allreduce_only:
        raise UsageFault(f"setup {choice.name} issues all-gathers and reduce-scatters on groups of ranks: replay it "
                         f"on --backend torch (commbench's schedules replay the allreduce setups)")
    json_path = options["json_path"]
    if options.get("validate") and not json_path:  # both runs' records, compared; proxy_command removes the folder
        json_path = os.path.join(tempfile.mkdtemp(prefix="commbench-validate-"), "proxy.jsonl")
    cfg = ProxyConfig(model=options["model"], batch=options["batch"], bucket_mb=options["bucket_mb"],
                      bucketing=bucketing, compute=compute, tflops=options["tflops"], steps=options["steps"],
                      warmup_steps=options["warmup_steps"], amp=bool(options.get("amp")),
                      backend=_backend_config(options, plan, cls, device), hw=options["hw"], json_path=json_path,
                      monitor=bool(options.get("monitor")),
                      trust_profile_code=bool(options.get("trust_profile_code")), setup=choice.name,
                      knobs={k: v for k, v in given_knobs(options).items() if k != "bucket_mb"})
    return replace(cfg, **layout), plan


def _check_setup_flags(options: dict) -> str:
    """The setup's flags, checked before anything slow (loading the model, its library, a rank): a knob the
    setup does not take, a setup `train` cannot run, DDP's bucketing flags on another setup. The knobs'
    fit to the layout is checked once the layout is known. Returns the bucketing mode."""
    bucketing = bucketing_mode(options["no_bucketing"], options["single_bucket"])
    choice = settle_setup(options.get("setup") or "ddp", options)
    if options.get("train") or options.get("validate"):
        check_trainable(choice)
    if not choice.setup.proxy_buckets and bucketing != "ddp":
        raise UsageFault(f"--no-bucketing/--single-bucket are DDP's; setup {choice.name} has its own calls")
    return bucketing


def _backend_config(options: dict, plan: job.Plan, cls, device: str):
    """The options the ranks' backend reads, settled by its class as the sweep's are (an option it does
    not take is refused, its `auto` choices resolved); a predicted run starts no backend: as given.
    The layout (--nodes x --gpus-per-node) is the job's, not a choice of commbench's algorithms: the
    backend settles without it when it runs the library's own (it has no use for it)."""
    from commbench.backends import BackendConfig
    from commbench.commands.backend_options import settle_backend

    layout = f"{plan.nodes}x{plan.ranks_per_node}" if options["nodes"] else None
    request = BackendConfig(backend=options["backend"], torch_backend=options["torch_backend"], device=device,
                            algorithm=options["algorithm"], topology=layout, nprocs=plan.world,
                            timeout_s=options["timeout_s"], tuning=options.get("tuning"))
    if plan.mode == "local":
        return request
    # the ranks' launcher: a proxy spawns its ranks as processes even where a sweep would run them in
    # one (cuda's peer and virtual modes), so a spawn settles as "spawn" (cuda: ipc, one process a GPU)
    launcher = {"emulate": "torchrun", "spawn": "spawn"}.get(plan.mode) or job.launcher_of(options["launcher"])
    _, settled = settle_backend(request if cls.runs_schedules else replace(request, topology=None), launcher)
    return replace(settled, topology=layout)


def _settle_layout(options: dict) -> dict:
    """--topology NxG folded into --nodes/--gpus-per-node, a part not given taken from --nprocs; values
    that disagree are one line (commands/layout.py)."""
    from commbench.commands import layout as L

    if options.get("emulate") and options.get("topology"):
        raise UsageFault("--emulate NODESxRANKS sets the job's layout and launch: drop --topology")
    said = L.settle(options.get("topology"), options["nodes"], options["gpus_per_node"], options["nprocs"])
    if said.given and options["nprocs"] is not None:
        said = L.complete(said, options["nprocs"], 1)
    return {**options, "nodes": said.nodes, "gpus_per_node": said.per_node}


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


def _check_compute_time(profile: Profile, options: dict, compute: str, plan: job.Plan) -> None:
    """The step's emulated compute from the profile's FLOPs, batch and --tflops: a replayed step longer
    than --timeout would spin until the run is stopped, and a predicted one longer than a day comes from
    a wrong rate; both are refused up front with the numbers."""
    from commbench.analysis.predict_scaling import LONGEST_STEP_S
    from commbench.proxies.timeline import flops_times_us

    if compute != "flops":
        return
    batch, tflops, timeout_s = options["batch"] or profile.default_batch, options["tflops"], options["timeout_s"]
    step_s = sum(flops_times_us(profile, batch, tflops)) / 1e6
    limit_s, limit = (LONGEST_STEP_S, "a day") if plan.mode == "local" else (timeout_s, f"--timeout {timeout_s:g} s")
    if step_s <= limit_s:
        return
    flops = profile.forward_flops + profile.backward_flops
    raise UsageFault(f"--tflops {tflops:g}: one step of {profile.name} (batch {batch}, {flops:.3g} FLOP per sample "
                     f"forward and backward) computes for {step_s:.3g} s, longer than {limit}; give the device's "
                     f"achieved rate (e.g. --tflops 100)" + ("" if plan.mode == "local" else " or a longer --timeout"))


def _device(options: dict) -> str:
    """The device the ranks run on, as the backend resolves `--device`."""
    from commbench.backends import BackendConfig, BackendError, backend_class

    request = BackendConfig(backend=options["backend"], device=options["device"],
                            torch_backend=options["torch_backend"])
    try:
        return backend_class(request.backend).resolve_device(request)[0]
    except BackendError as exc:
        raise UsageFault(str(exc)) from exc


def _local_gpus() -> int:
    from commbench.backends.torch_lazy import local_gpu_count

    return local_gpu_count()


def _plan(options: dict) -> job.Plan:
    """Spawn, join or predict; a job smaller than --nodes asks for is said in one line."""
    from commbench.backends import BackendError, backend_class

    backend, nodes = options["backend"], options["nodes"]
    try:
        predicted = backend_class(backend).kind == "predicted"  # sim: the cost model, no ranks
    except BackendError as exc:
        raise UsageFault(str(exc)) from exc
    shape = emulated_shape(options, {"--nodes": nodes, "--gpus-per-node": options["gpus_per_node"],
                                     "--nprocs": options["nprocs"], "--launcher": options["launcher"] != "auto",
                                     "--local": options.get("spawn_local"), "--hw": options.get("hw")})
    if shape:
        if predicted:
            raise UsageFault(f"--backend {backend} predicts the run with the cost model: nothing to run on an "
                             f"emulated cluster (try --backend torch or hybrid)")
        if backend_class(backend).one_host and shape[0] > 1:
            raise UsageFault(f"--backend {backend} needs every rank on one host: --emulate {options['emulate']} has "
                             f"{shape[0]} nodes (try --backend hybrid: shared memory inside a node)")
        return job.Plan("emulate", shape[0] * shape[1], None, shape[0], shape[1], link_bps=shape[2])
    per_node = options["gpus_per_node"] or (_local_gpus() or 1)
    _, info = find_job(options["launcher"])
    joined = info is not None
    if predicted:
        return replace(_predicted_layout(options), launch=info)
    if joined:
        if nodes and info.world_size != nodes * per_node:
            return replace(_sim_plan(options, nodes, per_node, f"the job has {info.world_size} rank(s), not the "
                                                               f"{nodes} x {per_node} that --nodes asks for"),
                           launch=info)
        return job.Plan("join", info.world_size, info, info.nnodes, info.local_world_size)
    if nodes:
        if options["spawn_local"]:
            return job.Plan("spawn", nodes * per_node, None, nodes, per_node)
        return _sim_plan(options, nodes, per_node, f"this host is not a job of {nodes} x {per_node} ranks")
    world = options["nprocs"] or (_local_gpus() or 2)
    return job.Plan("spawn", world, None, 1, world)


def _predicted_layout(options: dict) -> job.Plan:
    """--backend sim: nodes of the hardware's own size unless --gpus-per-node says otherwise; --nodes,
    or --nprocs ranks laid out on such nodes. The layout is said in one note: 32 GPUs of dgx-a100 are
    4 x 8, never one 32-GPU node in silence."""
    hw = _hardware(options)
    per_node = options["gpus_per_node"] or hw.ranks_per_node
    if options["nodes"]:
        nodes = options["nodes"]
    else:
        world = options["nprocs"] or 2
        per_node = min(per_node, world)
        if world % per_node:
            raise UsageFault(f"--nprocs {world} does not fill nodes of {per_node} GPU(s) ({hw.name}); give "
                             f"--nodes N --gpus-per-node G")
        nodes = world // per_node
    plan = _sim_plan(options, nodes, per_node, None)
    return replace(plan, note=f"predicting {nodes} x {per_node} ranks ({nodes} node(s) of {per_node}) with the "
                              f"cost model of {options['hw']} (kind: predicted, nothing measured)")


def _hardware(options: dict):
    from commbench.costmodel import HardwareError, load_hardware

    if not options["hw"]:
        raise UsageFault("--backend sim predicts with the cost model: give --hw PRESET|FILE")
    try:
        return load_hardware(options["hw"])
    except HardwareError as exc:
        raise UsageFault(str(exc)) from exc


def _sim_plan(options: dict, nodes: int, per_node: int, why: str | None) -> job.Plan:
    if not options["hw"]:
        hint = "; add --local to spawn them all here, or --hw PRESET|FILE to predict them with the cost model" \
            if why else ""
        raise UsageFault((why or "--backend sim predicts with the cost model") + hint +
                              ("" if why else ": give --hw PRESET|FILE"))
    from commbench.costmodel import HardwareError, load_hardware

    try:
        load_hardware(options["hw"])
    except HardwareError as exc:
        raise UsageFault(str(exc)) from exc
    note = f"{why}: predicting {nodes} x {per_node} ranks with the cost model of {options['hw']} " \
           f"(kind: predicted, nothing measured)" if why else None
    return job.Plan("local", nodes * per_node, None, nodes, per_node, note)


def say_note(plan: job.Plan) -> None:
    """The plan's note (why a run is predicted, its layout), once, when the run goes ahead."""
    if plan.note and plan.lead:
        print(f"commbench: note: {plan.note}", flush=True)
