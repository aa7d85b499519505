"""Reading input files safely: regular files only (a FIFO would block, a device like /dev/zero
would never end), a bounded size where the whole file is read, and one error a command turns
into one line. Reading a file never runs code: the readers parse JSON, nothing else. What a file holds
is printed back escaped (`shown`): a file cannot forge commbench's output."""
from __future__ import annotations

import json
import os
import stat
import sys
from typing import Any, BinaryIO

# the largest figure a results or hardware file may hold (a poor fit writes 3e16 GB/s): no time, rate or size
# comes near, and its square (a fit's sums) stays finite
MAX_FIGURE = 1e30
MAX_LINE_BYTES = 64 << 20  # one JSON Lines record: the largest a results file writes is far below


class UnreadableFile(ValueError):
    """The path cannot be read as an input file; the message is one line naming it."""


class NotJson(ValueError):
    """Text that is not JSON a reader can take; the message says why in a few words (no path)."""

    def __init__(self, reason: str, decode_error: bool = False):
        super().__init__(reason)
        self.decode_error = decode_error  # bad syntax or encoding (a cut-short line is one), not a hostile value


def parse_json(data: bytes | str) -> Any:
    """The JSON value of `data`, or NotJson: bad UTF-8 or syntax, nesting too deep for the parser (a
    file of 200,000 brackets), an integer of more digits than Python converts (4,300). Every reader of
    a file the user gives goes through here, so a hostile file is one line, never a traceback."""
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
        return json.loads(text)
    except UnicodeDecodeError:
        raise NotJson("not UTF-8 text", decode_error=True) from None
    except json.JSONDecodeError as exc:
        where = f"column {exc.colno}" if exc.lineno == 1 else f"line {exc.lineno} column {exc.colno}"
        raise NotJson(f"not JSON ({exc.msg}, {where})", decode_error=True) from None
    except RecursionError:
        raise NotJson("nested deeper than a JSON reader follows") from None
    except ValueError as exc:  # int('9' * 5000): Python refuses more than 4,300 digits
        what = "an integer of more than 4,300 digits (Python reads no more)" if "digits" in str(exc) else \
            "a value JSON's reader refuses"
        raise NotJson(f"holds {what}") from None


def json_kind(value: Any) -> str:
    """What a JSON value is, for an error message: 'the string "8"', 'a list', 'null', '2.7'."""
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return f"the string {json.dumps(value[:40])}"
    return "a list" if isinstance(value, list) else "an object"


def shown(text: Any) -> str:
    """A string a file holds (a hardware file's name, notes or evidence, a trace's names, a results file's
    fields), as commbench prints it back: every character that is not printable (a newline, a terminal escape,
    a bidirectional override, a lone surrogate) written as its escape (\\n, \\x1b, \\u202e, \\ud800), so that
    what a file holds can neither forge an output line nor break the output's encoding. The one rule for every
    string printed back, on a terminal, in a table or in a figure."""
    text = text if isinstance(text, str) else str(text)
    if text.isprintable():
        return text
    return "".join(char if char.isprintable() else char.encode("unicode_escape").decode("ascii") for char in text)


def shown_values(value: Any) -> Any:
    """`value` (a record as a file held it) with every string in it, at any depth, keys too, as `shown`
    prints it: for readers that only display what they read (report, check, compare). What a reader made of
    the file (a dict or list of its own type: packed times unpacked) is kept as it is."""
    if isinstance(value, str):
        return shown(value)
    if type(value) is dict:
        return {shown_values(k): shown_values(v) for k, v in value.items()}
    if type(value) is list:
        return [shown_values(v) for v in value] if any(isinstance(v, (str, dict, list)) for v in value) else value
    return value


def escape_unencodable_output() -> None:
    """At a process's entry (the `commbench` command, a rank): a character its stdout cannot encode (a lone
    surrogate a file held, printed without `shown`) is written as its escape, not a UnicodeEncodeError that
    ends the command in a traceback. stderr does so already (Python's default for it)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(errors="backslashreplace")
        except (AttributeError, ValueError, OSError):  # not a text file of its own (a test's capture), or closed
            pass


def open_regular(path: str, writable: bool = False) -> BinaryIO:
    """`path` opened for binary reading (and writing, `writable`: "rb+"), if it is a regular file (not a
    FIFO, device or directory)."""
    if "\x00" in path:
        raise UnreadableFile(f"{path!r}: a file name cannot hold a NUL byte")
    try:  # O_NONBLOCK: opening a FIFO must not wait for a writer
        fd = os.open(path, (os.O_RDWR if writable else os.O_RDONLY) | os.O_NONBLOCK)
    except FileNotFoundError:
        raise UnreadableFile(f"{path}: no such file") from None
    except OSError as exc:
        raise UnreadableFile(f"cannot read {path}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UnreadableFile(f"{path}: not a regular file")
    return os.fdopen(fd, "rb+" if writable else "rb")


def drop_torn_line(handle: BinaryIO) -> None:
    """Cut a last line a kill left without its newline, reading back only as far as the line before (before
    a summary is added to a killed run's file, and before `--append` adds a run: a header written onto a
    fragment would make the whole file unreadable)."""
    end = handle.seek(0, os.SEEK_END)
    position, tail = end, b""
    while position > 0:
        step = min(position, 1 << 16)
        position -= step
        handle.seek(position)
        tail = handle.read(step) + tail
        if b"\n" in tail:
            break
    if tail and not tail.endswith(b"\n"):
        handle.truncate(position + tail.rfind(b"\n") + 1)


def read_small(path: str, max_bytes: int, what: str) -> bytes:
    """The whole of a regular file of at most `max_bytes` (`what` it should be names it in the error)."""
    with open_regular(path) as handle:
        data = handle.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise UnreadableFile(f"{path}: larger than {max_bytes:,d} bytes: not {what}")
    return data


def lines(handle: BinaryIO):
    """The lines of a file, each at most MAX_LINE_BYTES (a longer one is an error, not a memory blow-up)."""
    while True:
        line = handle.readline(MAX_LINE_BYTES + 1)
        if not line:
            return
        if len(line) > MAX_LINE_BYTES and not line.endswith(b"\n"):
            raise UnreadableFile(f"a line longer than {MAX_LINE_BYTES:,d} bytes: not a results file")
        yield line
