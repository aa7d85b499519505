"""Results: every record commbench writes and reads, one flat, versioned JSON line each
(docs/results.md describes every field).

- `records`: the records' base and a sweep's record types (a dataclass per kind), and `point_result`;
- `step_records`: the record types of a model's step (proxy, train, predict-scaling);
- `times`: a result's raw per-iteration times, packed when many (`pack_times`, `raw_times`);
- `sink`: the one writer (`ResultSink`: each line fsynced, results in CSV too; `append_record`);
- `reader`: reading a file back, every line checked (`read_records`, `check_record`).

`from commbench.results import ...` is the public path for all of them (users' scripts read files with
`commbench.results.read_records`); the modules inside import each other directly, never this package.
"""
from commbench.results.reader import (  # noqa: F401 - the public names
    AT_LEAST_ONE,
    LARGEST_INTEGER,
    PLACEMENT_NAMES,
    RECORD_TYPES,
    REQUIRED_FIELDS,
    RecordError,
    check_record,
    read_records,
)
from commbench.results.records import (  # noqa: F401
    CALIBRATED_ESTIMATE,
    CORPUS_PROVENANCE,
    FIT_PROVENANCE,
    PROVENANCE_LABELS,
    RAW_ESTIMATE,
    RESULT_FIELDS,
    SCHEMA_VERSION,
    STATS,
    CompareRecord,
    Record,
    Result,
    SweepSummary,
    busbw_averages,
    percentiles_us,
    point_result,
    statistic_us,
)
from commbench.results.sink import (  # noqa: F401
    CSV_HEADER,
    OutputError,
    ResultSink,
    append_record,
    append_refusal,
    new_run_id,
)
from commbench.results.step_records import (  # noqa: F401
    LayoutRecord,
    ProxyResult,
    ScalingRecord,
    StepRecord,
    ValidateRecord,
)
from commbench.results.times import (  # noqa: F401
    MAX_RAW_TIMES,
    MAX_RAW_TIMES_PER_FILE,
    RAW_TIMES_ENCODING,
    RAW_TIMES_INLINE_MAX,
    pack_times,
    raw_times,
)
