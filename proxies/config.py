"""The configuration of a proxy replay or a training run, as one frozen value that travels
to every rank (as JSON in the environment of spawned ranks). The options a backend reads are
one BackendConfig inside it, settled by the backend's class before any rank starts
(commands/helpers/backend_options.py), as the sweep's are."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any, ClassVar

from commbench.backends.base import BackendConfig, RanksConfig
from commbench.proxies.layouts.parallelism import Parallelism


@dataclass(frozen=True)
class ProxyConfig(RanksConfig):
    # the backend options a proxy header has always carried (not nprocs, hw, cuda_mode, graph)
    HEADER_BACKEND_FIELDS: ClassVar[tuple[str, ...]] = ("backend", "torch_backend", "device", "algorithm", "topology",
                                                       "timeout_s")
    model: str  # a shipped profile name or a profile file
    batch: int | None = None  # per rank; None: the profile's default
    bucket_mb: float | None = None  # None: DDP's default (25 MiB, first bucket 1 MiB)
    bucketing: str = "ddp"  # ddp, none (one allreduce per tensor), single
    compute: str = "measured"  # measured (the real model timed here), flops (at tflops), trace (traced profile),
    # block (a layout's operators from compute_block, a hardware file's compute block: costmodel/compute.py), none
    tflops: float | None = None
    remeasure: bool = False  # --compute measured: measure even where an earlier run's figures are kept
    steps: int = 30
    warmup_steps: int = 5
    amp: bool = False  # train on GPU: torch.autocast fp16 with a grad scaler
    backend: BackendConfig = BackendConfig()  # nprocs: the job's ranks
    hw: str | None = None  # the cost model of a predicted run (--backend sim, or --nodes larger than the job)
    json_path: str | None = None
    monitor: bool = False
    trust_profile_code: bool = False  # build a model from code the profile file names (source.spec module:callable)
    setup: str = "ddp"  # proxies/setups.py
    knobs: dict[str, Any] = field(default_factory=dict)  # the setup's knobs as given (bucket_mb is its own field)
    # proxy --layout, train --layout: the parallel layout, replayed by proxies/layouts/replay.py (trained by
    # proxies/layouts/train/run.py) on micro-batches of `microbatch` sequences; None: data parallel alone
    layout: Parallelism | None = None
    microbatch: int = 1
    compute_block: dict[str, Any] | None = None  # --compute block: the block, as the hardware file holds it
    checkpointing: str = "none"

    @classmethod
    def from_json(cls, text: str) -> ProxyConfig:
        cfg = super().from_json(text)  # JSON holds the layout's fields: the ranks get the value itself back
        return replace(cfg, layout=Parallelism(**cfg.layout)) if isinstance(cfg.layout, dict) else cfg

    def header_fields(self) -> dict[str, Any]:
        fields = super().header_fields()
        return {**fields, "layout": asdict(self.layout)} if self.layout is not None else fields

    def choice(self, nodes: int | None = None, ranks_per_node: int | None = None, device: str = "cuda"):
        """The setup with its knobs settled (proxies.setups.Choice); SetupError: a knob it does not take."""
        from commbench.proxies.setups import Placement, settle

        knobs = {**self.knobs, **({"bucket_mb": self.bucket_mb} if self.bucket_mb is not None else {})}
        layout = Placement(nodes, ranks_per_node, device) if nodes and ranks_per_node else None
        return settle(self.setup, knobs, layout)
