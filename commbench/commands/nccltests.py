"""`commbench nccl-tests all_reduce_perf -b 8 -e 1G -f 2 -g 2 ...`: nccl-tests' own command
lines, parsed as nccl-tests parses them (getopt, the same short and long flags, the same
defaults), mapped onto `commbench sweep` on any backend, and the same table printed.

A flag commbench cannot honour is refused with one line naming it; a flag that changes
nothing here (parallel init) is accepted and said. docs/nccl-tests.md lists every flag.
The flag set is nccl-tests' src/common.cu as of its 2.17 series (NCCL 2.28), with 2.19's -I, -K
and -u (short forms: their long names were not available to read) and its alltoallv_perf.
"""
from __future__ import annotations

import getopt
import re
import sys
from dataclasses import dataclass, field, replace

import click

from commbench.commands.helpers.common import UsageFault, output_options
from commbench.commands.nccltests_flags import BINARIES, LONG, SHORT, SHORT_OF
from commbench.sizes import MAX_MEASURED_SIZES

# nccl-tests' type names -> commbench's; uint32/uint64 and the fp8 types have no commbench counterpart.
DTYPES = {"int8": "int8", "char": "int8", "uint8": "uint8", "int32": "int32", "int": "int32", "int64": "int64",
          "half": "float16", "float16": "float16", "float": "float32", "float32": "float32", "double": "float64",
          "float64": "float64", "bfloat16": "bfloat16"}
OPS = ("sum", "prod", "max", "min", "avg")
AVERAGE = {"1": "avg", "2": "min", "3": "max"}  # -a: 0 (rank 0's time) has no commbench counterpart
REFUSED_UNLESS_DEFAULT = {  # flag: (its default, why commbench cannot do otherwise)
    "-t": ("1", "commbench runs one rank per process: start more processes (-g, or your launcher)"),
    "-m": ("1", "commbench times every call on its own; it does not aggregate calls per iteration"),
    "-y": ("0", "commbench's GPU backends use their own stream, not the null stream"),
    "-C": ("0", "commbench reports the device clock's time, not CPU time"),
    "-R": ("0", "commbench registers no buffers: CuPy's NCCL binding has no ncclCommRegister, and torch.distributed "
                "registers whole CUDA memory pools (register_mem_pool), which commbench's buffers do not come from"),
    "-x": (None, "commbench sets no NCCL CTA policy"),
    "-D": ("0", "commbench has no NCCL device-API implementation"),
    "-V": (None, "commbench has no NCCL device-API implementation"),
}


@dataclass
class Translation:
    """The `commbench sweep` argument lists an nccl-tests command line becomes (one per -d/-o
    pair; they run as the passes of one job, -N times over), and the notes to print before running."""
    runs: list[list[str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    local_ranks: int = 1  # -g: the ranks to spawn when no launcher started the command
    header: list[str] = field(default_factory=list)  # nccl-tests' first lines ("nThread 1 nGpus ..."), without "# "
    cycles: int = 1  # -N: every pair's pass, this many times over (in one job, as nccl-tests)
    ranks_given: bool = False  # -g was given
    binary: str = ""  # the NAME_perf given, without its path


def translate(binary: str, flags: list[str]) -> Translation:
    """nccl-tests' command line -> commbench sweep arguments; UsageFault (one line) for what cannot map."""
    name = binary.rsplit("/", 1)[-1]
    if name not in BINARIES:
        raise UsageFault(f"unknown nccl-tests binary {binary!r}; choose from {', '.join(BINARIES)}")
    try:
        parsed, rest = getopt.getopt(flags, SHORT, LONG)
    except getopt.GetoptError as exc:
        raise UsageFault(f"{name}: {exc}") from None
    if rest:
        raise UsageFault(f"{name}: unexpected argument {rest[0]!r} (nccl-tests takes flags only)")
    values = {SHORT_OF.get(flag[2:], "?") if flag.startswith("--") else flag[1]: value for flag, value in parsed}
    if "h" in values:
        raise UsageFault(f"{name}: -h: see `commbench nccl-tests --help` and docs/nccl-tests.md for every flag")
    for flag, (default, why) in REFUSED_UNLESS_DEFAULT.items():
        value = values.get(flag[1])
        if value is not None and (default is None or _integer(values, flag[1], 0) != int(default)):
            raise UsageFault(f"{name}: {flag} {value} cannot be honoured: {why}")
    out = Translation(binary=name)
    base = ["-c", BINARIES[name], *_sizes(values, out), *_counts(values, out), *_rank_options(values, out),
            *_timing(values, out), "--nccl-tests-rows"]
    cycles = _integer(values, "N", 1, out.notes)
    if cycles < 1:
        raise UsageFault(f"{name}: -N {cycles}: commbench runs a finite number of cycles (at least 1)")
    out.cycles = cycles
    out.header = _header(values, out)
    for dtype in _dtypes(values.get("d", "float")):
        for op in _ops(values.get("o", "sum")):
            out.runs.append([*base, "--dtype", dtype, "--op", op])
    return out


def _header(values: dict, out: Translation) -> list[str]:
    """nccl-tests' first lines, as its src/common.cu prints them from the flags: scripts grep them."""
    low, high = _size(values.get("b", "32M"), "minbytes"), _size(values.get("e", "32M"), "maxbytes")
    factor = _integer(values, "f", 1)
    step = f"{factor}(factor)" if factor > 1 else f"{_integer(values, 'i', 1 << 20)}(bytes)"
    lines = [f"nThread {_integer(values, 't', 1)} nGpus {out.local_ranks} minBytes {low} maxBytes {high} step: {step} "
             f"warmup iters: {_integer(values, 'w', 5)} iters: {_integer(values, 'n', 20)} agg iters: "
             f"{_integer(values, 'm', 1)} validation: {_integer(values, 'c', 1)} graph: {_integer(values, 'G', 0)}"]
    if _integer(values, "z", 0):
        lines.append("Blocking Enabled: wait for completion and barrier after each collective")
    if _integer(values, "p", 0):
        lines.append("Parallel Init Enabled: threads call into NcclInitRank concurrently")
    return lines


STRTOL = re.compile(r"\s*([+-]?)(0[xX][0-9a-fA-F]+|0[0-7]*|[1-9][0-9]*)")
# sscanf("%lf %1s"): a decimal or hexadecimal (C99) floating number, then at most one unit letter
SIZE = re.compile(r"\s*([+-]?(?:0[xX](?:[0-9a-fA-F]+\.?[0-9a-fA-F]*|\.[0-9a-fA-F]+)(?:[pP][+-]?[0-9]+)?"
                  r"|(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?))\s*(\S?)")
UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
NON_NEGATIVE = "bicnmwNTgGKu"  # flags whose negative value nccl-tests would misread (a size_t, a count, a timeout)


def _integer(values: dict, flag: str, default: int, notes: list[str] | None = None) -> int:
    """A number as nccl-tests reads it: strtol base 0 (0x10 and 010 as C does), which stops at the first
    character that is not a digit (-f 1.5 is 1: said in `notes`); text with no number at all, and a
    negative count, size or timeout, are one line."""
    text = values.get(flag)
    if text is None:
        return default
    match = STRTOL.match(text)
    if not match:
        raise UsageFault(f"-{flag} {text!r}: not an integer")
    sign, digits = match.groups()
    base = 16 if digits[:2].lower() == "0x" else 8 if digits.startswith("0") and len(digits) > 1 else 10
    value = int(sign + digits, base)
    if value < 0 and flag in NON_NEGATIVE:
        raise UsageFault(f"-{flag} {text}: must not be negative")
    if match.end() < len(text) and notes is not None and text[match.end():].strip():
        notes.append(f"-{flag} {text}: read as {value}, as nccl-tests reads it (strtol: an integer, up to the first "
                     f"character that is not a digit)")
    return value


def _size(text: str, flag: str) -> int:
    """nccl-tests' parsesize: sscanf's %lf (decimal, or hexadecimal as 0x400) and an optional K, M or G
    (either case); any other letter after the number is invalid, as there."""
    match = SIZE.match(text)
    if not match or match.group(2).lower() not in UNITS:
        raise UsageFault(f"invalid size specified for '{flag}': {text!r}")
    number = match.group(1)
    value = float.fromhex(number) if "x" in number.lower() else float(number)
    if value < 0 or value * UNITS[match.group(2).lower()] > 2**62:
        raise UsageFault(f"invalid size specified for '{flag}': {text!r} (from 0 to 4 EiB)")
    return int(value * UNITS[match.group(2).lower()])


def _sizes(values: dict, out: Translation) -> list[str]:
    low = _size(values.get("b", "32M"), "minbytes")
    high = _size(values.get("e", "32M"), "maxbytes")
    if low > high:
        raise UsageFault(f"invalid sizes for 'minbytes' and 'maxbytes': {low} > {high}")
    if low < 1:
        raise UsageFault("-b 0: commbench's sizes start at 1 byte")
    spec = [f"{low}-{high}" if high > low else str(low)]
    factor = _integer(values, "f", 1, out.notes)
    if high == low:
        return ["--sizes", *spec]
    if factor > 1:  # nccl-tests: a factor above 1 wins over the step
        return ["--sizes", *spec, "--factor", str(factor)]
    step = _integer(values, "i", 1 << 20, out.notes)
    count = (high - low) // step + 1 if step > 0 else None
    if count is None or count > MAX_MEASURED_SIZES:
        read = [f"-{flag} {values[flag]} is {number}" for flag, number in (("f", factor), ("i", step))
                if flag in values and values[flag].strip() != str(number)]
        read_text = f" ({', '.join(read)}, as nccl-tests' strtol reads them)" if read else ""
        many = f"{count:,d} sizes" if count is not None else "sizes without end"
        raise UsageFault(f"-b {values.get('b', '32M')} -e {values.get('e', '32M')} in steps of {step} bytes"
                         f"{read_text}: {many}; commbench measures at most {MAX_MEASURED_SIZES:,d}: give a factor "
                         f"(-f 2) or a larger -i")
    return ["--sizes", *spec, "--step", str(step)]


def _counts(values: dict, out: Translation) -> list[str]:
    args = ["--iters", str(_integer(values, "n", 20, out.notes)), "--warmup", str(_integer(values, "w", 5, out.notes))]
    check = _integer(values, "c", 1, out.notes)
    if check > 1:
        raise UsageFault(f"-c {check} cannot be honoured: commbench checks one call per point (-c 0 or 1)")
    if check == 0:
        args.append("--no-check")
    if _integer(values, "p", 0):
        out.notes.append("-p 1: commbench initialises each rank in its own process; parallel init changes nothing")
    timeout = _integer(values, "T", 0, out.notes)
    if timeout > 0:
        args += ["--timeout", str(timeout)]
    graphs = _integer(values, "G", 0)
    if graphs > 0:
        args.append("--graph")
        out.notes.append(f"-G {graphs}: each point's timed calls are captured in one CUDA graph and replayed once")
    return args


def _rank_options(values: dict, out: Translation) -> list[str]:
    average = values.get("a", "1")
    if average.strip() not in AVERAGE:
        raise UsageFault(f"-a {average}: commbench combines ranks by avg (1), min (2) or max (3); rank 0 alone "
                         f"(0) is not measured")
    args = ["--rank-agg", AVERAGE[average.strip()], "--root", str(_integer(values, "r", 0))]
    gpus = _integer(values, "g", 1, out.notes)
    if gpus < 1:
        raise UsageFault(f"-g {gpus}: need at least one rank")
    out.local_ranks = gpus  # without a launcher: -g ranks, as nccl-tests runs -g GPUs (1 by default)
    out.ranks_given = "g" in values
    if "J" in values:
        args += ["--json", values["J"]]
        out.notes.append(f"-J {values['J']}: written as commbench's JSON Lines (docs/results.md), not nccl-tests' "
                         f"JSON layout")
    return args


def _timing(values: dict, out: Translation) -> list[str]:
    """nccl-tests 2.19's -I, -K, -S, -M, -u and -z as sweep's options (commbench/point_timing.py)."""
    blocking = _integer(values, "z", 0, out.notes)
    if blocking not in (0, 1, 3):
        raise UsageFault(f"-z {values['z']}: commbench runs blocking modes 0, 1 and 3 (docs/nccl-tests.md); "
                         f"mode 2's definition in nccl-tests 2.19 was not available to reproduce")
    if blocking and _integer(values, "G", 0) > 0:
        raise UsageFault(f"-z {blocking} with -G: a CUDA graph cannot wait or hold a barrier between its calls")
    args = ["--blocking", str(blocking), "--skip-iters", str(_integer(values, "K", 0, out.notes)),
            "--misalign", str(_integer(values, "u", 0, out.notes))]
    flags = (("I", "--p99"), ("S", "--timestamps"), ("M", "--memory-report"))
    return args + [option for flag, option in flags if _integer(values, flag, 0, out.notes)]


def _dtypes(text: str) -> list[str]:
    if text == "all":
        return sorted(set(DTYPES.values()), key=list(DTYPES.values()).index)
    if text not in DTYPES:
        raise UsageFault(f"-d {text}: commbench has no such type; it takes {', '.join(DTYPES)} or all")
    return [DTYPES[text]]


def _ops(text: str) -> list[str]:
    if text == "all":
        return list(OPS)
    if text not in OPS:
        raise UsageFault(f"-o {text}: commbench takes {', '.join(OPS)} or all (not mulsum)")
    return [text]


EPILOG = """
\b
Examples:
  commbench nccl-tests all_reduce_perf -b 8 -e 128M -f 2 -g 2            # 2 local ranks
  commbench nccl-tests --backend shm all_gather_perf -b 1K -e 64M -f 4 -g 4 -d all
  torchrun --nproc-per-node 8 -m commbench nccl-tests all_reduce_perf -b 8 -e 1G -f 2 -a 3

\b
Every nccl-tests flag is parsed; docs/nccl-tests.md says how each maps, and which are
refused (one line, exit 2) because commbench cannot honour them.
"""


@click.command("nccl-tests", epilog=EPILOG,
               context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--backend", "-B", default="torch", show_default=True, metavar="NAME",
              help="Where the collectives run: any `commbench sweep --backend`.")
@click.option("--algorithm", "-A", default="auto", show_default=True,
              help="Schedule backends: which algorithm (as sweep's -A; nccl-tests has no -A).")
@click.option("--launcher", type=click.Choice(["auto", "spawn", "torchrun", "slurm", "mpi"]), default="auto",
              show_default=True)
@click.option("--oversubscribe", is_flag=True, help="Allow more local ranks than 4 per core (-g).")
@click.option("--splits", default="uniform", show_default=True, metavar="uniform|skewed[:ALPHA[:SEED]]|FILE",
              help="alltoallv_perf: what each rank sends each peer (as sweep's --splits; nccl-tests: uniform).")
@output_options(append=True)
@click.argument("binary", metavar="NAME_perf")
@click.argument("flags", nargs=-1, type=click.UNPROCESSED, metavar="[NCCL-TESTS FLAGS]...")
def nccl_tests_command(backend, algorithm, launcher, oversubscribe, splits, force, append, binary, flags) -> None:
    """Run an nccl-tests command line (all_reduce_perf, all_gather_perf, ...) on commbench.

    -N, -d all and -o all run as one job with one table, as nccl-tests runs them: each type and
    op pass after the last, every record in the -J file."""
    from commbench import job
    from commbench.bench import SWEEP_JOB
    from commbench.commands.sweep import plan_sweep, sweep

    translation = translate(binary, list(flags))
    _refuse_graphs(translation, backend)
    extra = ["--backend", backend, "--algorithm", algorithm, "--launcher", launcher, "--splits", splits,
             *(["--oversubscribe"] if oversubscribe else []), *(["--force"] if force else []),
             *(["--append"] if append else [])]
    if job.find_job(launcher)[1] is None:  # spawned here: -g ranks (under a launcher, the launcher's)
        extra += ["--nprocs", str(translation.local_ranks)]
        if not translation.ranks_given:
            translation.notes.append("no -g: one rank, as nccl-tests runs one GPU; its busbw is 0 (nothing crosses "
                                     "a link): -g N runs N local ranks")
    cfg, plan = one_job(translation, _plans(translation, extra, plan_sweep, sweep))
    for note in translation.notes if plan.lead else ():
        click.echo(f"# note: {note}")
    job.end(job.run(SWEEP_JOB, cfg, plan, sys.argv), plan)


def one_job(translation: Translation, plans: list) -> tuple:
    """Every -d/-o pair (and -N cycle) as the passes of one job, as nccl-tests runs them: one rank start,
    one header and one footer (issue 32: 36 jobs of ~2 s start-up each, each with its own table)."""
    cfg, plan = plans[0]
    passes = tuple((each.dtype, each.op) for each, _ in plans) * translation.cycles
    cfg = replace(cfg, nccl_tests_binary=translation.binary, nccl_tests_header=tuple(translation.header))
    return (replace(cfg, passes=passes) if len(passes) > 1 else cfg), plan


def _refuse_graphs(translation: Translation, backend: str) -> None:
    """-G on a backend that captures no CUDA graph: refused naming -G (the flag the user gave), not --graph."""
    from commbench.backends.registry import BACKENDS, names_where

    graphs = backend in BACKENDS and "--graph" in (translation.runs[0] if translation.runs else [])
    if graphs and backend not in names_where("captures_graphs"):
        raise UsageFault(f"-G: CUDA graphs are captured only with -B {' or -B '.join(names_where('captures_graphs'))} "
                         f"(a GPU), not -B {backend}")


SWEEP_OPTION_FLAGS = (("--json ", "-J "), ("--misalign ", "-u "), ("--blocking ", "-z "), ("--skip-iters", "-K"))


def _plans(translation: Translation, extra: list[str], plan_sweep, sweep) -> list:
    """(config, plan) of every -d/-o pair; with -d all / -o all, the pairs the backend refuses
    (avg of integers on gloo, say) are left out with a note, as long as one remains."""
    from commbench.commands.sweep_options import SweepOptions

    plans, refused = [], []
    for run in translation.runs:
        try:
            plans.append(plan_sweep(SweepOptions.from_click(sweep.make_context("sweep", [*run, *extra]).params)))
        except UsageFault as exc:
            for option, flag in SWEEP_OPTION_FLAGS:  # said with the flag the user gave
                if exc.message.startswith(option):
                    raise UsageFault(flag + exc.message[len(option):].replace("(--graph)", "(-G)")) from None
            if len(translation.runs) == 1 or "--op" not in exc.message and "--dtype" not in exc.message:
                raise
            refused.append(f"{run[run.index('--dtype') + 1]} {run[run.index('--op') + 1]}")
    if not plans:
        raise UsageFault("no type and op of -d/-o runs on this backend")
    if refused:
        translation.notes.append(f"left out (the backend has no such reduction): {', '.join(dict.fromkeys(refused))}")
    return plans

