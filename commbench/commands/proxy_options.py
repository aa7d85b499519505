"""`commbench proxy` and `train`'s command lines as one frozen value, built once from click's parameters:
commands/proxy_plan.py and proxy_parallel.py read typed fields, never a dict of options. `train` has no
options for the backend or the compute: its value keeps their defaults (torch's library allreduce, the job's
own ranks, the real model) and says `train`; its --layout options are proxy's (trained for real). The setup's
knobs (one flag each, commands/helpers/setup_flags.py) are kept together, as given. The backend's, the ranks' and the
output's options are the base's (commands/helpers/ranks_options.py), shared with sweep."""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from commbench.commands.helpers.ranks_options import RanksOptions


@dataclass(frozen=True, kw_only=True)
class ProxyOptions(RanksOptions):
    model: str
    # the step
    batch: int | None = None
    bucket_mb: float | None = None
    steps: int = 30
    warmup_steps: int = 5
    setup: str = "ddp"
    knobs: tuple[tuple[str, Any], ...] = ()  # the setup's knobs given on the command line but --bucket-mb
    no_bucketing: bool = False
    single_bucket: bool = False
    compute: str | None = None  # measured, flops, trace, none; None: flops with --tflops, trace if traced, measured
    tflops: float | None = None
    remeasure: bool = False  # --compute measured: measure again where an earlier run's figures are kept
    amp: bool = False  # train
    trust_profile_code: bool = False
    # a parallel layout (proxy --layout, commands/proxy_parallel.py)
    layout: str | None = None
    microbatches: int | None = None
    microbatch: int = 1
    pp_schedule: str = "1f1b"
    virtual_stages: int = 1
    checkpointing: str = "none"
    # the ranks beside the base's: --local, every rank of --nodes spawned here
    spawn_local: bool = False
    # the run's extras
    validate: bool = False
    train: bool = False  # the `train` command: real training, not a replay

    @classmethod
    def from_click(cls, params: dict[str, Any], train: bool = False) -> ProxyOptions:
        """The options from click's parameters; the setup knobs' flags gathered into `knobs` (those given)."""
        from commbench.proxies.setups import KNOBS

        named = {f.name for f in fields(cls)}
        knobs = tuple((k, v) for k, v in params.items() if k in KNOBS and k not in named and v is not None)
        return cls(**{k: v for k, v in params.items() if k not in KNOBS or k in named}, knobs=knobs, train=train)

    def given_knobs(self) -> dict[str, Any]:
        """The setup's knobs given on the command line, --bucket-mb included, by knob name."""
        return {**dict(self.knobs), **({"bucket_mb": self.bucket_mb} if self.bucket_mb is not None else {})}
