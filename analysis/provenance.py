"""What a fit applies to: the backend, library and hosts its points were measured with
(`meta.measured_with`, written by `commbench fit`), and the same of a run, compared field by
field. A fit of one library on one host says nothing of another library, or of another host's
cores and links, so `check` and `report --hw` leave such a run out with one note naming both
(docs/model.md, "What a fit applies to"). Only fields are compared, never names: a fit of any
backend applies to runs of that backend, and a preset (no `measured_with`) to any run.
"""
from __future__ import annotations

from typing import Any

# the record fields a fit's points share with the runs it predicts (stat: which statistic time_us is, sweep --stat)
RECORD_FIELDS = ("backend", "library", "stat")


def run_hosts(header: dict | None) -> list[str] | None:
    """The hosts a run's ranks ran on, from its header record (None: no header, or it does not say)."""
    ranks = (header or {}).get("ranks")
    if not isinstance(ranks, list):
        return None
    hosts = sorted({str(r["host"]) for r in ranks if isinstance(r, dict) and r.get("host")})
    return hosts or None


def headers_by_run(records: list[dict]) -> dict[str, dict]:
    """Each run id's header record."""
    return {r["run_id"]: r for r in records if r.get("record") == "header" and isinstance(r.get("run_id"), str)}


def measured_with(chosen: list[dict], records: list[dict]) -> dict[str, Any]:
    """`meta.measured_with` of a fit of `chosen` (whose headers are among `records`): every value of
    each RECORD_FIELDS field its points hold, and their hosts (null when no header says)."""
    headers = headers_by_run(records)
    block: dict[str, Any] = {name: sorted({str(r[name]) for r in chosen if r.get(name) is not None})
                             for name in RECORD_FIELDS}  # a field no point holds (an older file): [], not compared
    hosts = [run_hosts(headers.get(r.get("run_id"))) for r in chosen]
    block["hosts"] = sorted({h for found in hosts if found for h in found}) or None
    return block


def _describe(values: dict[str, Any]) -> str:
    parts = [f"{name} {'/'.join(values[name])}" for name in (*RECORD_FIELDS, "hosts") if values.get(name)]
    return ", ".join(parts) if parts else "nothing recorded"


def mismatch(meta: dict, record: dict, header: dict | None) -> str | None:
    """Why a fit (its `meta`) does not apply to a record of a run (its header), naming both; None when
    it does, or when the fit does not say what it was measured with (a preset, a fit from before
    measured_with), or the run does not say where it ran."""
    fit = meta.get("measured_with")
    if not isinstance(fit, dict):
        return None
    run: dict[str, Any] = {name: [str(record.get(name))] for name in RECORD_FIELDS if record.get(name) is not None}
    hosts = run_hosts(header)
    if hosts:
        run["hosts"] = hosts
    differs = [name for name in run if isinstance(fit.get(name), list) and fit[name]
               and not set(run[name]) <= set(fit[name])]
    if not differs:
        return None
    return f"measured with {_describe(run)}; the fit with {_describe(fit)}"
