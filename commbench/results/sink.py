"""Writing records: ResultSink, the one writer of every record type (records.py), one JSON line
each, flushed and fsynced as it is written (a crash loses nothing already written), and results in
CSV too. A file that cannot be written is one OutputError line naming it, and a write that fails part
way (a full disk) leaves no part of its line: the file is cut back to its last whole line (`_Lines`),
so a file given to --append is left as it was before the run, with every line the run wrote whole."""
from __future__ import annotations

import csv
import dataclasses
import errno
import json
import math
import os
import stat
import uuid
from collections.abc import Iterable
from typing import IO, Any

from commbench.errors import OutputError  # noqa: F401 - this module's error, as commbench.results names it
from commbench.results.records import RESULT_FIELDS, SCHEMA_VERSION, Record, Result, SweepSummary


class _Lines:
    """An output file written a whole line at a time, without a buffer of its own: a line is on its way to
    the disk once `write` returns. A write or an fsync that fails (a full disk) cuts a regular file back to
    its last whole line (`whole`: what was there before, then each line written since) and raises
    OutputError; a file that is not regular (a pipe, /dev/null) is left as it is."""

    def __init__(self, path: str, mode: str):
        self.path = path
        self.raw = open(path, mode + "b", buffering=0)  # noqa: SIM115 - closed by close()
        info = os.fstat(self.raw.fileno())
        self.regular = stat.S_ISREG(info.st_mode)
        self.whole = self.synced = info.st_size if self.regular and mode == "a" else 0

    @property
    def closed(self) -> bool:
        return self.raw.closed

    def tell(self) -> int:
        return self.whole

    def write(self, text: str) -> int:
        data = text.encode("utf-8", "backslashreplace")  # a lone surrogate a file held: its escape, not an error
        try:
            written = 0
            while written < len(data):
                step = _write_some(self.raw.fileno(), data[written:])
                if step <= 0:  # a file that takes nothing more and says no error: full, as far as it is concerned
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                written += step
        except OSError as exc:
            self._cut(self.whole)
            raise OutputError(self.path, exc) from exc
        self.whole += len(data)
        return len(text)

    def flush(self) -> None:
        """Nothing is held here (every write went to the file at once)."""

    def sync(self) -> None:
        """fsync: the lines written so far are on the disk. Where that fails, what it could not write since the last
        fsync that held is cut off (the lines since then included: their state on the disk is unknown)."""
        try:
            _fsync(self.raw)
        except OSError as exc:
            self._cut(self.synced)
            raise OutputError(self.path, exc) from exc
        self.synced = self.whole

    def _cut(self, size: int) -> None:
        if not self.regular:
            return
        try:
            os.ftruncate(self.raw.fileno(), size)
            self.whole = self.synced = size
        except OSError:
            pass  # nothing more can be done for it here: the caller reports the write that failed

    def close(self) -> None:
        self.raw.close()


def _write_some(fd: int, data: bytes) -> int:
    """os.write (apart, so that a test can make it fail part way, as a disk that fills mid-line does)."""
    return os.write(fd, data)


class ResultSink:
    """Writes records to JSON Lines (and results to CSV too), fsyncing each line.

    `append` adds to an existing file instead of starting a new one (the CSV header is then written
    only into an empty file). A write that fails (a full disk) raises OutputError; every line
    written before it stays in the file, and nothing of the line that failed (_Lines)."""

    def __init__(self, json_path: str | None = None, csv_path: str | None = None, append: bool = False):
        mode = "a" if append else "w"
        self._json_path, self._csv_path = json_path, csv_path
        self._json: _Lines | None = _open(json_path, mode)
        try:
            self._csv_file: _Lines | None = _open(csv_path, mode)
        except OutputError:
            self.close()
            raise
        self._csv = csv.DictWriter(self._csv_file, RESULT_FIELDS) if self._csv_file else None
        if self._csv and self._csv_file.tell() == 0:
            self._csv.writeheader()

    def __enter__(self) -> ResultSink:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def header(self, record: dict[str, Any]) -> None:
        """The run's first line: free-form environment and configuration (docs/results.md)."""
        self._write_json({"record": "header", "schema": SCHEMA_VERSION, **record})

    def result(self, result: Result) -> None:
        self._write_json(result.to_dict())
        if self._csv:
            row = dataclasses.asdict(result)
            for name in ("telemetry", "iteration_times_us", "skipped_times_us", "rank_times_us"):  # one JSON cell each
                row[name] = json.dumps(row[name]) if row[name] else None
            self._csv.writerow(row)  # one write of the whole row (csv's writer): all of it or none

    def summary(self, summary: SweepSummary | dict[str, Any]) -> None:
        """The sweep's last line; a dict is written as given (the form callers used before SweepSummary)."""
        if isinstance(summary, SweepSummary):
            self.write(summary)
        else:
            self._write_json({"record": "summary", "schema": SCHEMA_VERSION, **summary})

    def write(self, record: Record) -> None:
        """Any record: one JSON line, flushed (a Result goes to the CSV file too)."""
        if isinstance(record, Result):
            self.result(record)
        else:
            self._write_json(record.to_dict())

    def write_all(self, records: Iterable[Record]) -> None:
        """Records computed all at once (compare, predict-scaling): written, then flushed and fsynced once."""
        for record in records:
            if isinstance(record, Result):
                self.result(record)
            else:
                self._write_json(record.to_dict(), sync=False)
        self._sync()

    def write_free_form(self, records: Iterable[dict[str, Any]]) -> None:
        """Records already in their JSON form, without a record type here (check's rows and summary: an
        output for people and scripts, no schema): written, then flushed and fsynced once. As in every record,
        a figure that is not finite (an error against a measured time of ~0) is written null."""
        for record in records:
            self._write_json(record, sync=False)
        self._sync()

    def _write_json(self, record: dict[str, Any], sync: bool = True) -> None:
        if self._json:
            line = json.dumps(_finite(record), allow_nan=False, default=str) + "\n"  # JSON has no infinity
            self._json.write(line)
            if sync:
                self._sync()

    def _sync(self) -> None:
        if self._json:
            self._json.sync()

    def close(self) -> None:
        """Close the files; a buffer that cannot be flushed any more (a full disk) raises OutputError once."""
        failure = None
        for handle, path in ((self._json, self._json_path), (self._csv_file, self._csv_path)):
            if handle and not handle.closed:
                try:
                    handle.close()
                except OSError as exc:
                    failure = failure or OutputError(path, exc)
        if failure:
            raise failure


def _finite(value: Any) -> Any:
    """`value` with every float that is not finite, at any depth of dicts and lists, as None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def new_run_id() -> str:
    """12 hex digits naming one run, repeated in each of its records."""
    return uuid.uuid4().hex[:12]


def append_record(path: str, record: Record) -> None:
    """Add one record to the end of an existing JSON Lines file (e.g. `validate` after a proxy run)."""
    with ResultSink(path, append=True) as sink:
        sink.write(record)


CSV_HEADER = ",".join(RESULT_FIELDS)  # the first line of every results CSV this version writes


def append_refusal(path: str, csv_file: bool) -> str | None:
    """Why this run's rows cannot be added to the existing, non-empty `path` (one line), or None. --append
    adds to a results file: a CSV must start with this version's header (rows under another header, another
    tool's or an older commbench's with other columns, would be read under the wrong names), a JSON Lines
    file with a record (a JSON object naming its `record` type). Only the first line is read."""
    from commbench.files import MAX_LINE_BYTES, NotJson, UnreadableFile, open_regular, parse_json

    try:
        with open_regular(path) as handle:
            first = handle.readline(MAX_LINE_BYTES + 1)
    except (UnreadableFile, OSError):
        return None  # the writability check that follows names the fault
    if csv_file:
        if first.rstrip(b"\r\n") == CSV_HEADER.encode():
            return None
        return ("its first line is not the header of commbench's results CSV (another tool's file, or one written "
                "by another commbench version with other columns)")
    try:
        record = parse_json(first.strip()) if first.strip() else None
    except NotJson:
        record = None
    if isinstance(record, dict) and isinstance(record.get("record"), str):
        return None
    return "it holds no commbench records (its first line is not a JSON record)"


def _open(path: str | None, mode: str = "w") -> _Lines | None:
    if not path:
        return None
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        if mode == "a" and os.path.isfile(path):  # a run killed mid-line: its fragment goes before this run's lines
            from commbench.files import drop_torn_line

            with open(path, "r+b") as handle:
                drop_torn_line(handle)
        return _Lines(path, mode)
    except OSError as exc:
        raise OutputError(path, exc) from exc


def _fsync(handle: IO[bytes]) -> None:
    """fsync, where the file supports it (a pipe, /dev/null or a terminal does not: nothing to sync)."""
    try:
        os.fsync(handle.fileno())
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EROFS):
            raise
