"""The nccl-tests-style table on stdout and the progress line on stderr.

Columns and their order follow nccl-tests' output (size, count, type, redop, root,
then time/algbw/busbw/#wrong for out-of-place and for in-place) so that people
who read nccl-tests output every day can read this one without a legend.
"""
from __future__ import annotations

import sys
import time
from typing import IO

from commbench.results import Result


class Table:
    def __init__(self, placements: list[str], stream: IO[str] | None = None, progress: Progress | None = None,
                 show_algorithm: bool = False):
        self.placements = placements
        self.show_algorithm = show_algorithm  # schedule backends: which algorithm ran, and its steps
        self.stream = stream or sys.stdout
        self.progress = progress
        self.busbw_sum = 0.0
        self.busbw_points = 0
        self.wrong_total = 0

    def _print(self, line: str) -> None:
        if self.progress:
            self.progress.clear()  # the progress line shares the terminal; never print over it
        print(line, file=self.stream, flush=True)

    def comment(self, line: str) -> None:
        self._print(f"# {line}" if line else "#")

    def header(self, collective: str) -> None:
        self._print("#")
        self._print(f"# Collective: {collective}")
        self.busbw_sum, self.busbw_points, self.wrong_total = 0.0, 0, 0  # the footer covers one collective
        title = "".join(f"{p:^38s}" for p in self.placements)
        self._print(f"#{'':53s}{title}".rstrip())
        cols = "".join(f"{'time':>9s} {'algbw':>8s} {'busbw':>8s} {'#wrong':>8s}  " for _ in self.placements)
        units = "".join(f"{'(us)':>9s} {'(GB/s)':>8s} {'(GB/s)':>8s} {'':>8s}  " for _ in self.placements)
        algo = f"{'algorithm':>12s}" if self.show_algorithm else ""
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
                cells.append(f"{'N/A':>9s} {'N/A':>8s} {'N/A':>8s} {'N/A':>8s}  ")
                continue
            wrong = "N/A" if result.wrong is None else str(result.wrong)
            if result.time_us is None:  # not timed (sim without a cost model)
                cells.append(f"{'n/m':>9s} {'-':>8s} {'-':>8s} {wrong:>8s}  ")
            else:
                cells.append(f"{_fmt_time(result.time_us):>9s} {result.algbw_gbps:8.2f} "
                             f"{result.busbw_gbps:8.2f} {wrong:>8s}  ")
                self.busbw_sum += result.busbw_gbps
                self.busbw_points += 1
            self.wrong_total += result.wrong or 0
        algo = f"{first.algorithm or '-'}/{first.steps or 0}" if self.show_algorithm else ""
        self._print(f" {first.nbytes:12d} {first.count:13d} {dtype_label:>9s} {op:>6s} {root:5d}    {''.join(cells)}"
                    f"{algo:>12s}".rstrip())

    def footer(self, checked: bool) -> None:
        if checked:
            self._print(f"# Out of bounds values : {self.wrong_total} {'OK' if self.wrong_total == 0 else 'FAILED'}")
        average = f"{self.busbw_sum / self.busbw_points:.4g} GB/s" if self.busbw_points else "n/m"
        self._print(f"# Avg bus bandwidth    : {average}")
        self._print("#")


def _fmt_time(time_us: float) -> str:
    return f"{time_us:.1f}" if time_us >= 100 else f"{time_us:.2f}"


class Progress:
    """A one-line progress indicator on stderr, drawn only when stderr is a terminal."""

    def __init__(self, total: int, stream: IO[str] | None = None, enabled: bool | None = None):
        self.total, self.done = total, 0
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.started = time.monotonic()
        self._width = 0

    def update(self, label: str) -> None:
        if not self.enabled:
            return
        elapsed = time.monotonic() - self.started
        bar_len = 24
        filled = int(bar_len * self.done / max(self.total, 1))
        line = f"\r[{'#' * filled}{'.' * (bar_len - filled)}] {self.done}/{self.total} {elapsed:5.0f}s {label}"
        self._width = max(self._width, len(line))
        self.stream.write(line.ljust(self._width))
        self.stream.flush()

    def advance(self) -> None:
        self.done += 1

    def clear(self) -> None:
        if self.enabled and self._width:
            self.stream.write("\r" + " " * self._width + "\r")
            self.stream.flush()
            self._width = 0

    close = clear
