"""The nccl-tests-style table on stdout and the progress line on stderr.

Columns and their order follow nccl-tests' output (size, count, type, redop, root,
then time/algbw/busbw/#wrong for out-of-place and for in-place) so that people
who read nccl-tests output every day can read this one without a legend.
"""
from __future__ import annotations

import math
import os
import sys
import threading
import time
from typing import IO, Callable

import numpy as np

from commbench.eta import Estimate, Forecast, PointTime
from commbench.results import CALIBRATED_ESTIMATE, PROVENANCE_LABELS, Result

NOISY_P99_OVER_P50 = 2.0  # a point whose p99 is more than this many times its p50 is marked noisy
NOISY_MARK = "~"
SPREAD = "p50_us, p99_us and iteration_times_us"  # the figures of a noisy row's spread, kept in every record


class Table:
    def __init__(self, placements: list[str], stream: IO[str] | None = None, progress: Progress | None = None,
                 show_algorithm: bool = False, marks_in_rows: bool = True, json_kept: bool = True,
                 show_p99: bool = False, timestamps: bool = False, csv_kept: bool = False,
                 keep_flag: str = "--json FILE", nccl_tests: bool = False):
        self.placements = placements
        self.show_p99 = show_p99  # nccl-tests -I: the p99 of the iterations beside each time
        self.timestamps = timestamps  # nccl-tests -S: when the row's timed calls began (UTC), at its end
        self.timed_as = "mean"  # the statistic of the rows' times (their records' `stat`), which the footer names
        self.noisy_rows = 0
        self.show_algorithm = show_algorithm  # schedule backends: which algorithm ran, and its steps
        # nccl-tests' parsers count 13 columns: the noisy mark only in the footer then (the JSON has every figure)
        self.marks_in_rows = marks_in_rows
        self.json_kept = json_kept  # --json given: the footer may point at the records' figures
        self.csv_kept = csv_kept  # --csv given: its rows hold them too
        self.keep_flag = keep_flag  # the flag that keeps them (`commbench nccl-tests`: -J FILE)
        self.nccl_tests = nccl_tests  # `commbench nccl-tests`: the average as nccl-tests prints it (%g, no unit)
        self.stream = stream or sys.stdout
        self.progress = progress
        self.busbw_sum = 0.0
        self.busbw_points = 0
        self.wrong_total = 0

    def _print(self, line: str) -> None:
        if self.progress:
            with self.progress.lock:  # the progress line shares the terminal; never print over it
                self.progress.clear()
                self._write(line)
        else:
            self._write(line)

    def _write(self, line: str) -> None:
        try:
            print(line, file=self.stream, flush=True)
        except BrokenPipeError:  # `| head` closed the pipe: go on quietly, as other tools do (JSON still written)
            self.stream = _silence(self.stream)

    def comment(self, line: str) -> None:
        self._print(f"# {line}" if line else "#")

    def header(self, collective: str) -> None:
        self._print("#")
        self._print(f"# Collective: {collective}")
        self.busbw_sum, self.busbw_points, self.wrong_total = 0.0, 0, 0  # the footer covers one collective
        p99, p99_unit = (f" {'p99':>9s}", f" {'(us)':>9s}") if self.show_p99 else ("", "")
        title = "".join(f"{p:^{38 + len(p99)}s}" for p in self.placements)
        self._print(f"#{'':53s}{title}".rstrip())
        cols = "".join(f"{'time':>9s}{p99} {'algbw':>8s} {'busbw':>8s} {'#wrong':>8s}  " for _ in self.placements)
        units = "".join(f"{'(us)':>9s}{p99_unit} {'(GB/s)':>8s} {'(GB/s)':>8s} {'':>8s}  " for _ in self.placements)
        algo = f"{'algorithm':>12s}" if self.show_algorithm else ""
        algo += f"  {'timestamp (UTC)':>20s}" if self.timestamps else ""
        self._print(f"#{'size':>12s} {'count':>13s} {'type':>9s} {'redop':>6s} {'root':>5s}    {cols}{algo}".rstrip())
        self._print(f"#{'(B)':>12s} {'(elements)':>13s} {'':>9s} {'':>6s} {'':>5s}    {units}".rstrip())

    def row(self, results: dict[str, Result | None], dtype_label: str) -> None:
        """One size: `results` maps placement -> Result, or None where it did not run (N/A)."""
        first = next(r for r in results.values() if r is not None)
        op = first.op or "none"
        root = first.root if first.root is not None else -1
        cells = []
        for placement in self.placements:
            result = results.get(placement)
            if result is None:
                cells.append(f"{'N/A':>9s}{' N/A'.rjust(10) if self.show_p99 else ''} {'N/A':>8s} {'N/A':>8s} "
                             f"{'N/A':>8s}  ")
                continue
            wrong = "N/A" if result.wrong is None else str(result.wrong)
            p99 = f" {_fmt_time(result.p99_us) if result.p99_us is not None else '-':>9s}" if self.show_p99 else ""
            if result.time_us is None:  # not timed (sim without a cost model)
                cells.append(f"{'n/m':>9s}{p99} {'-':>8s} {'-':>8s} {wrong:>8s}  ")
            else:
                time_us, algbw, busbw = result.time_us, result.algbw_gbps, result.busbw_gbps  # as the record holds
                cells.append(f"{_fmt_time(time_us):>9s}{p99} {algbw:8.2f} {busbw:8.2f} {wrong:>8s}  ")
                self.busbw_sum += busbw
                self.timed_as = "predicted" if result.kind == "predicted" else result.stat
                self.busbw_points += 1
            self.wrong_total += result.wrong or 0
        algo = f"{first.algorithm or '-'}/{first.steps or 0}" if self.show_algorithm else ""
        if self.timestamps:
            started = first.timed_start if first.timed_start is not None else first.timestamp
            stamp = time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(started))
            algo = (f"{algo:>12s}" if self.show_algorithm else "") + f"  {stamp:>20s}"
        noisy = any(r is not None and is_noisy(r) for r in results.values())
        self.noisy_rows += noisy
        mark = f" {NOISY_MARK}" if noisy and self.marks_in_rows else ""
        if first.interval_us:  # a prediction: its 80% interval and where it comes from (docs/model.md)
            label = PROVENANCE_LABELS.get(first.interval_source or "", "")
            mark += f"  [{_fmt_time(first.interval_us[0]).strip()}-{_fmt_time(first.interval_us[1]).strip()}]"
            mark += f" {label}" if label else ""
        if first.raw_time_us is not None and first.estimate == CALIBRATED_ESTIMATE:  # the model's own, labelled
            mark += f"  raw {_fmt_time(first.raw_time_us).strip()}"
        self._print(f" {first.nbytes:12d} {first.count:13d} {dtype_label:>9s} {op:>6s} {root:5d}    {''.join(cells)}"
                    f"{algo:>12s}".rstrip() + mark)

    def footer(self, checked: bool) -> None:
        if checked:
            self._print(f"# Out of bounds values : {self.wrong_total} {'OK' if self.wrong_total == 0 else 'FAILED'}")
        average = self.busbw_sum / self.busbw_points if self.busbw_points else None
        if average is None:
            shown = "n/m"
        elif self.nccl_tests:  # scripts read nccl-tests' last field: the number alone, as its %g prints it
            shown = f"{average:g}"
        else:
            shown = f"{_fixed(average)} GB/s (busbw of the {self.timed_as} times)"
        self._print(f"# Avg bus bandwidth    : {shown}")
        if self.noisy_rows:
            marked = f"{NOISY_MARK} : " if self.marks_in_rows else ""
            self._print(f"# {marked}{self.noisy_rows} row(s) with p99 > {NOISY_P99_OVER_P50:g} x p50: the time "
                        f"varied between iterations ({self._spread_kept()})")
            self.noisy_rows = 0
        self._print("#")

    def _spread_kept(self) -> str:
        """Where the noisy rows' spread is, or the flag that would keep it."""
        files = " and ".join(name for name, kept in (("the JSON", self.json_kept), ("the CSV", self.csv_kept)) if kept)
        return f"{SPREAD} in {files}" if files else f"add {self.keep_flag} to keep {SPREAD} in the JSON"


def nccl_tests_devices(environment: list[dict], world: int) -> list[str]:
    """nccl-tests' "Using devices" block, a line a rank as its src/common.cu prints them (rank, group, pid,
    host, device, bus id, model); a CPU rank names its CPU. A process that holds several ranks (sim, cuda's
    virtual and peer modes) gives each of them its line."""
    lines = ["Using devices"]
    for rank in range(world):
        env = environment[rank] if len(environment) == world else environment[0]
        gpus = env.get("gpus") or []
        if gpus:
            gpu = gpus[rank % len(gpus)]
            device, bus, model = f"{gpu.get('index', rank):2d}", gpu.get("bus_id", "?"), gpu.get("model", "?")
        else:
            device, bus, model = "cpu", "-", env.get("cpu") or "CPU"
        lines.append(f" Rank {rank:2d} Group  0 Pid {env.get('pid', 0):6d} on {env.get('host', '?'):>10s} device "
                     f"{device} [{bus}] {model}")
    return lines


def is_noisy(result: Result) -> bool:
    """p99 more than NOISY_P99_OVER_P50 times p50: the mean hides a spread worth a look."""
    return bool(result.p50_us and result.p99_us and result.p99_us > NOISY_P99_OVER_P50 * result.p50_us)


def _fixed(value: float) -> str:
    """Four significant digits, never in exponent notation (7.597e-05 -> 0.00007597)."""
    return np.format_float_positional(value, precision=4, unique=False, fractional=False, trim="-")


def _silence(stream: IO[str]) -> IO[str]:
    """After a closed pipe: further output (and the flush at exit) goes to /dev/null."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), stream.fileno())
    except (OSError, ValueError):
        pass
    return open(os.devnull, "w")


def _fmt_time(time_us: float) -> str:
    return f"{time_us:.1f}" if time_us >= 100 else f"{time_us:.2f}"


class Progress:
    """A one-line progress bar with an ETA on stderr when it is a terminal; elsewhere (a log, CI)
    one plain line every LOG_INTERVAL_S seconds, so a long run is never silent. `enabled=False`
    draws nothing at all (ranks other than 0).

    In a real run (`enabled` None: decided by the stream) a heartbeat thread keeps the line alive while
    one point runs long (a 256 MiB allreduce of 50 iterations): the bar's clock ticks every second and
    the log gets its line every LOG_INTERVAL_S. `nbytes`, one per point in run order, makes the ETA count
    the sizes still to come (commbench/eta.py), not the points: the last points of 1K-1G hold most of
    the bytes and most of the time; `calls_for` (the calls a point makes at a call's time) lets it count
    them from the time of one call that each point measured (`advance(call_us, calls)`). An ETA that
    rests on sizes beyond any cost per byte seen yet is a lower bound, and is printed as one."""

    LOG_INTERVAL_S = 5.0
    BEAT_S = 1.0

    def __init__(self, total: int, stream: IO[str] | None = None, enabled: bool | None = None,
                 clock: Callable[[], float] = time.monotonic, unit: str = "points",
                 nbytes: list[int] | None = None, calls_for: Callable[[float], int] | None = None):
        self.total, self.done, self.clock, self.unit = total, 0, clock, unit
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.logging = enabled is None and not self.enabled
        self.started = clock()
        self._logged = self.started
        self._width = 0
        self.nbytes = list(nbytes) if nbytes is not None and len(nbytes) == total else None
        self.calls_for = calls_for
        self.points: list[PointTime] = []  # each point done: its size, wall time, calls and time of one call
        self._forecast: tuple[int, Forecast] | None = None  # fitted to the first n points (refitted as they come)
        self._point: tuple[int, float] | None = None  # the point running: (its index, when it began)
        self.label = ""
        self.lock = threading.RLock()  # the heartbeat and the table print to one terminal
        self._stop = threading.Event()
        if enabled is None and clock is time.monotonic and (self.enabled or self.logging):  # a real run's
            threading.Thread(target=self._beat, name="commbench-progress", daemon=True).start()

    def eta_s(self, now: float) -> float | None:
        estimate = self.eta(now)
        return None if estimate is None else estimate.seconds

    def eta(self, now: float) -> Estimate | None:
        """Seconds left (None before the first point is done): the points still to come, each at its
        size's estimated time, plus what the running point has left of its estimate."""
        if not self.done:
            return None
        if self.nbytes is None or not self.points:
            return Estimate((now - self.started) / self.done * (self.total - self.done), False)
        if self._forecast is None or self._forecast[0] != len(self.points):
            self._forecast = (len(self.points), Forecast.of(self.points, self.calls_for))
        forecast = self._forecast[1]
        to_come = [forecast.at(n) for n in self.nbytes[self.done + 1:]]
        left, at_least = sum(e.seconds for e in to_come), any(e.at_least for e in to_come)
        if self.done < self.total:
            running = forecast.at(self.nbytes[self.done])
            began = self._point[1] if self._point and self._point[0] == self.done else now
            left += max(0.0, running.seconds - (now - began))
            at_least = at_least or running.at_least
        return Estimate(left, at_least)

    def update(self, label: str) -> None:
        """Point `self.done` begins (`label` names it)."""
        with self.lock:
            self._point, self.label = (self.done, self.clock()), label
            self._show(self._point[1])

    def _show(self, now: float) -> None:
        eta = self.eta(now)
        eta_text = f" ETA {'at least ' if eta.at_least else ''}{eta.seconds:.0f}s" if eta is not None else ""
        if self.logging and now - self._logged >= self.LOG_INTERVAL_S:
            self._logged = now
            self.stream.write(f"commbench: {self.done}/{self.total} {self.unit}, {now - self.started:.0f} s{eta_text}: "
                              f"{self.label}\n")
            self.stream.flush()
        if not self.enabled:
            return
        bar_len = 24
        filled = int(bar_len * self.done / max(self.total, 1))
        bar = f"[{'#' * filled}{'.' * (bar_len - filled)}]"
        line = f"\r{bar} {self.done}/{self.total} {now - self.started:5.0f}s{eta_text} {self.label}"
        self._width = max(self._width, len(line))
        self.stream.write(line.ljust(self._width))
        self.stream.flush()

    def beat(self) -> None:
        """The heartbeat: the line redrawn (terminal) or logged when LOG_INTERVAL_S passed without one."""
        with self.lock:
            if self.label and not self._stop.is_set():
                self._show(self.clock())

    def _beat(self) -> None:
        while not self._stop.wait(self.BEAT_S):
            try:
                self.beat()
            except (OSError, ValueError):  # the stream closed under us: nothing more to say
                return

    def advance(self, call_us: float | None = None, calls: int = 0) -> None:
        """The running point is done: its time (and, when given, its `calls` at `call_us` each) is kept for
        the ETA of the sizes to come."""
        with self.lock:
            if self._point is not None and self._point[0] == self.done and self.nbytes is not None:
                self.points.append(PointTime(self.nbytes[self.done], self.clock() - self._point[1], calls,
                                             call_us if call_us is not None and math.isfinite(call_us) else None))
            self._point = None
            self.done += 1

    def clear(self) -> None:
        with self.lock:
            if self.enabled and self._width:
                self.stream.write("\r" + " " * self._width + "\r")
                self.stream.flush()
                self._width = 0

    def close(self) -> None:
        self._stop.set()
        self.clear()
