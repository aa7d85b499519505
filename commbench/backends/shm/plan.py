"""shm_plan: the native executor's machine-dependent choices, measured once per machine and cached (issue 38).

The fused reduce-and-push (shm_native.c reduce_push) has knobs whose best values depend on the machine:
how many bytes it reduces at a time before storing them (`block_bytes`), which of its two outputs use
non-temporal stores out of place (`nt`: both, out, push, none) and in place (`nt_in_place`, where the
output's lines were just read into the cache), and how far ahead it prefetches its inputs
(`prefetch_bytes`). On one 2-core AMD EPYC VM the 8 KiB block the code was tuned with ran the fused
operation at half a copy's speed, where 512 B-2 KiB ran it at a copy's (docs/performance.md, issue 38).

So, as FFTW's planner does, they are measured on first use: probe.py, in a process of its own, times the
candidates paired (two processes at once, as the two ranks run) and keeps one only where it beats the
incumbent. The result is cached beside the built library (plan.json, JSON only) with the machine's identity
(CPU model, core count, cache sizes, the library's hash): a change of any of them measures again, and so does
the first job that finds the machine quiet when the plan was measured on a busy one (the load per core is
kept). The header of every run says the values and where they came from (the table's `# shm plan:` line, the
JSON header's `shm_plan`).

$COMMBENCH_SHM_PLAN overrides: `default` (the built-in values, nothing measured) or any of
`block=1K,nt=both,nt_in_place=none,prefetch=0`; knobs it leaves out come from the cached or measured plan.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import subprocess
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from commbench.launch import rank_argv
from commbench.sizes import SizeError, format_size, parse_sizes

PLAN_VAR = "COMMBENCH_SHM_PLAN"
PLAN_FILE = "plan.json"
PARENT_VAR = "COMMBENCH_PROBE_PARENT"  # the pid of the rank that started the probe: the probe dies with it
FORMAT = 2  # of plan.json: a change measures again
NT_MODES = {"both": 4, "out": 2, "push": 3, "none": 1}  # shm_native.c fused_nt: 1 + STORE_OUT (1) | STORE_PUSH (2)
BLOCK_RANGE, PREFETCH_MAX = (64, 65536), 1 << 20  # FUSED_BLOCK_MAX in shm_native.c
PROBE_TIMEOUT_S = 60.0  # at most, and a third of the job's timeout: the other ranks wait for rank 0 meanwhile
MEASURE_MIN_TIMEOUT_S = 30.0  # a job with a shorter timeout runs the cached plan, else the built-in values
KEYS = {"block": "block_bytes", "nt": "nt", "nt_in_place": "nt_in_place", "prefetch": "prefetch_bytes"}
# A plan measured while more was runnable than there were cores is kept, and measured again by the first job
# that finds the machine quieter: on the CI VM a plan probed at load 5-18 kept `nt in place both, prefetch
# 1 KiB`, where the same machine idle chose `none, 0` (docs/performance.md, issue 38).
BUSY_LOAD_PER_CORE, QUIET_LOAD_PER_CORE = 1.0, 0.75


@dataclass(frozen=True)
class Plan:
    block_bytes: int = 8192  # the values before the planner (shm_native.c FUSED_BLOCK, both streaming, none)
    nt: str = "both"
    nt_in_place: str = "both"
    prefetch_bytes: int = 0

    def context_values(self) -> dict[str, int]:
        """The native.Context fields that carry this plan."""
        return {"fused_block": self.block_bytes, "prefetch_bytes": self.prefetch_bytes, "fused_nt": NT_MODES[self.nt],
                "fused_nt_in_place": NT_MODES[self.nt_in_place]}

    def text(self) -> str:
        return (f"block {format_size(self.block_bytes)}, nt {self.nt}, nt in place {self.nt_in_place}, "
                f"prefetch {format_size(self.prefetch_bytes)}")


@dataclass(frozen=True)
class Chosen:
    plan: Plan
    source: str  # measured, cached, override, default (and why)

    def fields(self) -> dict:
        return {**asdict(self.plan), "source": self.source}

    def note(self) -> str:
        overrides = "" if PLAN_VAR in self.source else f"; ${PLAN_VAR} overrides"
        return f"shm plan: {self.plan.text()} ({self.source}{overrides})"


def checked(values: dict) -> Plan:
    """A Plan from {field: value}; ValueError (one line) for a value out of range."""
    plan = replace(Plan(), **values)
    low, high = BLOCK_RANGE
    if not isinstance(plan.block_bytes, int) or not low <= plan.block_bytes <= high or plan.block_bytes % 64:
        raise ValueError(f"block {plan.block_bytes!r}: expected a multiple of 64 bytes from {low} to {high}")
    for name, mode in (("nt", plan.nt), ("nt_in_place", plan.nt_in_place)):
        if mode not in NT_MODES:
            raise ValueError(f"{name} {mode!r}: expected one of {', '.join(NT_MODES)}")
    if not isinstance(plan.prefetch_bytes, int) or not 0 <= plan.prefetch_bytes <= PREFETCH_MAX \
            or plan.prefetch_bytes % 64:
        raise ValueError(f"prefetch {plan.prefetch_bytes!r}: expected a multiple of 64 bytes from 0 to {PREFETCH_MAX}")
    return plan


def override(text: str | None = None) -> dict | None:
    """$COMMBENCH_SHM_PLAN as {field: value} (None: unset; every field: `default`); ValueError, one line."""
    text = (os.environ.get(PLAN_VAR, "") if text is None else text).strip()
    if not text:
        return None
    if text.lower() == "default":
        return asdict(Plan())
    values: dict = {}
    for item in text.split(","):
        key, _, value = item.partition("=")
        key, value = key.strip().lower(), value.strip()
        if KEYS.get(key) in values:
            raise ValueError(f"${PLAN_VAR}={text!r}: {key} given twice")
        if key not in KEYS or not value:
            raise ValueError(f"${PLAN_VAR}={text!r}: expected `default` or block=SIZE,nt=MODE,nt_in_place=MODE,"
                             "prefetch=SIZE")
        try:
            values[KEYS[key]] = value.lower() if key.startswith("nt") else _one_size(value)
        except (SizeError, IndexError) as exc:
            raise ValueError(f"${PLAN_VAR}: {key}={value!r} is not a size") from exc
    try:
        checked(values)
    except ValueError as exc:
        raise ValueError(f"${PLAN_VAR}: {exc}") from exc
    return values


def _one_size(text: str) -> int:
    """One size in bytes (0 or 0K alike), never a range or a list: SizeError otherwise."""
    if re.fullmatch(r"0+[kmgt]?", text.lower()):
        return 0
    sizes = parse_sizes(text)
    if len(sizes) != 1 or "-" in text or "," in text:
        raise SizeError(f"{text!r} is not one size")
    return sizes[0]


def identity(library: Path) -> dict:
    """What the best values depend on: the CPU, its cores and caches, the library's code."""
    model = ""
    try:
        model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                      if line.startswith("model name")), "")
    except OSError:
        pass
    caches = []
    for index in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            caches.append("L{} {} {}".format(*((index / name).read_text().strip() for name in ("level", "type",
                                                                                                "size"))))
        except OSError:
            continue
    return {"format": FORMAT, "cpu": model, "cores": os.cpu_count(), "caches": caches,
            "library": hashlib.sha256(library.read_bytes()).hexdigest()[:16]}


def load_per_core() -> float:
    """The 1-minute load average over the cores (0 where the system does not say)."""
    try:
        return os.getloadavg()[0] / (os.cpu_count() or 1)
    except OSError:
        return 0.0


def read_cached(path: Path, wanted: dict, again_if_quiet: bool = True) -> tuple[Plan, str] | None:
    """The cached plan and when it was measured, if it was measured for `wanted` (else None: measure again),
    and None too for a plan measured on a busy machine when this one is quiet (`again_if_quiet`)."""
    try:
        data = json.loads(path.read_text())
        if data.get("identity") != wanted:
            return None
        busy = float(data.get("load_per_core", 0.0))
        if again_if_quiet and busy > BUSY_LOAD_PER_CORE and load_per_core() <= QUIET_LOAD_PER_CORE:
            return None
        when = str(data.get("measured_utc", "?")) + cut_note(data.get("probe") or {})
        return checked(dict(data["plan"])), when + (f" at load {busy:.1f} per core" if busy > BUSY_LOAD_PER_CORE
                                                    else "")
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None  # unreadable, or written by another version: measured again


def cut_note(probe: dict) -> str:
    """Where the probe measured under the LLC's size (its time limit cut it: probe.shaped_to_budget), that said."""
    nbytes, llc = int(probe.get("nbytes_per_rank") or 0), int(probe.get("llc_bytes") or 0)
    if not nbytes or nbytes >= llc:
        return ""
    return f", probed at {format_size(nbytes)} per rank under the {format_size(llc)} LLC (its time limit)"


def measure(library: Path, timeout_s: float = PROBE_TIMEOUT_S) -> dict:
    """probe.py in a process of its own (no threads of this one forked; started as the ranks are,
    without the working directory on its path): its JSON result."""
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])),
           PARENT_VAR: str(os.getpid())}  # the probe dies with this process (probe.main)
    done = subprocess.run([*rank_argv("commbench.backends.shm.probe"), str(library), f"{timeout_s:g}"],
                          capture_output=True, text=True, timeout=timeout_s, env=env, check=False)
    if done.returncode:
        lines = (done.stderr or done.stdout).strip().splitlines()
        raise RuntimeError(f"the probe failed: {lines[-1][:200] if lines else done.returncode}")
    return json.loads(done.stdout)


def choose(library: Path, measure_fn=measure, job_timeout_s: float = 300.0) -> Chosen:
    """The plan for `library`'s build on this machine: the override, else cached, else measured now (under a
    lock: one job measures, the others read its result); a failed measurement gives the built-in values, and
    so does a job whose timeout (`job_timeout_s`) leaves no room for one."""
    given = override()
    if given is not None and set(given) == set(KEYS.values()):
        return Chosen(checked(given), f"override ${PLAN_VAR}")
    if job_timeout_s >= MEASURE_MIN_TIMEOUT_S:
        budget_s = min(PROBE_TIMEOUT_S, job_timeout_s / 3)
        base, source = _cached_or_measured(library, lambda path: measure_fn(path, budget_s), budget_s)
    else:
        try:
            found = read_cached(library.parent / PLAN_FILE, identity(library), again_if_quiet=False)
        except OSError:
            found = None
        base, source = (found[0], f"cached, measured {found[1]}") if found else \
            (Plan(), f"default: not measured (a timeout of {job_timeout_s:g} s leaves no room for it)")
    if given:
        return Chosen(checked({**asdict(base), **given}), f"{source}; {', '.join(sorted(given))} from ${PLAN_VAR}")
    return Chosen(base, source)


def _locked(lock, budget_s: float) -> bool:
    """Take the measuring lock, waiting at most `budget_s` (another job may be measuring: its time is not ours)."""
    deadline = time.monotonic() + budget_s
    while True:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.1)


def _cached_or_measured(library: Path, measure_fn, budget_s: float = PROBE_TIMEOUT_S) -> tuple[Plan, str]:
    try:  # whatever fails here, rank 0 answers (the other ranks wait for its plan)
        path, wanted = library.parent / PLAN_FILE, identity(library)
        found = read_cached(path, wanted)
        if found:
            return found[0], f"cached, measured {found[1]}"
        with open(library.parent / "plan.lock", "a") as lock:
            if not _locked(lock, budget_s):
                return Plan(), (f"default: not measured (another job was measuring for over {budget_s:g} s; "
                                "its plan is cached for later runs)")
            found = read_cached(path, wanted)  # another job measured it while this one waited
            if found:
                return found[0], f"cached, measured {found[1]}"
            busy = load_per_core()  # before the probe, whose two processes add their own
            result = measure_fn(library)
            plan = checked(dict(result["plan"]))
            stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            _write(path, {"identity": wanted, "plan": asdict(plan), "measured_utc": stamp,
                          "load_per_core": round(busy, 2), "probe": {k: v for k, v in result.items() if k != "plan"}})
            busy_note = f" at load {busy:.1f} per core (measured again when quieter)" \
                if busy > BUSY_LOAD_PER_CORE else ""
            return plan, f"measured {stamp}{cut_note(result)}{busy_note}"
    except subprocess.TimeoutExpired as exc:
        return Plan(), f"default: not measured (the probe took over {exc.timeout:g} s)"
    except (OSError, ValueError, KeyError, TypeError, RuntimeError) as exc:
        return Plan(), f"default: not measured ({str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__})"


def _write(path: Path, data: dict) -> None:
    temporary = path.with_name(f".{path.name}.{os.getpid()}")
    temporary.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(temporary, path)  # atomic: a reader sees the old file or the new one
