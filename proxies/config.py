"""The configuration of a proxy replay or a training run, as one frozen value that travels
to every rank (as JSON in the environment of spawned ranks)."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from commbench.backends.base import BackendConfig


@dataclass(frozen=True)
class ProxyConfig:
    model: str  # a shipped profile name or a profile file
    batch: int | None = None  # per rank; None: the profile's default
    bucket_mb: float | None = None  # None: DDP's default (25 MiB, first bucket 1 MiB)
    bucketing: str = "ddp"  # ddp, none (one allreduce per tensor), single
    compute: str = "measured"  # measured (time the real model here), flops (at tflops), none
    tflops: float | None = None
    steps: int = 30
    warmup_steps: int = 5
    amp: bool = False  # train on GPU: torch.autocast fp16 with a grad scaler
    backend: str = "torch"
    torch_backend: str = "auto"
    device: str = "auto"
    algorithm: str = "auto"
    topology: str | None = None
    hw: str | None = None
    json_path: str | None = None
    timeout_s: float = 300.0
    monitor: bool = False
    trust_profile_code: bool = False  # build a model from code the profile file names (source.spec module:callable)
    setup: str = "ddp"  # proxies/setups.py
    knobs: dict[str, Any] = field(default_factory=dict)  # the setup's knobs as given (bucket_mb is its own field)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> ProxyConfig:
        return cls(**json.loads(text))

    def choice(self, nodes: int | None = None, ranks_per_node: int | None = None, device: str = "cuda"):
        """The setup with its knobs settled (proxies.setups.Choice); SetupError: a knob it does not take."""
        from commbench.proxies.setups import Layout, settle

        knobs = {**self.knobs, **({"bucket_mb": self.bucket_mb} if self.bucket_mb is not None else {})}
        layout = Layout(nodes, ranks_per_node, device) if nodes and ranks_per_node else None
        return settle(self.setup, knobs, layout)

    def backend_config(self, world: int) -> BackendConfig:
        """What a Backend's `create` reads (device, library, topology, timeout)."""
        return BackendConfig(backend=self.backend, torch_backend=self.torch_backend, device=self.device,
                           timeout_s=self.timeout_s, algorithm=self.algorithm, topology=self.topology,
                           nprocs=world, hw=self.hw)
