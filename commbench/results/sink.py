"""Writing records: ResultSink, the one writer of every record type (records.py), one JSON line
each, flushed and fsynced as it is written (a crash loses nothing already written), and results in
CSV too. A file that cannot be written is one OutputError line naming it."""
from __future__ import annotations

import contextlib
import csv
import dataclasses
import errno
import json
import math
import os
import uuid
from collections.abc import Iterable
from typing import IO, Any

from commbench.results.records import RESULT_FIELDS, SCHEMA_VERSION, Record, Result, SweepSummary


class OutputError(OSError):
    """An output file that cannot be opened or written (a full disk, no permission): one line,
    `cannot write PATH: reason`. An OSError, so whatever handles those handles it."""

    def __init__(self, path: str, exc: OSError):
        super().__init__(exc.errno, exc.strerror or str(exc), path)

    def __str__(self) -> str:
        return f"cannot write {self.filename}: {self.strerror}"


class ResultSink:
    """Writes records to JSON Lines (and results to CSV too), flushing and fsyncing each line.

    `append` adds to an existing file instead of starting a new one (the CSV header is then written
    only into an empty file). A write that fails (a full disk) raises OutputError; every line
    written before it stays in the file."""

    def __init__(self, json_path: str | None = None, csv_path: str | None = None, append: bool = False):
        mode = "a" if append else "w"
        self._json_path, self._csv_path = json_path, csv_path
        self._json: IO[str] | None = _open(json_path, mode)
        try:
            self._csv_file: IO[str] | None = _open(csv_path, mode)
        except OutputError:
            self.close()
            raise
        self._csv = csv.DictWriter(self._csv_file, RESULT_FIELDS) if self._csv_file else None
        if self._csv and self._csv_file.tell() == 0:
            with _writing(csv_path):
                self._csv.writeheader()
                self._csv_file.flush()

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
            with _writing(self._csv_path):
                self._csv.writerow(row)
                self._csv_file.flush()

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
            with _writing(self._json_path):
                self._json.write(line)
            if sync:
                self._sync()

    def _sync(self) -> None:
        if self._json:
            with _writing(self._json_path):
                self._json.flush()
                _fsync(self._json)

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


def _open(path: str | None, mode: str = "w") -> IO[str] | None:
    if not path:
        return None
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        if mode == "a" and os.path.isfile(path):  # a run killed mid-line: its fragment goes before this run's lines
            from commbench.files import drop_torn_line

            with open(path, "r+b") as handle:
                drop_torn_line(handle)
        return open(path, mode, encoding="utf-8", newline="")
    except OSError as exc:
        raise OutputError(path, exc) from exc


@contextlib.contextmanager
def _writing(path: str | None):
    """Turns an OSError while writing `path` into OutputError (one line naming the file)."""
    try:
        yield
    except OutputError:
        raise
    except OSError as exc:
        raise OutputError(path or "?", exc) from exc


def _fsync(handle: IO[str]) -> None:
    """fsync, where the file supports it (a pipe, /dev/null or a terminal does not: nothing to sync)."""
    try:
        os.fsync(handle.fileno())
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EROFS):
            raise
