"""nccl-tests' flags given to `commbench sweep`: each answered in one line with what the letter means there,
what says it here, and the command that takes nccl-tests' flags as typed (`commbench nccl-tests`).

Five of sweep's own letters are nccl-tests flags with another meaning (-b, -c, -T, -a, -N); a value only
nccl-tests' meaning takes (`-c 0`, `-T 60`, `-a 1`, `-b 8`) is refused naming both meanings, where it was
"unknown collective '0'" or "bad --topology". The letters sweep lacks (-g, -e, -I, -J, ...) are answered
letter by letter, not with one sizes hint for all. Same letter, same meaning (-f, -d, -o, -w, -n): taken.
"""
from __future__ import annotations

import re

from commbench.commands.nccltests_flags import BINARIES, SHORT, SHORT_OF

# every nccl-tests letter: (what it means there, what says it in sweep; None: nothing does)
MEANING = {
    "-t": ("threads per process", None), "-g": ("GPUs per thread", "--nprocs N (local ranks)"),
    "-b": ("the smallest size (minbytes)", "--sizes START-END (e.g. --sizes 8-1M)"),
    "-e": ("the largest size (maxbytes)", "--sizes START-END (e.g. --sizes 8-1M)"),
    "-i": ("the step in bytes", "--step BYTES"), "-f": ("the step factor", "--factor"),
    "-n": ("timed iterations", "--iters"), "-m": ("calls aggregated per iteration", None),
    "-w": ("warm-up iterations", "--warmup"), "-N": ("run cycles", None),
    "-p": ("parallel init", None), "-c": ("the number of checked iterations", "--check / --no-check"),
    "-o": ("the reduction op", "--op"), "-d": ("the data type", "--dtype"), "-r": ("the root rank", "--root"),
    "-z": ("blocking calls", "--blocking"), "-y": ("the null stream", None),
    "-T": ("a timeout in seconds", "--timeout SECONDS"), "-G": ("CUDA graph launches", "--graph"),
    "-C": ("CPU time", None), "-a": ("how ranks' times combine (0 rank 0, 1 avg, 2 min, 3 max)",
                                     "--rank-agg avg|min|max"),
    "-R": ("buffer registration", None), "-x": ("the CTA policy", None), "-D": ("the device API", None),
    "-V": ("the device API's CTA count", None), "-J": ("a JSON output file", "--json FILE"),
    "-S": ("timestamps", "--timestamps"), "-M": ("the memory report", "--memory-report"),
    "-I": ("each time's p99", "--p99"), "-K": ("iterations left out first", "--skip-iters K"),
    "-u": ("buffers misaligned by bytes", "--misalign BYTES"), "-F": ("a CSV output file", "--csv FILE"),
}
# sweep's letters that nccl-tests uses for something else: sweep's option, and the values only nccl-tests takes
INTEGER = re.compile(r"^\s*[+-]?(0[xX][0-9a-fA-F]+|\d+)\s*$")
SIZE = re.compile(r"^\d+(\.\d+)?[KMGkmg]?$")
OTHER_MEANING = {
    "-b": ("--backend", SIZE.match), "-c": ("--collective", INTEGER.match),
    "-T": ("--topology NODESxRANKS", INTEGER.match), "-a": ("--rank-agg max|avg|min", INTEGER.match),
    "-N": ("--nprocs, the local ranks to start", lambda value: _below_one(value)),
}
ALL_VALUES = {"-d": "--dtype", "-o": "--op"}  # nccl-tests' `all` (each type, each op): sweep runs one
TAKES_VALUE = {"-" + letter for letter in SHORT.replace(":", "")} - {"-h"}  # every one but -h takes a value
# sweep's long options and the nccl-tests letter that says the same in `commbench nccl-tests`
LONG_AS_LETTER = {"--sizes": "-s", "--factor": "-f", "--step": "-i", "--iters": "-n", "--warmup": "-w",
                  "--dtype": "-d", "--op": "-o", "--root": "-r", "--blocking": "-z", "--json": "-J",
                  "--skip-iters": "-K", "--misalign": "-u", "--nprocs": "-g", "--collective": "-c",
                  "--backend": "-b", "--algorithm": "-A", "--rank-agg": "-a"}
RANK_AGG = {"avg": "1", "min": "2", "max": "3"}


def _below_one(text: str) -> bool:
    """An integer below 1 (nccl-tests' -N 0, run without end), in any of strtol's spellings."""
    if not INTEGER.match(text):
        return False
    digits = text.strip().lstrip("+")
    return digits.startswith("-") or int(digits, 16 if digits[:2].lower() == "0x" else 10) < 1


def letters(args: list[str]) -> list[tuple[str, str | None]]:
    """(letter, value) of each short option on the line, `-c 0` and `-c0` alike (long options are not)."""
    return [(letter, value) for letter, value, long_form in _options(args) if not long_form]


def _options(args: list[str]) -> list[tuple[str, str | None, bool]]:
    """(letter, value, given as sweep's long option) of each option on the line, in order: the short letters,
    and sweep's long options that nccl-tests has a letter for, as that letter."""
    found, i = [], 0
    while i < len(args) and args[i] != "--":
        token = args[i]
        name, equals, attached = token.partition("=")
        if len(token) >= 2 and token[0] == "-" and token[1] != "-" and not token[1].isdigit():
            name, attached, equals = token[:2], token[2:], bool(token[2:])
        elif name not in LONG_AS_LETTER:
            i += 1
            continue
        value = attached if equals else (args[i + 1] if i + 1 < len(args) else None)
        found.append((LONG_AS_LETTER.get(name, name), value, name in LONG_AS_LETTER))
        i += 1 if equals else 2
    return found


def other_meaning(args: list[str]) -> str | None:
    """The line for a letter of sweep's given a value only nccl-tests' meaning takes, or None."""
    for letter, value in letters(args):
        if value is None:
            continue
        if letter == "-N" and OTHER_MEANING[letter][1](value):  # nccl-tests mode refuses 0 cycles too
            return (f"-N {value}: here -N is --nprocs, the local ranks to start (at least 1); in nccl-tests, run "
                    f"cycles (0: without end), which `commbench nccl-tests` runs as -N CYCLES, at least 1")
        if letter in OTHER_MEANING and OTHER_MEANING[letter][1](value):
            meaning, way = MEANING[letter]
            instead = f": {way}" if way else ""
            return (f"{letter} {value}: in nccl-tests, {meaning} (here {letter} is {OTHER_MEANING[letter][0]})"
                    f"{instead}; {_as_typed(args)}")
        if letter in ALL_VALUES and value.strip().lower() == "all":
            return f"{letter} all: sweep runs one {ALL_VALUES[letter]} a run; {_as_typed(args)}"
    return None


def lacking(option: str, args: list[str]) -> str | None:
    """The line for an nccl-tests flag sweep lacks (click's "No such option"), or None for any other."""
    letter = option if len(option) == 2 else "-" + SHORT_OF.get(option[2:], "?")
    if letter not in MEANING:
        return None
    meaning, way = MEANING[letter]
    named = option if len(option) == 2 else f"{option} (nccl-tests' {letter})"
    instead = f"; here {way}" if way else "; sweep has no counterpart"
    return f"sweep has no {named}: in nccl-tests, {meaning}{instead}; {_as_typed(args)}"


def _as_typed(args: list[str]) -> str:
    """Where nccl-tests' flags run as typed, and what -N means here when the line has one."""
    ranks = "-N" in dict(letters(args))
    return (f"nccl-tests' flags run as typed in {nccl_tests_line(args)}"
            + (" (where -N is run cycles; here, --nprocs)" if ranks else ""))


def nccl_tests_line(args: list[str]) -> str:
    """The nccl-tests command line in this sweep line: its nccl-tests letters as typed, and sweep's own
    options where nccl-tests has them (--nprocs as -g, --json as -J, ...): `-c NAME` as the binary,
    `-b NAME` and `-A NAME` as `commbench nccl-tests -B NAME -A NAME` (before it), `--sizes START-END` as
    -b START -e END. What nccl-tests has no flag for (--topology, a comma list of sizes) is left out."""
    binary, before, flags, sizes = "all_reduce_perf", [], [], []
    for letter, value, long_form in _options(args):
        if value is None:
            continue
        if letter == "-c" and (long_form or not INTEGER.match(value)):
            name = value.strip().lower().replace("-", "_")
            binary = next((b for b, c in BINARIES.items() if name in (c, b, b[:-5])), binary)
        elif letter == "-b" and (long_form or not SIZE.match(value)) or letter == "-A":
            before += ["-B" if letter == "-b" else "-A", value]
        elif letter == "-a" and value.strip().lower() in RANK_AGG:
            flags += ["-a", RANK_AGG[value.strip().lower()]]
        elif letter == "-s":
            sizes = [] if "," in value else value.split("-", 1)
        elif letter in TAKES_VALUE and not (letter == "-T" and not INTEGER.match(value)):
            flags += [letter, value]
    if sizes and "-b" not in flags:
        flags = ["-b", sizes[0]] + flags
    if sizes and "-e" not in flags:
        flags = flags[:2] + ["-e", sizes[-1]] + flags[2:] if flags[:1] == ["-b"] else ["-e", sizes[-1]] + flags
    return " ".join(["commbench nccl-tests", *before, binary, *flags])
