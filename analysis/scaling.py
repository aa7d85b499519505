"""A training step predicted from the cost model: the proxy's overlap timeline
(commbench.proxies.timeline, the same code the replay executes) with each call's
time taken from the cost model (commbench.costmodel.call_us) instead of measured.

This module imports the proxies (profile, buckets, timeline) as well as the core:
the one place in analysis/ that does, because the scaling prediction *is* the proxy's
timeline with modelled communication (docs/model.md). What one call costs by each
algorithm name (`nccl`, `nccl-ring`, `auto`, a table entry) is the cost model's
(commbench/costmodel/call.py); this module only places the calls in their groups and
the step.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

import numpy as np

from commbench.algorithms import LIBRARY
from commbench.analysis.intervals import levels_fitted, partial_interval_us, uncertainty
from commbench.costmodel import Hardware, call_us, call_variants_us, nccl_tuning
from commbench.proxies.comm_plan import Comm, CommPlan, simulate, simulate_many
from commbench.proxies.profile import Profile
from commbench.proxies.setups import SETUPS, Choice, Compute, Placement, settle
from commbench.proxies.timeline import StepTimes
from commbench.results import FIT_PROVENANCE, ScalingRecord
from commbench.step_terms import StepTerms
from commbench.topology import Topology


def group_topology(topo: Topology, group: str) -> Topology:
    """The ranks a call of `group` spans (comm_plan.GROUPS): all, one node's, or one rank per node. A cross-node
    call stands for the node's ranks_per_node calls at once, each on its shard: together they carry the full
    bytes through the node's links, which one call of the full bytes on one rank per node costs."""
    return {"world": topo, "node": Topology(1, topo.ranks_per_node), "cross": Topology(topo.nodes, 1)}[group]


def _variant_comm_us(hws: list[Hardware], topo: Topology, plan: CommPlan, algorithm: str) -> np.ndarray:
    """(variants x calls): each call of the plan on each of `hws` (a fit's resampled variants), its rounds
    built once per distinct call (costmodel.call_variants_us): the numbers comm_us gives on each."""
    from commbench.collectives import resolve_dtype

    out = np.zeros((len(hws), len(plan.comms)))
    done: dict[tuple, np.ndarray] = {}
    for j, comm in enumerate(plan.comms):
        key = (comm.collective, comm.group, comm.nbytes, comm.dtype)
        if key not in done:
            group = group_topology(topo, comm.group)
            done[key] = np.array(call_variants_us(list(hws), group, comm.collective, algorithm, comm.nbytes,
                                                  resolve_dtype(comm.dtype).itemsize))
        out[:, j] = done[key]
    return out


def comm_us(hw: Hardware, topo: Topology, comm: Comm, algorithm: str,
            groups: dict[str, Topology] | None = None) -> tuple[float, nccl_tuning.NcclChoice | None]:
    """One call's predicted time on `topo` (its group's ranks), and what NCCL runs for it (`nccl` allreduces):
    costmodel.call_us on the call's group. `groups`: where the ranks of a group name sit when they are not
    what `topo` makes of it (HSDP's sized shard group: its "node" may span nodes)."""
    from commbench.collectives import resolve_dtype

    group = (groups or {}).get(comm.group) or group_topology(topo, comm.group)
    return call_us(hw, group, comm.collective, algorithm, comm.nbytes,
                   resolve_dtype(comm.dtype).itemsize)


@dataclass(frozen=True)
class StepPrediction:
    times: StepTimes
    plan: CommPlan
    comm_us: list[float]  # per call of the plan
    choices: list[nccl_tuning.NcclChoice | None] | None = None  # `nccl`: what NCCL runs per allreduce

    @property
    def calls(self) -> int:
        return len(self.plan.comms)


@dataclass(frozen=True)
class SizeChoice:
    """What NCCL runs for the buckets of one size in a step."""
    nbytes: int
    buckets: int
    algorithm: str
    protocol: str
    channels: int
    time_us: float


def size_choices(pred: StepPrediction) -> tuple[SizeChoice, ...] | None:
    """The step's NCCL choices, one per distinct allreduce size in issue order (None: not `nccl`)."""
    if pred.choices is None:
        return None
    by_size: dict[int, list] = {}
    for comm, choice in zip(pred.plan.comms, pred.choices):
        if choice is None:
            continue
        by_size.setdefault(comm.nbytes, [0, choice])[0] += 1
    return tuple(SizeChoice(nbytes, n, c.algorithm, c.protocol, c.channels, c.time_us)
                 for nbytes, (n, c) in by_size.items())


@dataclass(frozen=True)
class StepQuestion:
    """What one data-parallel step prediction asks, built once by each command (or from a record: from_record)
    and handed on whole: the model at `batch` per GPU and micro-step, one rank's `compute` per micro-step (and
    the setup's own work, measured at 1 rank), the setup `choice` with its knobs (DDP's bucket size among them:
    nowhere else), the algorithm each call is costed by, the proxy's `bucketing` (ddp, none or single), the
    ranks' `device`, the step `terms` (commbench/step_terms.py: the compute slowed while a call runs, the
    framework's time per call; None: neither), `comm_cpu_gbps` (CPU ranks with no spare core: the bytes the
    communication library moves per second of the compute's core; None: it takes none), the expected slowest
    rank's delay `straggler_us` (analysis/stragglers.py), and `compute_label`, where the compute came from."""
    profile: Profile
    batch: int
    compute: Compute
    choice: Choice = field(default_factory=lambda: settle("ddp"))
    algorithm: str = LIBRARY
    bucketing: str = "ddp"
    device: str = "cuda"
    terms: StepTerms | None = None
    comm_cpu_gbps: float | None = None
    straggler_us: float = 0.0
    compute_label: str = ""

    @classmethod
    def ddp(cls, profile: Profile, batch: int, forward_us: float, backward_us: float, bucket_mb: float | None = None,
            **fields) -> StepQuestion:
        """DDP with `bucket_mb` (None: DDP's own) over a forward and backward of the times given."""
        return cls(profile, batch, Compute(forward_us, backward_us), settle("ddp", {"bucket_mb": bucket_mb}),
                   **fields)

    @classmethod
    def from_record(cls, record: dict, compute: Compute, topo: Topology, profile: Profile | None = None,
                    **fields) -> StepQuestion:
        """The question a proxy or training record answers: its model (or `profile`, loaded already), batch,
        setup and knobs (setup_of_record), bucketing and device, with `compute` and the `fields` given.
        ValueError (SetupError, ProfileError): a setup, knob or model this commbench does not know."""
        from commbench.proxies.profile import load_profile

        return cls(profile or load_profile(record["model"]), int(record["batch"]), compute,
                   setup_of_record(record, topo), bucketing=record.get("bucketing") or "ddp",
                   device="cpu" if record.get("device") == "cpu" else "cuda", **fields)

    def at(self, **changes) -> StepQuestion:
        return replace(self, **changes)


def setup_of_record(r: dict, topo: Topology) -> Choice:
    """The record's training setup with its settled knobs (older records: DDP with their bucket_mb); ValueError
    (SetupError): a setup or knob this commbench does not know."""
    name = r.get("setup") if isinstance(r.get("setup"), str) else "ddp"
    knobs = {**(r.get("knobs") if isinstance(r.get("knobs"), dict) else {}), "bucket_mb": r.get("bucket_mb")}
    takes = SETUPS[name].knobs if name in SETUPS else ()  # a record keeps every knob, fixed ones too
    return settle(name, {k: v for k, v in knobs.items() if k in takes}, Placement(topo.nodes, topo.ranks_per_node))


def split_compute(split: dict) -> Compute:
    """A replay header's `compute_split_us` (forward, backward, optimizer, ddp) as one rank's Compute."""
    return Compute(float(split["forward"]), float(split["backward"]), float(split.get("optimizer") or 0.0),
                   float(split.get("ddp") or 0.0))


def step_plan(q: StepQuestion, topo: Topology) -> CommPlan:
    """The step's plan: the setup's compute phases and calls on `topo`."""
    return q.choice.plan(q.profile, q.compute, Placement(topo.nodes, topo.ranks_per_node, q.device), q.bucketing)


def predict_step(q: StepQuestion, topo: Topology, hw: Hardware) -> StepPrediction:
    """One data-parallel step of `q` on `topo`: compute as given per micro-step, the setup's own work where the
    setup places it, each call from the model, and the straggler delay added to the step. With comm_cpu_gbps
    each call slows the compute it overlaps by the CPU its bytes take; with terms, by the overlap slowdown, and
    the framework's time per call is counted as other."""
    plan = step_plan(q, topo)
    algorithm, terms = q.algorithm, q.terms
    costs = {}
    for comm in plan.comms:
        key = (comm.collective, comm.group, comm.nbytes, comm.dtype)
        if key not in costs:
            costs[key] = comm_us(hw, topo, comm, algorithm)
    pairs = [costs[(c.collective, c.group, c.nbytes, c.dtype)] for c in plan.comms]
    comm = [t for t, _ in pairs]
    choices = [c for _, c in pairs] if algorithm == LIBRARY and topo.world > 1 else None
    times = simulate(plan, comm, steal_us(plan, q.comm_cpu_gbps, comm, terms))
    return StepPrediction(_late(times, q.straggler_us + framework_us(plan, topo, terms)), plan, comm, choices)


def steal_us(plan: CommPlan, comm_cpu_gbps: float | None, comm: list[float] | None = None,
             terms: StepTerms | None = None) -> list[float] | None:
    """The time each call takes from the compute beside it (None: it takes none): the CPU its bytes cost at
    `comm_cpu_gbps` (a CPU rank with no spare core), plus, with `terms`, the share s / (1 + s) of its duration
    that an `overlap_slowdown` s takes (the compute runs at 1 / (1 + s) of its pace while the call runs)."""
    slowdown = terms.overlap_slowdown.value if terms is not None and comm is not None else 0.0
    cpu = comm_cpu_gbps if comm_cpu_gbps and comm_cpu_gbps > 0 else None  # none measured, or a damaged figure
    if cpu is None and not slowdown > 0:
        return None
    out = [c.nbytes / (cpu * 1e3) if cpu else 0.0 for c in plan.comms]
    if slowdown > 0:
        out = [min(t, s + t * slowdown / (1 + slowdown)) for s, t in zip(out, comm)]
    return out


def framework_us(plan: CommPlan, topo: Topology, terms: StepTerms | None) -> float:
    """The framework's own time per step for its calls (`per_bucket_us` each; none on one rank: no calls)."""
    if terms is None or topo.world == 1:
        return 0.0
    return terms.per_bucket_us.value * len(plan.comms)


def _late(times: StepTimes, straggler_us: float) -> StepTimes:
    """The step waiting `straggler_us` longer for its slowest rank (counted as other: neither compute nor
    communication of the rank that waits)."""
    if not straggler_us:
        return times
    return replace(times, step_us=times.step_us + straggler_us, other_us=times.other_us + straggler_us)


def step_interval_us(q: StepQuestion, topo: Topology, hw: Hardware) -> tuple[float, float] | None:
    """The 80% interval of predict_step's step time (docs/model.md, "Uncertainty"): each call costed on every
    resample of the fit (intervals.Uncertainty: the fit without each point), times that resample's factors (one
    for all of a step's calls), through the same timeline; compute is as given, not spread. None: one rank
    (nothing modelled: an interval of zero width would only say that the compute was given), no resamples (a
    preset), a link level of `topo` the fit did not measure (intervals.levels_fitted), or `nccl`, whose calls
    NCCL's tuning model times with NCCL's own latency constants, which no fit measured (only its bandwidths
    come from the file)."""
    algorithm, terms, comm_cpu_gbps = q.algorithm, q.terms, q.comm_cpu_gbps
    if algorithm == LIBRARY or topo.world == 1 or not levels_fitted(hw, topo) or uncertainty(hw) is None:
        return None
    plan = step_plan(q, topo)
    n = len(plan.comms)
    extra_us = q.straggler_us + framework_us(plan, topo, terms)

    def steps(hardware: list[Hardware], factors: np.ndarray) -> np.ndarray:
        comm = _variant_comm_us(hardware, topo, plan, algorithm)
        rows = (comm[:, None, :] * factors[:, :, None]).reshape(-1, n)  # each resample its own factors
        if steal_us(plan, comm_cpu_gbps, list(rows[0]) if len(rows) else None, terms) is None:
            return simulate_many(plan, rows) + extra_us
        return np.array([simulate(plan, row, steal_us(plan, comm_cpu_gbps, list(row), terms)).step_us
                         for row in rows]) + extra_us  # no closed form

    return partial_interval_us(hw, steps)


# ---------------------------------------------------------------- scaling curves


class ScalingError(ValueError):
    """A GPU count the node size cannot lay out, or a rate that is not positive (one line)."""


def layout(gpus: int, gpus_per_node: int) -> Topology:
    """N GPUs as nodes x GPUs per node: one partly used node below a node's size, whole nodes above."""
    if gpus < 1 or gpus_per_node < 1:
        raise ScalingError(f"GPU counts and --gpus-per-node must be at least 1 (got {gpus}, {gpus_per_node})")
    if gpus <= gpus_per_node:
        return Topology(1, gpus)
    if gpus % gpus_per_node:
        raise ScalingError(f"{gpus} GPUs do not fill whole nodes of {gpus_per_node}; use a multiple of "
                           f"{gpus_per_node} (or --gpus-per-node that divides it)")
    return Topology(gpus // gpus_per_node, gpus_per_node)


def predict_scaling(q: StepQuestion, hw: Hardware, gpu_counts: list[int], gpus_per_node: int,
                    step_ratios: np.ndarray | None = None) -> list[ScalingRecord]:
    """Step time, throughput, speedup and linearity of `q` per GPU count (weak scaling: its batch per GPU and
    micro-step), one `scaling` record each; `step_ratios`: a 1-rank run's step times over their median, whose
    expected maximum over N ranks delays every step of N (analysis/stragglers.py). A fitted hardware file gives
    each point its step's 80% interval, and the throughput and linearity at its ends (the 1-GPU step they are
    measured against has no communication: nothing of it is uncertain)."""
    from commbench.analysis.stragglers import expected_max

    choice, batch = q.choice, q.batch
    samples = batch * dict(choice.knobs).get("accumulate", 1)  # per GPU per optimizer step
    points, base, one_step = [], None, None
    for gpus in [1, *gpu_counts]:
        topo = layout(gpus, gpus_per_node)
        late = 0.0
        if step_ratios is not None and gpus > 1:
            late = max(0.0, one_step * (expected_max(step_ratios, gpus) - 1.0))
        at = q.at(straggler_us=late)
        pred = predict_step(at, topo, hw)  # the node's size is the topology's: the cost model reads only it
        t = pred.times
        one_step = one_step or t.step_us
        rate = samples * gpus / (t.step_us * 1e-6)
        base = base or rate
        step = step_interval_us(at, topo, hw) if gpus in gpu_counts else None
        rates = (samples * gpus / (step[1] * 1e-6), samples * gpus / (step[0] * 1e-6)) if step else None
        choices = size_choices(pred)
        points.append(ScalingRecord(
            model=q.profile.name, hardware=hw.name, batch=batch, compute=q.compute_label, gpus=gpus,
            nodes=topo.nodes, gpus_per_node=topo.ranks_per_node, algorithm=q.algorithm, step_us=t.step_us,
            compute_us=t.compute_us, comm_us=t.comm_us, exposed_comm_us=t.exposed_comm_us, samples_per_s=rate,
            speedup=rate / base,
            linearity=rate / (gpus * base), nccl_choices=None if choices is None else tuple(asdict(c) for c in choices),
            setup=choice.name, knobs=dict(choice.knobs), step_interval_us=step, samples_per_s_interval=rates,
            linearity_interval=(rates[0] / (gpus * base), rates[1] / (gpus * base)) if rates else None,
            straggler_us=late, interval_source=FIT_PROVENANCE if step else None,
            step_terms=q.terms.summary() if q.terms is not None else None, hardware_doubts=hw.doubts() or None))
    return points[1:]
