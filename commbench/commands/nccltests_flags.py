"""nccl-tests' command-line flags as data: its binaries and the collective each runs, getopt's short and long
forms (src/common.cu, 2.17 series, with 2.19's -I, -K and -u) and the letter of each long name. Read by
`commbench nccl-tests` (commands/nccltests.py) to parse them and by `sweep` (commands/sweep_letters.py) to say
what a letter typed at sweep means in nccl-tests; kept apart so neither imports the other."""
from __future__ import annotations

BINARIES = {"all_reduce_perf": "allreduce", "all_gather_perf": "allgather", "reduce_scatter_perf": "reduce_scatter",
            "broadcast_perf": "broadcast", "reduce_perf": "reduce", "alltoall_perf": "alltoall",
            "sendrecv_perf": "sendrecv", "gather_perf": "gather", "scatter_perf": "scatter",
            "alltoallv_perf": "alltoallv", "hypercube_perf": "hypercube"}
SHORT = "t:g:b:e:i:f:n:m:w:N:p:c:o:d:r:z:y:T:hG:C:a:R:x:D:V:J:S:M:I:K:u:"  # -I, -K, -u: 2.19 (no long form here)
LONG = ["nthreads=", "ngpus=", "minbytes=", "maxbytes=", "stepbytes=", "stepfactor=", "iters=", "agg_iters=",
        "warmup_iters=", "run_cycles=", "parallel_init=", "check=", "op=", "datatype=", "root=", "blocking=",
        "stream_null=", "timeout=", "cudagraph=", "report_cputime=", "report_timestamps=", "output_file=", "average=",
        "local_register=", "cta_policy=", "device_implementation=", "device_cta_count=", "memory_report=", "help"]
SHORT_OF = {name.rstrip("="): letter for name, letter in zip(LONG, "tgbeifnmwNpcodrzyTGCSJaRxDVMh")}
