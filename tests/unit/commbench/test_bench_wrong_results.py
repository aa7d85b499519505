"""A wrong element fails the run after every result is written (in-process, one gloo rank)."""
from commbench.backends.torch_dist import TorchBackend
from commbench.bench import Sweep
from commbench.errors import EXIT_WRONG
from commbench.launch import free_port
from commbench.launchers import LaunchInfo
from commbench.results import read_records
from commbench.sweep_config import SweepConfig


class CorruptingBackend(TorchBackend):
    """gloo, but the 3rd element of every output at >= 4 KiB comes back off by one."""

    def prepare(self, collective, send, recv, op, root, inplace):
        call = super().prepare(collective, send, recv, op, root, inplace)
        if recv.numel() * recv.element_size() < 4096:
            return call

        def corrupted():
            call()
            recv[2] += 1
        return corrupted


def test_wrong_results_are_counted_and_fail_the_run(tmp_path, capsys):
    launch = LaunchInfo.local(0, 1, free_port())
    cfg = SweepConfig(sizes=(1024, 8192, 65536), iters=2, warmup=1, json_path=str(tmp_path / "r.jsonl"))
    backend = CorruptingBackend(launch, device="cpu", timeout_s=30)
    try:
        code = Sweep(cfg, launch, backend).run()
    finally:
        backend.close()
    assert code == EXIT_WRONG
    records = read_records(str(tmp_path / "r.jsonl"))
    results = [r for r in records if r["record"] == "result"]
    assert [r["wrong"] for r in results] == [0, 0, 1, 1, 1, 1]  # all six points written
    assert records[-1]["status"] == "wrong" and records[-1]["wrong"] == 4
    assert "# Out of bounds values : 4 FAILED" in capsys.readouterr().out
