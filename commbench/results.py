"""Results: one flat, versioned record per point, written and flushed as it completes.

A run's JSON Lines file holds a `header` record (environment and configuration),
then one `result` record per collective x size x placement, then a `summary`
record. Every line is flushed when written, so a crash or a killed rank loses
nothing already measured. The CSV writer holds the same result fields, one row
each. The nccl-tests-style table on stdout is printed from the same records.
"""
from __future__ import annotations

import csv
import dataclasses
import json
import os
import platform
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from importlib import metadata
from typing import IO, Any

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class Result:
    """One measured (or predicted, proxy, train) point. Units live in the names."""
    collective: str
    backend: str  # commbench backend: torch, shm, p2p, sim, cupy, cuda
    library: str  # what ran the collective: gloo, nccl, or a schedule name
    device: str  # cpu or cuda
    dtype: str
    op: str | None
    root: int | None
    placement: str  # out-of-place or in-place
    world_size: int
    nnodes: int
    requested_nbytes: int
    nbytes: int  # size actually used (the larger per-rank buffer)
    count: int
    warmup: int
    iters: int
    time_us: float | None  # per-rank mean over iterations, aggregated across ranks; None: not timed
    algbw_gbps: float | None
    busbw_gbps: float | None
    p50_us: float | None  # percentiles of per-iteration times (each iteration aggregated across ranks)
    p90_us: float | None
    p99_us: float | None
    min_us: float | None
    max_us: float | None
    rank_agg: str
    wrong: int | None  # wrong elements summed over ranks; None when not checked
    algorithm: str | None = None  # the schedule that ran (custom backends); None for a library call
    steps: int | None = None  # rounds of that schedule
    telemetry: dict[str, float] | None = None  # --monitor: hardware averages over the timed calls (telemetry.py)
    kind: str = "measured"
    run_id: str = ""
    timestamp: float = field(default_factory=time.time)
    schema: int = SCHEMA_VERSION

    def to_dict(self) -> dict[str, Any]:
        return {"record": "result", **dataclasses.asdict(self)}


RESULT_FIELDS = [f.name for f in dataclasses.fields(Result)]


class ResultSink:
    """Writes header/result/summary records to JSON Lines and results to CSV, flushing each."""

    def __init__(self, json_path: str | None = None, csv_path: str | None = None):
        self._json: IO[str] | None = _open(json_path)
        self._csv_file: IO[str] | None = _open(csv_path)
        self._csv = csv.DictWriter(self._csv_file, RESULT_FIELDS) if self._csv_file else None
        if self._csv:
            self._csv.writeheader()
            self._csv_file.flush()

    def header(self, record: dict[str, Any]) -> None:
        self._write_json({"record": "header", "schema": SCHEMA_VERSION, **record})

    def result(self, result: Result) -> None:
        self._write_json(result.to_dict())
        if self._csv:
            row = dataclasses.asdict(result)
            row["telemetry"] = json.dumps(row["telemetry"]) if row["telemetry"] else None  # one JSON cell
            self._csv.writerow(row)
            self._csv_file.flush()

    def summary(self, record: dict[str, Any]) -> None:
        self._write_json({"record": "summary", "schema": SCHEMA_VERSION, **record})

    def write(self, record: dict[str, Any]) -> None:
        """Any other record (proxy steps and summaries): one JSON line, flushed."""
        self._write_json(record)

    def _write_json(self, record: dict[str, Any]) -> None:
        if self._json:
            self._json.write(json.dumps(record, allow_nan=False, default=str) + "\n")
            self._json.flush()
            os.fsync(self._json.fileno())

    def close(self) -> None:
        for handle in (self._json, self._csv_file):
            if handle:
                handle.close()


def _open(path: str | None) -> IO[str] | None:
    if not path:
        return None
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    return open(path, "w", encoding="utf-8", newline="")


def read_records(path: str) -> list[dict[str, Any]]:
    """All records of a JSON Lines results file (a truncated last line is skipped)."""
    records = []
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return records


# ---------------------------------------------------------------- environment


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _git_commit() -> str | None:
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        out = subprocess.run(["git", "-C", here, "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=5, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def local_environment(device_name: str) -> dict[str, Any]:
    """What this process runs on; the harness gathers it from every rank."""
    return {"host": socket.gethostname(), "pid": os.getpid(), "device": device_name, "cpu": _cpu_model(),
            "cpus": os.cpu_count()}


def software_versions() -> dict[str, Any]:
    versions: dict[str, Any] = {"python": platform.python_version(), "commbench": _version("commbench"),
                                "numpy": _version("numpy"), "torch": _version("torch"),
                                "cupy": _version("cupy-cuda12x") or _version("cupy-cuda13x") or _version("cupy"),
                                "commit": _git_commit(), "platform": platform.platform()}
    torch = sys.modules.get("torch")
    if torch is not None:
        versions["torch"] = torch.__version__
        versions["cuda"] = torch.version.cuda
        if torch.cuda.is_available():
            nccl = torch.cuda.nccl.version()
            versions["nccl"] = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)
            versions["driver"] = _nvidia_driver()
    return versions


def _nvidia_driver() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.splitlines()[0].strip() if out.stdout.strip() else None
