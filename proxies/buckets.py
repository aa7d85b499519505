"""Gradient buckets exactly as PyTorch DDP forms them in steady state.

DDP's first iteration runs with one bucket per dtype in reverse registration order;
after it, the Reducer rebuilds its buckets in the order the gradients became ready
(torch/csrc/distributed/c10d/reducer.cpp, `compute_bucket_assignment_by_size`):
tensors are appended to their dtype's open bucket and the bucket closes as soon as it
holds at least the cap, so a bucket may overshoot by one tensor. The cap is
`bucket_cap_mb` MiB (25 by default); only when `bucket_cap_mb` is left at its default
is the first bucket capped at 1 MiB (`dist._DEFAULT_FIRST_BUCKET_BYTES`): an explicit
`bucket_cap_mb=25` gives a 25 MiB first bucket (torch/nn/parallel/distributed.py,
`_BucketCapacityConfig.create`). Buckets launch in that order (the Reducer launches
bucket i only after bucket i-1), each when its last gradient is ready. The tests check
the layouts against the real Reducer.

Modes: `ddp` (the above), `none` (one allreduce per tensor, in ready order) and
`single` (one bucket for everything, launched when the backward ends).
"""
from __future__ import annotations

from dataclasses import dataclass

from commbench.proxies.profile import Profile

MIB = 1 << 20
FIRST_BUCKET_BYTES = MIB  # torch.distributed._DEFAULT_FIRST_BUCKET_BYTES
DEFAULT_BUCKET_MB = 25.0  # DistributedDataParallel(bucket_cap_mb=25)
MODES = ("ddp", "none", "single")


@dataclass(frozen=True)
class Bucket:
    index: int  # launch order
    tensors: tuple[int, ...]  # indices into Profile.tensors (registration order), in ready order
    nbytes: int
    dtype: str
    ready_flops: float  # backward FLOPs per sample done when its last gradient is ready (0: a traced profile's)
    ready_share: float = 1.0  # the part of the backward done then (by FLOPs, or a traced profile's time)


def assign(profile: Profile, bucket_mb: float | None = None, mode: str = "ddp") -> list[Bucket]:
    """The buckets of a profile in launch order; `bucket_mb` None is DDP's default
    (25 MiB, first bucket 1 MiB), a number is DDP's `bucket_cap_mb=` that number."""
    if mode not in MODES:
        raise ValueError(f"unknown bucketing {mode!r}; choose from {', '.join(MODES)}")
    if bucket_mb is not None and not bucket_mb > 0:
        raise ValueError(f"--bucket-mb {bucket_mb:g}: must be positive")
    order = profile.ready_order()
    if mode == "none":
        groups = [[i] for i in order]
    elif mode == "single":
        groups = _by_dtype(profile, order, [float("inf")])
    else:
        cap = int((bucket_mb or DEFAULT_BUCKET_MB) * MIB)
        groups = _by_dtype(profile, order, [FIRST_BUCKET_BYTES if bucket_mb is None else cap, cap])
    return [_bucket(profile, k, group) for k, group in enumerate(groups)]


def _by_dtype(profile: Profile, order: list[int], limits: list[float]) -> list[list[int]]:
    """Reducer's rule: per dtype, fill the open bucket until it holds >= the current limit,
    then close it and move to the next limit (the last one repeats)."""
    closed: list[list[int]] = []
    open_buckets: dict[str, tuple[list[int], int]] = {}
    limit_index: dict[str, int] = {}
    for i in order:
        tensor = profile.tensors[i]
        members, size = open_buckets.get(tensor.dtype, ([], 0))
        members.append(i)
        size += tensor.nbytes
        level = limit_index.setdefault(tensor.dtype, 0)
        if size >= limits[level]:
            closed.append(members)
            open_buckets.pop(tensor.dtype, None)
            limit_index[tensor.dtype] = min(level + 1, len(limits) - 1)
        else:
            open_buckets[tensor.dtype] = (members, size)
    closed.extend(members for members, _ in open_buckets.values())  # the partly filled ones last
    return closed


def _bucket(profile: Profile, index: int, members: list[int]) -> Bucket:
    tensors = [profile.tensors[i] for i in members]
    return Bucket(index, tuple(members), sum(t.nbytes for t in tensors), tensors[0].dtype,
                  max(t.ready_flops for t in tensors), max(profile.ready_share(i) for i in members))


def describe(buckets: list[Bucket]) -> dict:
    """Count, total and per-bucket bytes (what `profiles show --buckets` prints)."""
    return {"count": len(buckets), "total_bytes": sum(b.nbytes for b in buckets),
            "buckets": [{"index": b.index, "nbytes": b.nbytes, "tensors": len(b.tensors), "dtype": b.dtype}
                        for b in buckets]}
