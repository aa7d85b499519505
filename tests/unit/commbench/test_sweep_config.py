"""The configs of the jobs that run ranks (SweepConfig, ProxyConfig): each holds one BackendConfig,
travels to the ranks as JSON and arrives unchanged, writes the same flat `config` into run headers
as before the backend's options were nested, and has its backend options settled by the backend's
class before any rank starts, proxy and train as the sweep (commands/helpers/backend_options.py)."""
from __future__ import annotations

import pytest

from commbench import cli, job
from commbench.backends import BackendConfig
from commbench.proxies.config import ProxyConfig
from commbench.sweep_config import SweepConfig

SWEEP_HEADER_KEYS = {"collectives", "sizes", "dtype", "op", "root", "placements", "warmup", "iters", "min_time_s",
                     "min_iters", "max_iters", "rank_agg", "stat", "check", "backend", "torch_backend", "device",
                     "json_path", "csv_path", "append", "timeout_s", "algorithm", "topology", "nprocs", "hw",
                     "cuda_mode", "graph", "monitor", "nccl_tests_rows", "nccl_tests_binary", "nccl_tests_header",
                     "passes", "splits", "split_weights",
                     "skip_iters", "show_p99", "timestamps", "memory_report", "misalign_nbytes", "blocking",
                     "tuning"}
PROXY_HEADER_KEYS = {"model", "batch", "bucket_mb", "bucketing", "compute", "tflops", "steps", "warmup_steps", "amp",
                     "backend", "torch_backend", "device", "algorithm", "topology", "hw", "json_path", "timeout_s",
                     "monitor", "trust_profile_code", "setup", "knobs",
                     "layout", "microbatch", "checkpointing",  # proxy --layout (2026-11-27)
                     "compute_block", "remeasure"}  # --compute block, the kept measurement (2026-12-02)


def test_a_sweep_config_reaches_the_ranks_unchanged_and_heads_its_file_flat():
    cfg = SweepConfig(collectives=("allreduce", "broadcast"), sizes=(1024, 4096), warmup=2,
                      passes=(("float32", "sum"), ("int8", "max")),
                      backend=BackendConfig(backend="sim", algorithm="binomial", topology="2x2", nprocs=4,
                                            hw="dgx-a100", timeout_s=30.0))
    assert SweepConfig.from_json(cfg.to_json()) == cfg
    header = cfg.header_fields()
    assert set(header) == SWEEP_HEADER_KEYS
    assert (header["backend"], header["algorithm"], header["nprocs"], header["timeout_s"]) == ("sim", "binomial", 4,
                                                                                               30.0)
    assert cfg.timeout_s == 30.0  # the job frame's timeout is the backend's


def test_a_proxy_config_reaches_the_ranks_unchanged_and_heads_its_file_flat():
    cfg = ProxyConfig(model="resnet18", batch=2, backend=BackendConfig(backend="shm", topology="1x2", nprocs=2,
                                                                         timeout_s=40.0),
                      hw="dgx-a100", setup="ddp", knobs={"accumulate": 2})
    assert ProxyConfig.from_json(cfg.to_json()) == cfg
    header = cfg.header_fields()
    assert set(header) == PROXY_HEADER_KEYS  # a proxy header's keys: no nprocs, cuda_mode, graph
    assert (header["backend"], header["topology"], header["hw"], header["timeout_s"]) == ("shm", "1x2", "dgx-a100",
                                                                                            40.0)


def test_a_layout_reaches_the_ranks_as_the_value_itself_and_heads_its_file_as_its_fields():
    """proxy --layout's config carries a Parallelism (issue 46: the layout was a dict on its way to the ranks)."""
    from dataclasses import asdict

    from commbench.proxies.layouts.parallelism import parse_layout

    par = parse_layout("tp2,pp2,fsdp2@interleaved:2", microbatches=4)
    cfg = ProxyConfig(model="llama-tiny", backend=BackendConfig(backend="torch", nprocs=8), layout=par)
    back = ProxyConfig.from_json(cfg.to_json())
    assert back == cfg and isinstance(back.layout, type(par)) and back.layout.name == "tp2,pp2,fsdp2@interleaved:2"
    assert cfg.header_fields()["layout"] == asdict(par)  # the header's fields, as files have always held them


@pytest.fixture
def started(monkeypatch):
    """The configs that validation let start (no rank starts)."""
    configs = []
    monkeypatch.setattr(job, "run", lambda name, cfg, plan, argv: configs.append(cfg) or 0)
    return configs


def test_proxy_refuses_a_backend_option_as_the_sweep_does(started, capsys):
    """--algorithm chooses commbench's own algorithms: torch runs the library's, in a proxy as in a sweep."""
    assert cli.main(["sweep", "--backend", "torch", "--algorithm", "ring", "--nprocs", "2", "--sizes", "1K"]) == 2
    sweep_line = capsys.readouterr().err.strip().splitlines()[-1]
    assert cli.main(["proxy", "resnet18", "--backend", "torch", "--algorithm", "ring", "--nprocs", "2",
                     "--compute", "none", "--batch", "1", "--steps", "1"]) == 2
    proxy_line = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--algorithm/--topology choose commbench's own algorithms" in proxy_line
    assert proxy_line == sweep_line and not started


def test_proxy_ranks_receive_the_settled_backend_config(started):
    """What the ranks get is what the backend's class settled; the job's layout stays in it, for a backend
    that runs the library's algorithms too (it is the job's layout, not a choice of algorithm)."""
    from commbench.backends import backend_class

    common = ["--compute", "none", "--batch", "1", "--steps", "1", "--nodes", "2", "--gpus-per-node", "1", "--local"]
    assert cli.main(["proxy", "resnet18", "--backend", "shm", "--algorithm", "ring", *common]) == 0
    assert cli.main(["proxy", "resnet18", "--backend", "torch", *common]) == 0
    shm, torch = (cfg.backend for cfg in started)
    assert shm == backend_class("shm").settle(shm, None)
    assert (shm.backend, shm.algorithm, shm.topology, shm.nprocs) == ("shm", "ring", "2x1", 2)
    assert (torch.backend, torch.topology, torch.nprocs, torch.device) == ("torch", "2x1", 2, "cpu")


def test_a_spawned_cuda_proxy_runs_one_process_a_gpu(started, monkeypatch):
    """A proxy spawns its ranks as processes, so cuda's `auto` settles as under a launcher (ipc, one process a
    GPU), not as a sweep without one (peer: every rank in this one process). Two GPUs faked: no GPU here."""
    import commbench.backends.cuda.device as G
    import commbench.backends.cuda.sched as CS

    for module in (G, CS):
        monkeypatch.setattr(module, "require_gpu", lambda name="cuda": 2)
    assert cli.main(["proxy", "resnet18", "--backend", "cuda", "--nprocs", "2", "--compute", "none", "--batch", "1",
                     "--steps", "1"]) == 0
    (cfg,) = started
    assert cfg.backend.cuda_mode == "ipc"
