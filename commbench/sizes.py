"""Message sizes: parse `--sizes` (ranges and lists, binary K/M/G) and print them back.

Sizes are bytes. Suffixes are binary, as in nccl-tests' -b/-e: 1K = 1024 B,
1M = 1024**2 B, 1G = 1024**3 B, 1T = 1024**4 B. A trailing "B" or "iB" is accepted
(`64KiB`, `64KB`, `64K` are the same size).
"""
from __future__ import annotations

import math
import re

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:I?B)?\s*$", re.IGNORECASE)

#: Hard ceiling on the number of sizes a sweep may contain (a typo like
#: `--step 1` over 1K-1G would otherwise mean a billion points).
MAX_SIZES = 10_000
#: The most sizes a sweep measures: each costs its warm-up, timed calls and check (a quarter second at the
#: least with adaptive iterations, minutes at 1 GiB on CPU ranks), so a longer range is a typo of its step:
#: nccl-tests' `-b 1K -e 1G -f 1.0000001` is -f 1 (strtol), steps of -i's 1 MiB, 1,024 sizes, hours of gloo.
#: `predict` costs sizes without running them and takes up to MAX_SIZES.
MAX_MEASURED_SIZES = 1_000
#: The largest size accepted: 4 TiB per rank is beyond any device's memory today, and larger
#: numbers would overflow the counts the backends hand to their libraries.
MAX_BYTES = 1 << 42


class SizeError(ValueError):
    """A `--sizes` value that cannot be used; the message names the bad part."""


def parse_size(text: str) -> int:
    """Parse one size such as `1024`, `64K`, `1.5M` or `2GiB` into bytes."""
    match = _SIZE_RE.match(text)
    if not match:
        raise SizeError(f"bad size {text!r}: expected bytes with an optional K, M, G or T suffix, e.g. 64K")
    number, unit = match.groups()
    nbytes = float(number) * _UNITS[unit.upper()]
    if not nbytes <= MAX_BYTES:  # also inf, from a number with hundreds of digits
        raise SizeError(f"bad size {text!r}: at most {MAX_BYTES >> 40} TiB per rank")
    if nbytes != int(nbytes):
        raise SizeError(f"bad size {text!r}: not a whole number of bytes")
    if nbytes <= 0:
        raise SizeError(f"bad size {text!r}: sizes must be positive")
    return int(nbytes)


def parse_sizes(spec: str, factor: float | None = None, step: str | int | None = None) -> list[int]:
    """Expand a `--sizes` spec into an ascending list of distinct byte sizes.

    `spec` is either a range `START-END` (stepped by multiplying by `factor`,
    default 2, or by adding `step` bytes) or a comma-separated list of sizes.
    """
    if factor is not None and step is not None:
        raise SizeError("give either --factor or --step, not both")
    spec = spec.strip()
    if not spec:
        raise SizeError("empty --sizes")
    if "," in spec:
        if factor is not None or step is not None:
            raise SizeError("--factor/--step apply to a range START-END, not to a list of sizes")
        return sorted({parse_size(part) for part in split_list(spec, "--sizes")})
    if "-" not in spec:
        if factor is not None or step is not None:
            raise SizeError("--factor/--step apply to a range START-END, not to a single size")
        return [parse_size(spec)]
    start_text, _, end_text = spec.partition("-")
    if not start_text.strip() or not end_text.strip():  # "-1": a negative size, or a range without an end
        raise SizeError(f"bad --sizes {spec!r}: sizes are positive numbers of bytes, and a range is START-END "
                        f"with both ends (e.g. 1K-1M)")
    start, end = parse_size(start_text), parse_size(end_text)
    if end < start:
        raise SizeError(f"bad size range {spec!r}: end {end} B is smaller than start {start} B")
    if step is not None:
        step_bytes = parse_size(str(step))
        count = (end - start) // step_bytes + 1
        _check_count(count, spec)
        return [start + i * step_bytes for i in range(count)]
    factor = 2.0 if factor is None else float(factor)
    if not 1.0 < factor <= 1e6:  # also rejects inf and nan
        raise SizeError(f"bad --factor {factor:g}: must be greater than 1 (and at most 1e6)")
    _check_count(int(math.log(end / start, factor)) + 1, spec)
    sizes, value = [], float(start)
    while round(value) <= end:
        sizes.append(int(round(value)))
        value *= factor
    return sorted(set(sizes))


def split_list(text: str, flag: str) -> list[str]:
    """The items of a comma list given on the command line (`--sizes 1K,4K`, `--gpus 8,16`), stripped. The
    one rule for every such list: an empty item (`1K,`, `1K,,2K`, `,`) is a typo, refused (SizeError, a
    ValueError), never skipped, so what runs is what was typed."""
    items = [part.strip() for part in text.split(",")]
    if not all(items):
        raise SizeError(f"bad {flag} {text!r}: an empty item in the comma list")
    return items


def _check_count(count: int, spec: str) -> None:
    if count > MAX_SIZES:
        raise SizeError(f"--sizes {spec!r} expands to {count} sizes (more than {MAX_SIZES}); use a larger step")


def format_size(nbytes: int) -> str:
    """Short human form with binary units: 1024 -> '1 KiB', 1572864 -> '1.5 MiB'."""
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:g} {unit}"
    return f"{nbytes} B"
