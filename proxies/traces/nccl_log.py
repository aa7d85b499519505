"""Read NCCL's debug log (NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,COLL) into the job's calls.

The lines are NCCL's own. Every INFO line starts "HOST:PID:TID [DEV] NCCL INFO " (NVIDIA/nccl
src/debug.cc, ncclDebugLog); each collective call prints one line from ncclEnqueueCheck (src/enqueue.cc,
the same fields from 2.7 to 2.20.5, count printed %zi then %zu):

    AllReduce: opCount 3 sendbuff 0x7f.. recvbuff 0x7f.. count 1024 datatype 7 op 0 root 0
    comm 0x55.. [nranks=8] stream 0x..                                   (one line in the log)

and each communicator one line when it is ready (src/init.cc: "... comm 0x55.. rank 3 nranks 8
cudaDev 3 nvmlDev 3 busId 1b000 commId 0x4a.. - Init COMPLETE"). A process is HOST:PID; its global
rank is its rank in the largest communicator; a communicator's group is the processes that hold one
of its commId. One log of every rank (lines interleaved) or one log per rank: all lines are read
alike. Count is per rank for AllReduce, Broadcast and Reduce; AllGather's is what each rank sends and
ReduceScatter's what each receives (so nccl-tests' size is count x nranks). The log has no times:
compute and run times are unknown (zero), and the whole log is one step. Send/Recv are left out and
counted in the notes.

A line is read only as far as MAX_LINE_CHARS (NCCL formats a message in a fixed buffer of a few KB, debug.cc): a
longer line is not NCCL's and is passed over unread. The prefix's host starts where a name can (after a
space, a colon or the line's start), as the leftmost match would, so a long run of name characters is
scanned once, not once per character (an 80 KB line took 37 s). Each process's lines are in one file: a
log given twice, or a merged log beside a rank's own, would replay every call twice, and is refused.
"""
from __future__ import annotations

import re
from collections import Counter, defaultdict

from commbench.files import shown
from commbench.proxies.traces import calls as trace_calls
from commbench.proxies.traces.calls import (
    MAX_ELEMENTS,
    MAX_RANKS,
    JobTrace,
    RankTrace,
    TraceCall,
    TraceError,
    TraceStep,
    checked_count,
)
from commbench.proxies.traces.chrome_json import open_text

MAX_LINE_CHARS = 1 << 16
PREFIX = re.compile(r"(?<![^\s:])(?P<host>[^\s:]+):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>\d+)\] NCCL INFO (?P<msg>.*)$")
COLL = re.compile(r"^(?P<name>\w+): opCount (?P<opcount>[0-9a-fA-F]+) sendbuff \S+ recvbuff \S+ count (?P<count>\d+) "
                  r"datatype (?P<dtype>\d+) op (?P<op>\d+) root (?P<root>-?\d+) comm (?P<comm>\S+) "
                  r"\[nranks=(?P<nranks>\d+)\] stream (?P<stream>\S+)")
INIT = re.compile(r"comm (?P<comm>0x[0-9a-fA-F]+) rank (?P<rank>\d+) nranks (?P<nranks>\d+) ")  # then, later:
INIT_ID = re.compile(r"commId (?P<commid>0x[0-9a-fA-F]+) - Init COMPLETE")
NAMES = {"AllReduce": "allreduce", "AllGather": "allgather", "ReduceScatter": "reduce_scatter",
         "Broadcast": "broadcast", "Reduce": "reduce"}
GATHERS = ("allgather", "reduce_scatter")  # count is one rank's share
# ncclDataType_t (nccl.h): 0 int8, 1 uint8, 2 int32, 3 uint32, 4 int64, 5 uint64, 6 half, 7 float, 8 double,
# 9 bfloat16, 10/11 fp8 e4m3/e5m2; unsigned and fp8 replay as the signed type of their size
DTYPES = {0: ("int8", 1), 1: ("uint8", 1), 2: ("int32", 4), 3: ("int32", 4), 4: ("int64", 8), 5: ("int64", 8),
          6: ("float16", 2), 7: ("float32", 4), 8: ("float64", 8), 9: ("bfloat16", 2), 10: ("uint8", 1),
          11: ("uint8", 1)}
OPS = {0: "sum", 1: "prod", 2: "max", 3: "min", 4: "avg"}  # beyond: a PreMulSum op, replayed as sum


def looks_like_nccl_log(head: str) -> bool:
    return "NCCL INFO" in head or "NCCL WARN" in head or "NCCL version" in head


def read_nccl_logs(paths: list[str]) -> JobTrace:
    """The job's calls from its NCCL log(s)."""
    calls: dict[tuple[str, str], list[tuple[dict, str]]] = defaultdict(list)  # process -> (COLL fields, origin)
    comms: dict[tuple[str, str, str], dict] = {}  # (host, pid, comm pointer) -> INIT fields
    files: dict[tuple[str, str], str] = {}
    for path in paths:
        _read(path, calls, comms, files)
    if not calls:
        raise TraceError(f"{', '.join(paths)}: no NCCL COLL lines (run with NCCL_DEBUG=INFO "
                         f"NCCL_DEBUG_SUBSYS=INIT,COLL)")
    ranks = _global_ranks(calls, comms, paths)
    members: dict[str, list[int]] = defaultdict(list)
    for (host, pid, _), init in comms.items():
        if (host, pid) in ranks:
            if ranks[(host, pid)] in members[init["commid"]]:
                raise TraceError(f"{init['where']}: rank {ranks[(host, pid)]} holds communicator "
                                 f"{shown(init['commid'])} twice: a group of one rank twice cannot be replayed")
            members[init["commid"]].append(ranks[(host, pid)])
    world = len(ranks)
    dropped: Counter = Counter()
    traces = []
    for process, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        own = []
        for fields, origin in calls[process]:
            call = _call(fields, comms.get((*process, fields["comm"])), members, world, origin)
            if call is None:
                dropped[fields["name"]] += 1
            else:
                own.append(call)
        traces.append(RankTrace(rank, (TraceStep(0.0, 0.0, tuple(own)),)))
    notes = ["NCCL's log has no times: compute between calls and the calls' own times are unknown (zero)"]
    if dropped:
        notes.append("left out (not replayed): " + ", ".join(f"{n} {name}" for name, n in sorted(dropped.items())))
    return JobTrace(world, tuple(traces), "NCCL COLL log", tuple(notes))


def _read(path: str, calls: dict, comms: dict, files: dict) -> None:
    """The COLL and INIT lines of one log into `calls` and `comms`; `files`: process -> the file its lines are in."""
    kept = 0
    try:
        with open_text(path) as handle:
            for number, line in _lines(handle):
                match = PREFIX.search(line)
                if not match:
                    continue
                process, msg = (match["host"], match["pid"]), match["msg"]
                coll = COLL.match(msg)
                init = None if coll else INIT.search(msg)
                found = init and INIT_ID.search(msg, init.end())
                if not (coll or found):
                    continue
                if files.setdefault(process, path) != path:
                    raise TraceError(f"{path}:{number}: process {shown(':'.join(process))} has lines in "
                                     f"{files[process]} too: a log given twice (each process's lines in one file)")
                kept += 1
                if kept > trace_calls.MAX_EVENTS:
                    raise TraceError(f"{path}: more than {trace_calls.MAX_EVENTS:,d} COLL and INIT lines: more "
                                     f"than a trace this reader takes")
                if coll:
                    calls[process].append((coll.groupdict(), f"{path}:{number}"))
                else:
                    _init(init, found["commid"], f"{path}:{number} (an INIT line)", process, comms)
    except OSError as exc:
        raise TraceError(f"{path}: {exc.strerror or exc}") from exc


def _init(init: re.Match, commid: str, where: str, process: tuple[str, str], comms: dict) -> None:
    nranks = _number(init["nranks"], where, "nranks", MAX_RANKS)
    rank = _number(init["rank"], where, "rank", MAX_RANKS)
    if not rank < nranks:
        raise TraceError(f"{where}: rank {rank} of a communicator of {nranks} rank(s)")
    comms[(*process, init["comm"])] = {"comm": init["comm"], "commid": commid, "rank": rank, "nranks": nranks,
                                       "where": where}


def _lines(handle):
    """(number, line without its newline) for each line of at most MAX_LINE_CHARS; a longer one is passed
    over in pieces, never held whole."""
    number = 0
    while True:
        line = handle.readline(MAX_LINE_CHARS + 1)
        if not line:
            return
        number += 1
        if len(line) > MAX_LINE_CHARS and not line.endswith("\n"):
            while line and not line.endswith("\n"):
                line = handle.readline(MAX_LINE_CHARS)
            continue
        yield number, line.rstrip("\n")


def _global_ranks(calls: dict, comms: dict, paths: list[str]) -> dict[tuple[str, str], int]:
    """Each process's rank in the largest communicator (the world); without INIT lines, the order the
    processes first appear in, which is right only when every call is on the world."""
    largest = max((c["nranks"] for c in comms.values()), default=0)
    ranks = {(host, pid): c["rank"] for (host, pid, _), c in comms.items() if c["nranks"] == largest}
    for process in calls:
        if process not in ranks:
            if comms:
                raise TraceError(f"{paths[0]}: process {':'.join(process)} has COLL lines but no communicator of "
                                 f"all {largest} ranks in the INIT lines (a log missing or cut short?)")
            ranks[process] = len(ranks)
    world = largest or len(ranks)
    missing = sorted(set(range(world)) - set(ranks.values()))
    if missing or len(ranks) != world:
        raise TraceError(f"{paths[0]}: a job of {world} ranks, but no log lines of rank(s) "
                         f"{', '.join(map(str, missing)) or '?'} (give every rank's log)")
    return ranks


def _call(fields: dict, init: dict | None, members: dict, world: int, origin: str) -> TraceCall | None:
    collective = NAMES.get(fields["name"])
    if collective is None:
        return None
    nranks = _number(fields["nranks"], origin, "nranks", MAX_RANKS)
    if init is not None:
        group = tuple(sorted(members[init["commid"]]))
    elif nranks == world:
        group = tuple(range(world))
    else:
        raise TraceError(f"{origin}: communicator {fields['comm']} of {nranks} ranks has no INIT line naming its "
                         f"ranks (capture with NCCL_DEBUG_SUBSYS=INIT,COLL)")
    if len(group) != nranks:
        raise TraceError(f"{origin}: communicator {fields['comm']} has {nranks} ranks but the logs show "
                         f"{len(group)} of them (a rank's log missing?)")
    dtype, itemsize = DTYPES.get(_number(fields["dtype"], origin, "datatype", 1 << 20), (None, 0))
    if dtype is None:
        raise TraceError(f"{origin}: NCCL datatype {fields['dtype'][:20]}, which this reader does not know")
    count = _number(fields["count"], origin, "count", MAX_ELEMENTS) * (nranks if collective in GATHERS else 1)
    if count > MAX_ELEMENTS:
        raise TraceError(f"{origin}: count {fields['count']} on {nranks} ranks moves {count:,d} elements; a call "
                         f"moves at most {MAX_ELEMENTS:,d}")
    return TraceCall(collective, count * itemsize, dtype, OPS.get(_number(fields["op"], origin, "op", 1 << 20), "sum"),
                     group, fields["comm"], 0.0, None, None, where=origin)


def _number(digits: str, where: str, field: str, limit: int) -> int:
    """A field of digits (the regexes' `\\d+`) as a whole number up to `limit`; past 4,000 digits (Python reads
    no more than 4,300 as a number) it is past the limit unread."""
    return checked_count(int(digits) if len(digits) <= 4000 else digits[:20] + "...", where, field, limit)
