"""Telemetry: host numbers from psutil, GPU numbers from NVML (a fake NVML here, the real one
where a GPU is), windows and summaries, and `sweep --monitor` writing them."""
import sys
import threading
import time
import types

import pytest
from conftest import results_of

from commbench import telemetry as T
from commbench.backends import BackendConfig
from commbench.backends.sim import SimBackend
from commbench.bench import Sweep
from commbench.launchers import LaunchInfo
from commbench.sweep_config import SweepConfig
from commbench.topology import Topology

psutil = pytest.importorskip("psutil")


def _nvml_works() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml.nvmlDeviceGetCount() > 0
    except Exception:  # noqa: BLE001
        return False


def test_averages_turn_counters_into_rates_and_gauges_into_means():
    samples = [(10.0, {"cpu_busy_s": 100.0, "cpu_total_s": 400.0, "mem_used_mib": 1000.0, "nic_rx_bytes": 0.0,
                       "nic_tx_bytes": 5e6, "nvlink_rx_kib": 0.0, "gpu_util_pct": 50.0}),
               (11.0, {"cpu_busy_s": 101.0, "cpu_total_s": 402.0, "mem_used_mib": 3000.0, "nic_rx_bytes": 2e6,
                       "nic_tx_bytes": 5e6, "nvlink_rx_kib": 1e6, "gpu_util_pct": 100.0}),
               (12.0, {"cpu_busy_s": 103.0, "cpu_total_s": 404.0, "mem_used_mib": 2000.0, "nic_rx_bytes": 4e6,
                       "nic_tx_bytes": 7e6, "nvlink_rx_kib": 2e6, "gpu_util_pct": 90.0})]
    out = T.averages(samples)
    assert out == pytest.approx({"samples": 3, "window_s": 2.0, "cpu_util_pct": 75.0, "mem_used_mib": 2000.0,
                                 "nic_rx_mbps": 2.0, "nic_tx_mbps": 1.0, "nvlink_rx_mbps": 1024.0,
                                 "gpu_util_pct": 80.0})
    assert T.averages([]) == {}


def test_per_gpu_metrics_are_summed_and_a_counter_that_drops_out_gives_no_negative_rate():
    """GPU 1's NVLink counter answers in the first two readings only; GPU 0's is reset
    (goes backwards): GPU 1's rate over its own readings, none from GPU 0, never negative."""
    samples = [(0.0, {"nvlink_rx_kib.0": 5e6, "nvlink_rx_kib.1": 0.0, "pcie_rx_mbps.0": 10.0, "pcie_rx_mbps.1": 30.0}),
               (1.0, {"nvlink_rx_kib.0": 6e6, "nvlink_rx_kib.1": 1e6, "pcie_rx_mbps.0": 20.0, "pcie_rx_mbps.1": 50.0}),
               (2.0, {"nvlink_rx_kib.0": 1e3, "pcie_rx_mbps.0": 30.0})]
    out = T.averages(samples)
    assert out["nvlink_rx_mbps"] == pytest.approx(1024.0)  # GPU 1: 1e6 KiB in 1 s
    assert out["pcie_rx_mbps"] == pytest.approx(20.0 + 40.0)  # each GPU's mean, summed
    assert T.averages(samples[::2])  # GPU 0 alone went backwards: no NVLink rate at all
    assert "nvlink_rx_mbps" not in T.averages(samples[::2])


def test_host_window_sees_a_busy_core():
    with T.Monitor(interval_s=0.05, gpu=False) as monitor:
        monitor.mark("spin")
        stop = time.monotonic() + 0.5
        while time.monotonic() < stop:
            pass
        busy = monitor.window()
    cores = psutil.cpu_count() or 1
    assert busy["samples"] >= 3 and 0.2 < busy["window_s"] < 0.6  # the thread's readings span most of the 0.5 s
    assert 100 / cores * 0.6 < busy["cpu_util_pct"] <= 100.0  # one spinning thread is at least one core's share
    assert 0 < busy["mem_used_mib"] < psutil.virtual_memory().total / 2 ** 20
    assert busy["nic_rx_mbps"] >= 0 and busy["nic_tx_mbps"] >= 0
    assert not any(key.startswith(("gpu_", "sm_", "pcie_", "nvlink_")) for key in busy)


def test_a_short_window_reports_the_nearest_reading():
    """No reading falls inside a window shorter than the interval: it reports the last one
    before it (gauges; no rate, which needs two)."""
    with T.Monitor(interval_s=10.0, gpu=False) as monitor:
        monitor.mark()
        window = monitor.window()
    assert window["samples"] == 1 and window["mem_used_mib"] > 0 and window["window_s"] == 0
    assert "cpu_util_pct" not in window and "nic_rx_mbps" not in window


def test_mark_and_window_take_no_reading():
    """A reading can block (NVML's PCIe counters: ~20 ms per GPU): the caller, between a
    barrier and its timed calls, must never wait for one. Only the thread reads."""
    monitor = T.Monitor(interval_s=10.0, gpu=False)
    reads = []
    host = monitor._host
    monitor._host = lambda: (reads.append(threading.current_thread().name), host())[1]
    monitor.start()
    try:
        assert reads == ["MainThread"]  # start() takes the first reading
        monitor.mark("point")
        monitor.sample()  # as the thread would, inside the window
        window = monitor.window()
        assert len(reads) == 2 and window["samples"] == 2  # the reading before the mark, and the one inside
    finally:
        monitor.stop()


def test_window_readings():
    samples = [(t, {"mem_used_mib": t}) for t in (0.0, 1.0, 2.0, 3.0)]
    assert T.in_window(samples, 0.5, 2.5) == samples[1:3]  # two inside: those
    assert T.in_window(samples, 1.5, 2.5) == samples[1:3]  # one inside: and the one before
    assert T.in_window(samples, 3.5, 4.0) == samples[3:]  # none inside: the nearest before
    assert T.in_window(samples, -1.0, -0.5) == []


def test_stop_ends_the_thread():
    monitor = T.Monitor(interval_s=0.01, gpu=False).start()
    time.sleep(0.05)
    monitor.stop()
    assert not any(t.name == "commbench-telemetry" for t in threading.enumerate())
    assert monitor.summary()["samples"] >= 3


@pytest.mark.skipif(_nvml_works(), reason="NVML works here: there is nothing to skip")
def test_without_nvml_the_gpu_part_is_skipped_with_one_note():
    with T.Monitor(interval_s=0.05) as monitor:
        monitor.mark()
        window = monitor.window()
    assert monitor.note.startswith("telemetry: ") and "GPU telemetry skipped" in monitor.note
    assert "\n" not in monitor.note and "mem_used_mib" in window and "gpu_util_pct" not in window


def test_without_nvidia_ml_py_the_note_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    monitor = T.Monitor(gpu=True)
    assert "nvidia-ml-py is not installed" in monitor.note and "pip install nvidia-ml-py" in monitor.note


class FakeNVMLError(Exception):
    pass


def fake_pynvml():
    """Two GPUs: utilisation 40/60 %, 1 GiB/3 GiB used, 100/300 W, 1500 MHz, PCIe rx 2000/4000 KB/s,
    NVLink counters that grow by 1024 KiB per read on GPU 0; GPU 1 has no NVLink (NotSupported)."""
    reads = {"nvlink": 0}
    value = lambda **kw: types.SimpleNamespace(**kw)  # noqa: E731

    def field_values(handle, fields):
        assert fields in ([(139, 0xFFFFFFFF)], [(138, 0xFFFFFFFF)])  # every link summed, not link 0 alone
        if handle == 1:
            return [value(nvmlReturn=3, value=None)]
        reads["nvlink"] += 1
        return [value(nvmlReturn=0, value=value(ullVal=1024 * reads["nvlink"]))]

    def by_bus_id(bus_id):
        if bus_id not in ("0000:10:00.0", "0000:11:00.0"):
            raise FakeNVMLError("NVML_ERROR_NOT_FOUND")
        return int(bus_id[5:7]) - 10
    return types.SimpleNamespace(
        NVMLError=FakeNVMLError, NVML_CLOCK_SM=1, NVML_PCIE_UTIL_RX_BYTES=1, NVML_PCIE_UTIL_TX_BYTES=0,
        NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX=139, NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX=138,
        nvmlInit=lambda: None, nvmlShutdown=lambda: None, nvmlDeviceGetCount=lambda: 2,
        nvmlDeviceGetHandleByIndex=lambda i: i, nvmlDeviceGetHandleByPciBusId=by_bus_id,
        nvmlDeviceGetUtilizationRates=lambda h: value(gpu=40 + 20 * h),
        nvmlDeviceGetMemoryInfo=lambda h: value(used=(1 + 2 * h) << 30),
        nvmlDeviceGetPowerUsage=lambda h: 100_000 + 200_000 * h,
        nvmlDeviceGetClockInfo=lambda h, clock: 1500,
        nvmlDeviceGetPcieThroughput=lambda h, counter: (2000 + 2000 * h) * counter,
        nvmlDeviceGetFieldValues=field_values)


def test_gpu_readings_through_nvml(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml())
    monitor = T.Monitor(interval_s=100)
    assert monitor.note is None
    reading = monitor.sample()
    assert reading["gpu_util_pct"] == 50 and reading["gpu_mem_used_mib"] == 2048 and reading["gpu_power_w"] == 200
    assert reading["sm_clock_mhz"] == 1500 and reading["pcie_rx_mbps.0"] == pytest.approx(2.0)  # per GPU
    assert reading["pcie_rx_mbps.1"] == pytest.approx(4.0) and reading["pcie_tx_mbps.0"] == 0
    assert reading["nvlink_rx_kib.0"] == 1024 and "nvlink_rx_kib.1" not in reading  # GPU 1 dropped NVLink
    assert (1, "nvlink_rx_kib") in monitor._nvml.broken and (0, "nvlink_rx_kib") not in monitor._nvml.broken
    monitor.mark()
    monitor.sample()  # the thread's reading inside the window
    window = monitor.window()
    assert window["nvlink_rx_mbps"] > 0 and window["gpu_util_pct"] == 50
    assert window["pcie_rx_mbps"] == pytest.approx(6.0)  # summed over GPUs
    line = T.summary_line(monitor.summary())
    assert line.startswith("telemetry: GPU util 50%, GPU mem 2048 MiB, power 200 W, SM clock 1500 MHz")
    assert "; mem " in line or "; CPU util" in line  # then the host part


def test_the_run_s_gpus_are_found_by_pci_bus_id(monkeypatch):
    """NVML numbers GPUs its own way (ignoring CUDA_VISIBLE_DEVICES): the run's are found by bus id."""
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml())
    monitor = T.Monitor(interval_s=100, gpu_bus_ids=["0000:11:00.0"])
    assert monitor.note is None and monitor._nvml.handles == [1]
    assert monitor.sample()["gpu_util_pct"] == 60
    unknown = T.Monitor(interval_s=100, gpu_bus_ids=["0000:99:00.0"])
    assert "GPU telemetry skipped" in unknown.note and "NOT_FOUND" in unknown.note


def test_sweep_monitor_watches_the_gpus_the_run_uses(monkeypatch, tmp_path):
    """Every rank reports its GPUs' bus ids; rank 0 watches those on its host."""
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml())
    monkeypatch.setattr(T, "cuda_bus_ids", lambda devices: [f"0000:{0x10 + d:02x}:00.0" for d in devices])

    class OnGpu1(SimBackend):
        device, gpus = "cuda", [1]
    cfg = SweepConfig(backend=BackendConfig(backend="sim", nprocs=4, hw="dgx-a100"), sizes=(1024,), monitor=True,
                      json_path=str(tmp_path / "r.jsonl"))
    sweep = Sweep(cfg, LaunchInfo.local(0, 1, 0), OnGpu1(4, Topology(1, 4), hardware=_hw()))
    assert sweep.monitor._nvml.handles == [1]
    sweep.monitor.stop()


def test_no_reading_between_the_barrier_and_the_timed_calls(tmp_path, monkeypatch):
    """--monitor: the window opens before the barrier, and rank 0 reads nothing on the
    calling thread between the barrier and the timed calls (only start and stop read there)."""
    log = []

    class Logged(SimBackend):
        def barrier(self):
            log.append("barrier")
            super().barrier()

        def time_iterations(self, call, iters):
            log.append("time")
            return super().time_iterations(call, iters)
    sample, mark = T.Monitor.sample, T.Monitor.mark
    monkeypatch.setattr(T.Monitor, "sample", lambda self: (
        log.append("read") if threading.current_thread() is threading.main_thread() else None, sample(self))[1])
    monkeypatch.setattr(T.Monitor, "mark", lambda self, label=None: (log.append("mark"), mark(self, label))[1])
    cfg = SweepConfig(backend=BackendConfig(backend="sim", nprocs=4, hw="dgx-a100"), sizes=(1024, 1 << 20), warmup=1,
                      iters=3, monitor=True, json_path=str(tmp_path / "r.jsonl"))
    assert Sweep(cfg, LaunchInfo.local(0, 1, 0), Logged(4, Topology(1, 4), hardware=_hw())).run() == 0
    assert log.count("read") == 2 and log[0] == "read" and log[-1] == "read"  # start() and stop()
    marks = [i for i, entry in enumerate(log) if entry == "mark"]
    assert len(marks) == 4 and all(log[i + 1:i + 3] == ["barrier", "time"] for i in marks), log


@pytest.mark.skipif(not _nvml_works(), reason="needs NVML and an NVIDIA GPU")
def test_real_nvml_reads_a_gpu():
    with T.Monitor(interval_s=0.05) as monitor:
        monitor.mark()
        time.sleep(0.2)
        window = monitor.window()
    assert monitor.note is None and 0 <= window["gpu_util_pct"] <= 100 and window["gpu_mem_used_mib"] > 0


def test_sweep_monitor_puts_averages_in_every_result_and_the_summary(tmp_path, capsys):
    cfg = SweepConfig(backend=BackendConfig(backend="sim", nprocs=4, hw="dgx-a100"), sizes=(1024, 1 << 20),
                      monitor=True, json_path=str(tmp_path / "r.jsonl"))
    assert Sweep(cfg, LaunchInfo.local(0, 1, 0), SimBackend(4, Topology(1, 4), hardware=_hw())).run() == 0
    results, records = results_of(tmp_path / "r.jsonl")
    assert len(results) == 4 and all(r["telemetry"]["samples"] >= 1 and r["telemetry"]["mem_used_mib"] > 0
                                     for r in results)  # sim's points are short: the nearest reading
    assert records[-1]["record"] == "summary" and records[-1]["telemetry"]["samples"] >= 2
    out = capsys.readouterr().out
    assert out.count("# telemetry: ") == (1 if _nvml_works() else 2)  # the note (no GPU), then the summary line
    assert out.rstrip().splitlines()[-1].startswith("# telemetry: ")


def _hw():
    from commbench.costmodel import load_hardware

    return load_hardware("dgx-a100")


def test_run_monitor_watches_the_runs_gpus_on_rank_0s_host(monkeypatch):
    """Every rank reports its GPUs' bus ids; rank 0 watches those on its own host only."""
    import socket

    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml())
    monkeypatch.setattr(T, "cuda_bus_ids", lambda devices: {0: ["0000:10:00.0"], 1: ["0000:11:00.0"]}[devices[0]])
    here = socket.gethostname()
    gathered = []

    class Rank:
        device = "cuda"

        def __init__(self, gpu, everyone):
            self.gpus, self.everyone = [gpu], everyone

        def gather_objects(self, mine):
            gathered.append(mine)
            return self.everyone

    elsewhere = ("other-host", ["0000:99:00.0"])  # not on this host: not watched (NVML would not find it)
    monitor = T.run_monitor(Rank(0, [(here, ["0000:11:00.0"]), elsewhere, (here, ["0000:10:00.0"])]), lead=True)
    assert gathered == [(here, ["0000:10:00.0"])] and monitor.note is None
    assert monitor._nvml.handles == [0, 1]  # both of this host's run GPUs, in bus-id order
    assert T.run_monitor(Rank(1, None), lead=False) is None  # the other ranks gather, and watch nothing
