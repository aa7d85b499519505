"""Read a Chrome-trace JSON file (PyTorch's profiler writes one) without holding it in memory: the
top-level object's keys one at a time, and the `traceEvents` array one event at a time.

The file is read in chunks of CHUNK_CHARS; at most one chunk plus one event is held, so a trace of
any size is read in memory bounded by its largest event (MAX_VALUE_CHARS: a value still unparsed that
far is a broken file, said so, not read to its end). A value longer than a chunk is decoded again only
after the unread window has doubled, so a long value costs a few decodes, not one per chunk (a 60 MB
value was 60 decodes of up to 60 MB). A `.gz` file is read through gzip. Only a regular file is opened
(files.open_regular: a named pipe would wait for a writer forever). A file that ends before its object
does (a job killed while it wrote its trace) raises TraceError.
"""
from __future__ import annotations

import gzip
import io
import json
import re
from collections.abc import Iterator
from typing import Any, TextIO

from commbench.files import UnreadableFile, open_regular
from commbench.proxies.traces.calls import TraceError

CHUNK_CHARS = 1 << 20
MAX_VALUE_CHARS = 64 << 20  # one event or top-level value; past it unparsed, the file is not JSON
EVENTS_KEY = "traceEvents"
_PAST_SPACE = re.compile(r"\S")
_PAST_COMMAS = re.compile(r"[^\s,]")


def open_text(path: str) -> TextIO:
    """A trace file as text, gunzipped when it is gzip (by its magic bytes, not its name); TraceError for a
    file that is not regular (a FIFO, a device, a directory) or cannot be opened."""
    try:
        raw = open_regular(path)
    except UnreadableFile as exc:
        raise TraceError(str(exc)) from None
    if raw.peek(2)[:2] == b"\x1f\x8b":
        return io.TextIOWrapper(_OwnGzip(raw), encoding="utf-8", errors="replace")
    return io.TextIOWrapper(raw, encoding="utf-8", errors="replace")


class _OwnGzip(gzip.GzipFile):
    """A gzip stream over a file it closes with itself (GzipFile leaves a file object it was given open)."""

    def __init__(self, raw):
        super().__init__(fileobj=raw, mode="rb")
        self.raw = raw

    def close(self) -> None:
        try:
            super().close()
        finally:
            self.raw.close()


class _Reader:
    """A text stream with a window of unread characters."""

    def __init__(self, handle: TextIO, origin: str):
        self.handle, self.origin = handle, origin
        self.text, self.pos = "", 0
        self.decoder = json.JSONDecoder()

    def _more(self, chars: int = CHUNK_CHARS) -> bool:
        try:
            chunk = self.handle.read(chars)
        except (OSError, EOFError) as exc:  # a truncated gzip stream
            raise TraceError(f"{self.origin}: cannot be read to its end ({exc})") from exc
        if not chunk:
            return False
        self.text = self.text[self.pos:] + chunk
        self.pos = 0
        return True

    def skip(self, also: str = "") -> str:
        """Skip whitespace (and commas, with also=","); the next character, or "" at the end."""
        pattern = _PAST_COMMAS if also else _PAST_SPACE
        while True:
            found = pattern.search(self.text, self.pos)
            if found:
                self.pos = found.start()
                return self.text[self.pos]
            self.pos = len(self.text)
            if not self._more():
                return ""

    def expect(self, char: str) -> None:
        if self.skip() != char:
            raise TraceError(f"{self.origin}: not a Chrome trace (JSON object) or cut short: expected {char!r}")
        self.pos += 1

    def value(self) -> Any:
        """Decode the next JSON value, reading more of the file until it is whole."""
        self.skip()
        while True:
            try:
                value, end = self.decoder.raw_decode(self.text, self.pos)
            except RecursionError:  # arrays or objects nested ~1,000 deep: no trace nests so
                raise TraceError(f"{self.origin}: a JSON value nested too deep to be a trace's") from None
            except json.JSONDecodeError as exc:
                if len(self.text) - self.pos > MAX_VALUE_CHARS:  # no event is this long: a broken file
                    raise TraceError(f"{self.origin}: not valid JSON ({exc.msg}, {MAX_VALUE_CHARS >> 20} MiB "
                                     f"after where a value starts)") from exc
                window = len(self.text) - self.pos  # read as much again (up to the bound): a few decodes in all
                if not self._more(max(CHUNK_CHARS, min(window, MAX_VALUE_CHARS + 1 - window))):
                    raise TraceError(f"{self.origin}: the file ends inside a JSON value (truncated, or not valid "
                                     f"JSON: {exc.msg})") from exc
                continue
            if end == len(self.text) and self._more():  # a number may go on in the next chunk
                continue
            self.pos = end
            return value


def read_chrome_trace(handle: TextIO, origin: str, array_key: str = EVENTS_KEY) -> Iterator[tuple[str, Any]]:
    """(key, value) for each top-level key; for `array_key` (traceEvents; an execution trace's nodes),
    (array_key, element) for each object in it in turn."""
    reader = _Reader(handle, origin)
    reader.expect("{")
    while True:
        char = reader.skip(",")
        if char == "}":
            return
        if char != '"':
            raise TraceError(f"{origin}: the file ends before its trace object does (truncated?)" if not char else
                             f"{origin}: not a Chrome trace: unexpected {char!r} at the top level")
        key = reader.value()
        reader.expect(":")
        if key != array_key:
            yield key, reader.value()
            continue
        reader.expect("[")
        while True:
            char = reader.skip(",")
            if char == "]":
                reader.pos += 1
                break
            if not char:
                raise TraceError(f"{origin}: the file ends inside {array_key} (truncated?)")
            event = reader.value()
            if isinstance(event, dict):
                yield array_key, event
