"""Real data-parallel training of a profile's model: torch DDP on gloo (CPU) or NCCL (GPU),
random weights, synthetic inputs of the profile's shape, SGD with momentum.

Throughput is measured as published framework benchmarks measure it: the first
`warmup_steps` are run and dropped, the following `steps` are timed one by one (a step is
zero_grad, forward, loss, backward with DDP's allreduces, optimizer step; synchronised on
GPU). The same `Trainer` times forward, backward and optimizer separately, without DDP,
for the proxy's `--compute measured`.
"""
from __future__ import annotations

import gc
import time
from contextlib import contextmanager
from typing import Any, Callable

import numpy as np

from commbench.job import Job
from commbench.proxies.catalog import (
    CATALOG,
    BuiltModel,
    ModelError,
    build,
    build_named,
    foreign_code_refusal,
    loss_of,
    runs_foreign_code,
)
from commbench.proxies.config import ProxyConfig
from commbench.proxies.context import run_rank, summary_from_records
from commbench.proxies.profile import Profile

LEARNING_RATE, MOMENTUM = 0.01, 0.9


class Trainer:
    """A model, its optimizer and one synthetic batch on a device."""

    def __init__(self, profile: Profile, batch: int, device: Any, amp: bool = False, trust_code: bool = False):
        import torch

        built = model_for(profile, trust_code)
        self.device, self.amp = device, amp and getattr(device, "type", device) == "cuda"
        self.model = built.module.to(device)
        self.model.train()
        self.args, self.kwargs = built.make_inputs(batch, device)
        self.new_optimizer()
        self.scaler = torch.amp.GradScaler("cuda") if self.amp else None
        self.wrapped = self.model  # DistributedDataParallel once wrap() is called
        self.on_step: Callable[[str], None] = lambda what: None  # told before each timed step (progress)

    def wrap(self, bucket_mb: float | None, device_ids: list[int] | None, process_group: Any = None) -> None:
        import torch

        self.wrapped = torch.nn.parallel.DistributedDataParallel(self.model, device_ids=device_ids,
                                                                 bucket_cap_mb=bucket_mb, process_group=process_group)

    def new_optimizer(self) -> None:
        """SGD over the model's parameters as they are now (after FSDP replaced them)."""
        import torch

        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=LEARNING_RATE, momentum=MOMENTUM)

    def forward(self):
        import torch

        with torch.autocast("cuda", dtype=torch.float16, enabled=self.amp):
            return loss_of(self.wrapped(*self.args, **self.kwargs))

    def backward(self, loss) -> None:
        (self.scaler.scale(loss) if self.scaler else loss).backward()

    def update(self) -> None:
        if self.scaler:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def step(self) -> None:
        self.backward(self.forward())
        self.update()
        self.sync()

    def sync(self) -> None:
        import torch

        if getattr(self.device, "type", self.device) == "cuda":
            torch.cuda.synchronize()

    def cpu_timed(self) -> bool:
        """On a CPU with one intra-op thread the compute is this thread's CPU time, which other
        processes on the host cannot inflate (the proxy replays it as CPU time too)."""
        import torch

        return getattr(self.device, "type", self.device) == "cpu" and torch.get_num_threads() == 1

    def phase_times_us(self, repeats: int = 3) -> tuple[float, float, float]:
        """Median (forward, backward, optimizer) times of `repeats` steps after one warm-up, no DDP:
        thread CPU time when `cpu_timed`, else wall time (after a CUDA synchronize on GPU)."""
        clock = time.thread_time if self.cpu_timed() else time.perf_counter
        rows = []
        for _ in range(repeats + 1):
            self.on_step("forward, backward, optimizer, without the setup")
            t0 = clock()
            loss = self.forward()
            self.sync()
            t1 = clock()
            self.backward(loss)
            self.sync()
            t2 = clock()
            self.update()
            self.sync()
            rows.append((t1 - t0, t2 - t1, clock() - t2))
        forward, backward, update = np.median(np.array(rows[1:]) * 1e6, axis=0)
        return float(forward), float(backward), float(update)


def measure_compute(profile: Profile, batch: int, device: Any, amp: bool = False, local_ranks: int = 1, *,
                    ready: Callable[[], None] = lambda: None, trust_code: bool = False,
                    bucket_mb: float | None = None, choice=None, show_progress: bool = False, repeats: int = 5
                    ) -> tuple[tuple[float, float, float, float], bool]:
    """The real model's (forward, backward, optimizer, the setup's own work) microseconds per step here, and
    whether they are CPU time: refused up front if it cannot fit; `ready` runs between building and
    timing (a barrier, so that every rank measures at once, sharing the host as in training).

    The setup's own work (`choice`, a proxies.setups.Choice; default ddp with `bucket_mb`) is what it adds
    to a step where no traffic leaves the rank, on a process group of this rank alone
    (train_setups.own_work_us): DDP's copies of the gradients into and out of its buckets, its hooks and
    its calls (docs/model.md, "Terms the model counts"); FSDP's copies in and out of its all-gather and
    reduce-scatter buffers and its DTensor parameters. `show_progress` (rank 0): a line saying what is
    measured, then a progress line with an ETA, as a sweep's."""
    from commbench.proxies import train_setups
    from commbench.proxies.setups import settle
    from commbench.table import Progress

    choice = choice or settle("ddp", {"bucket_mb": bucket_mb})
    kind = getattr(device, "type", device)
    check_memory(profile, local_ranks * (2 if choice.setup.trains_as == "fsdp" else 1), kind)
    steps = compute_steps(repeats)
    if show_progress:
        print(f"# measuring {profile.name}'s compute here first (batch {batch}, at 1 rank: {steps} steps of "
              f"the real model; the replay's steps follow; kept for the next run of the same model, batch and "
              f"setup)", flush=True)
    trainer = Trainer(profile, batch, device, amp=amp, trust_code=trust_code)
    progress = Progress(steps, enabled=None if show_progress else False, unit="steps")
    begun = 0

    def tick(what: str) -> None:  # before each step: the ones before it are done
        nonlocal begun
        progress.done, begun = begun, begun + 1
        progress.update(what)

    trainer.on_step = tick
    ready()
    try:
        phases, cpu_time = trainer.phase_times_us(repeats=repeats), trainer.cpu_timed()
        with one_rank_group(kind) as group:
            try:
                own = train_setups.own_work_us(trainer, choice, profile, group,
                                               [device.index] if kind == "cuda" else None, pairs=own_pairs(repeats))
            finally:  # DDP's Reducer goes before the group does
                trainer.wrapped = trainer.model = trainer.optimizer = None
                del trainer
                gc.collect()
    finally:
        progress.close()
    return (*phases, own), cpu_time


def own_pairs(repeats: int) -> int:
    """own_work_us's pairs for `repeats` phase steps: 6 at 5 (its default), as few as 2."""
    return max(2, min(6, repeats + 1))


def compute_steps(repeats: int = 5) -> int:
    """measure_compute's steps: phase_times_us's repeats after a warm-up, own_work_us's warm-up and pairs."""
    return repeats + 1 + 2 * 2 + 2 * own_pairs(repeats)


COMPUTE_STEPS = compute_steps()  # 22: the default run's


@contextmanager
def one_rank_group(device_type: str):
    """A torch.distributed process group of this rank alone (gloo on a CPU, NCCL on a GPU), destroyed
    after: a group of the default group's ranks made by this rank only (no collective, no waiting for
    peers) when there is one, else a world of one made here."""
    import torch.distributed as dist

    from commbench.backends.torch_dist import default_library

    backend = default_library(device_type)
    if dist.is_initialized():
        group = dist.new_group([dist.get_rank()], backend=backend, use_local_synchronization=True)
        try:
            yield group
        finally:
            dist.destroy_process_group(group)
        return
    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield None
    finally:
        dist.destroy_process_group()


def model_for(profile: Profile, trust_code: bool = False) -> BuiltModel:
    """The real model behind a profile: the catalog's definition, or the spec it was extracted from.
    A spec that would run code other than a library's registered model or commbench's own definitions
    (catalog.runs_foreign_code) is built only with `trust_code` (--trust-profile-code)."""
    spec = profile.source.get("spec")
    if spec is None and profile.name in CATALOG:
        return build_named(profile.name)
    if spec is None:
        raise ModelError(f"profile {profile.name!r} does not say which model it came from (source.spec)")
    if not isinstance(spec, str):
        raise ModelError(f"profile {profile.name!r}: source.spec must be a model spec string, not {spec!r}")
    if not trust_code and runs_foreign_code(spec):
        raise ModelError(foreign_code_refusal(profile.name, spec))
    shape = profile.source.get("input_shape") or []
    if not isinstance(shape, list) or not all(type(d) is int and d > 0 for d in shape):
        raise ModelError(f"profile {profile.name!r}: source.input_shape must be a list of positive integers")
    return build(spec, tuple(shape))


def check_memory(profile: Profile, world_local: int, device: str) -> None:
    """Refuse up front what cannot fit: weights, gradients, momentum and DDP's bucket copy are
    4x the parameters per rank (activations come on top)."""
    need = 4 * profile.nbytes * (1 if device == "cuda" else world_local)  # a GPU per rank; CPU ranks share
    free = _free_bytes(device)
    if free is not None and need > free:
        raise MemoryError(f"{profile.name} needs at least {need / 2**30:.1f} GiB for {world_local} local rank(s) "
                          f"(weights, gradients, momentum, DDP buckets) but {free / 2**30:.1f} GiB is free")


def _free_bytes(device: str) -> int | None:
    if device == "cuda":
        import torch

        return torch.cuda.mem_get_info()[0]
    from commbench.environment import memory_limit_bytes

    limit = memory_limit_bytes()  # a memory group's limit holds however much the host has free
    try:
        with open("/proc/meminfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    available = int(line.split()[1]) * 1024
                    return min(available, limit) if limit else available
    except OSError:
        pass
    return limit


# ---------------------------------------------------------------- one rank of `commbench train`


def run_train(cfg, launch, argv: list[str]) -> int:
    """The `train` job on this rank; returns the exit code (2: does not fit, 3: a rank failed)."""
    if cfg.layout:  # a parallel layout (train --layout)
        from commbench.proxies.layouts.train.run import train_layout_steps

        return run_rank(cfg, launch, argv, train_layout_steps)
    return run_rank(cfg, launch, argv, _train_steps)


TRAIN_JOB = Job("train", f"{__name__}:TRAIN_JOB", ProxyConfig, run_train, summary_from_records)


def _train_steps(ctx) -> None:
    """Build the model, wrap it as the setup says (train_setups.apply), run and log the steps (called by
    context.run_rank)."""
    import torch

    from commbench.proxies import train_setups
    from commbench.proxies.setups import Placement

    backend, profile, cfg, launch = ctx.backend, ctx.profile, ctx.cfg, ctx.launch
    check_memory(profile, launch.local_world_size, backend.device)
    device = torch.device(backend.device, torch.cuda.current_device()) if backend.device == "cuda" else "cpu"
    torch.manual_seed(1234 + backend.rank)
    trainer = Trainer(profile, ctx.batch, device, cfg.amp, trust_code=cfg.trust_profile_code)
    layout = Placement(launch.nnodes, launch.world_size // max(1, launch.nnodes), backend.device)
    model_name = type(trainer.model).__name__  # before fully_shard renames the class (FSDP<name>)
    try:
        running = train_setups.apply(trainer, ctx.choice, layout, profile,
                                     [device.index] if backend.device == "cuda" else None)
        micro = f", {running.accumulate} micro-steps per step" if running.accumulate > 1 else ""
        ctx.start(compute="real" + (" (amp)" if trainer.amp else ""), lines=[
            f"real training, setup {running.what}{micro}: {model_name}, SGD momentum {MOMENTUM}, "
            f"synthetic inputs, {'amp fp16' if trainer.amp else 'fp32'}"])
        for index in range(cfg.warmup_steps + cfg.steps):
            t0 = time.perf_counter()
            running.step()
            ctx.record(index, {"compute_us": None, "comm_us": None, "exposed_comm_us": None,
                               "step_us": (time.perf_counter() - t0) * 1e6})
    finally:  # DDP's Reducer must go before its process group does (else it can abort at exit)
        trainer.wrapped = trainer.model = trainer.optimizer = None
        running = None
        del trainer
        gc.collect()
