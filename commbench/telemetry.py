"""Telemetry: what the hardware did while commbench measured (GPUs through NVML, the host through psutil).

A sampler thread reads the counters every `interval_s`; windows opened with `mark()`
and closed with `window()` return averages over the samples in between (a sample is
also taken at both ends, so a window shorter than the interval still has two):

    from commbench.telemetry import Monitor

    with Monitor(interval_s=0.1) as monitor:     # or monitor.start() ... monitor.stop()
        if monitor.note:
            print(monitor.note)                  # why the GPU part is off (one line), else None
        monitor.mark("allreduce 64M")
        ...                                      # the work to observe
        averages = monitor.window()              # {"gpu_util_pct": 97.0, "cpu_util_pct": 12.5, ...}
    print(monitor.summary_line())                # the whole run in one line; monitor.summary() as a dict

Keys, units in the names (a key is absent when the driver or OS does not expose it):
  gpu_util_pct, gpu_mem_used_mib, gpu_power_w, sm_clock_mhz   mean over samples and monitored GPUs
  pcie_rx_mbps, pcie_tx_mbps, nvlink_rx_mbps, nvlink_tx_mbps  summed over monitored GPUs
  cpu_util_pct (all cores), mem_used_mib, nic_rx_mbps, nic_tx_mbps (every interface but loopback)
  samples, window_s
mbps here is MB/s (1e6 bytes per second), as gbps is GB/s everywhere in commbench.
The OS counts CPU time in ticks (10 ms): a window shorter than a few ticks leaves
cpu_util_pct out rather than report a number it could not measure.

Without nvidia-ml-py, without an NVIDIA driver or without a GPU the GPU part is
skipped (`note` says why) and the host part still works; psutil is needed for the
host part (`pip install psutil`). NVML sees every GPU of the host; pass
`gpu_indices` (NVML order) to watch only some. The thread wakes every interval and
holds the GIL briefly: on CPU backends timed in microseconds it can add noise.
"""
from __future__ import annotations

import threading
import time
from typing import Any, Callable

Reading = dict[str, float]

# Counters become rates over a window: name -> (rate key, scale to the key's unit per second).
_RATES = {"cpu_busy_s": ("cpu_util_pct", 100.0), "nic_rx_bytes": ("nic_rx_mbps", 1e-6),
          "nic_tx_bytes": ("nic_tx_mbps", 1e-6), "nvlink_rx_kib": ("nvlink_rx_mbps", 1024e-6),
          "nvlink_tx_kib": ("nvlink_tx_mbps", 1024e-6)}
_SUMMED = ("pcie_rx_mbps", "pcie_tx_mbps", "nvlink_rx_kib", "nvlink_tx_kib")  # over GPUs; the rest are means


def _host_reader() -> Callable[[], Reading] | None:
    try:
        import psutil
    except ImportError:
        return None

    def read() -> Reading:
        cpu = psutil.cpu_times()
        idle = cpu.idle + getattr(cpu, "iowait", 0.0)
        nics = psutil.net_io_counters(pernic=True)
        outside = [c for name, c in nics.items() if not name.startswith("lo")]  # lo, lo0: loopback
        return {"cpu_busy_s": sum(cpu) - idle, "cpu_total_s": sum(cpu),
                "mem_used_mib": psutil.virtual_memory().used / 2 ** 20,
                "nic_rx_bytes": float(sum(c.bytes_recv for c in outside)),
                "nic_tx_bytes": float(sum(c.bytes_sent for c in outside))}
    return read


class _Nvml:
    """NVML readings of some GPUs; a metric a device does not support is dropped after its first error."""

    def __init__(self, gpu_indices: list[int] | None):
        import pynvml

        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
        if count == 0:
            raise RuntimeError("NVML sees no GPU")
        self.nvml = pynvml
        self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in (gpu_indices or range(count))]
        self.broken: set[tuple[int, str]] = set()

    def _metrics(self, handle: Any) -> dict[str, Callable[[], float]]:
        n = self.nvml
        return {
            "gpu_util_pct": lambda: float(n.nvmlDeviceGetUtilizationRates(handle).gpu),
            "gpu_mem_used_mib": lambda: n.nvmlDeviceGetMemoryInfo(handle).used / 2 ** 20,
            "gpu_power_w": lambda: n.nvmlDeviceGetPowerUsage(handle) / 1000.0,
            "sm_clock_mhz": lambda: float(n.nvmlDeviceGetClockInfo(handle, n.NVML_CLOCK_SM)),
            "pcie_rx_mbps": lambda: n.nvmlDeviceGetPcieThroughput(handle, n.NVML_PCIE_UTIL_RX_BYTES) * 1e-3,
            "pcie_tx_mbps": lambda: n.nvmlDeviceGetPcieThroughput(handle, n.NVML_PCIE_UTIL_TX_BYTES) * 1e-3,
            "nvlink_rx_kib": lambda: self._field(handle, n.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX),
            "nvlink_tx_kib": lambda: self._field(handle, n.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX),
        }

    def _field(self, handle: Any, field: int) -> float:
        value = self.nvml.nvmlDeviceGetFieldValues(handle, [field])[0]
        if value.nvmlReturn != 0:
            raise self.nvml.NVMLError(value.nvmlReturn)
        return float(value.value.ullVal)

    def read(self) -> Reading:
        per_metric: dict[str, list[float]] = {}
        for index, handle in enumerate(self.handles):
            for name, get in self._metrics(handle).items():
                if (index, name) in self.broken:
                    continue
                try:
                    per_metric.setdefault(name, []).append(get())
                except self.nvml.NVMLError:
                    self.broken.add((index, name))
        return {k: (sum(v) if k in _SUMMED else sum(v) / len(v)) for k, v in per_metric.items() if v}

    def close(self) -> None:
        try:
            self.nvml.nvmlShutdown()
        except self.nvml.NVMLError:
            pass


def _open_nvml(gpu_indices: list[int] | None) -> tuple[_Nvml | None, str | None]:
    """(NVML reader, None), or (None, why the GPU part is skipped)."""
    try:
        import pynvml  # noqa: F401 - from nvidia-ml-py
    except ImportError:
        return None, "telemetry: nvidia-ml-py is not installed: GPU telemetry skipped (pip install nvidia-ml-py)"
    try:
        return _Nvml(gpu_indices), None
    except Exception as exc:  # noqa: BLE001 - NVMLError_LibraryNotFound, DriverNotLoaded, no GPU
        return None, f"telemetry: no NVIDIA GPU or driver ({str(exc) or type(exc).__name__}): GPU telemetry skipped"


def averages(samples: list[tuple[float, Reading]]) -> Reading:
    """Means of the gauges and rates of the counters over `samples` (time, reading), oldest first."""
    if not samples:
        return {}
    (t0, first), (t1, last) = samples[0], samples[-1]
    out: Reading = {"samples": float(len(samples)), "window_s": t1 - t0}
    for key in {k for _, r in samples for k in r}:
        if key in _RATES:
            name, scale = _RATES[key]
            span = (last.get("cpu_total_s", 0.0) - first.get("cpu_total_s", 0.0)) if key == "cpu_busy_s" else t1 - t0
            if key in first and key in last and span > 0:
                out[name] = (last[key] - first[key]) / span * scale
        elif key != "cpu_total_s":
            values = [r[key] for _, r in samples if key in r]
            out[key] = sum(values) / len(values)
    return out


class Monitor:
    """Samples GPUs (NVML) and the host (psutil) on a thread; see the module docstring."""

    def __init__(self, interval_s: float = 0.1, gpu: bool = True, gpu_indices: list[int] | None = None):
        self.interval_s = interval_s
        self._nvml, self.note = _open_nvml(gpu_indices) if gpu else (None, None)
        self._host = _host_reader()
        if self._host is None:
            self.note = "; ".join(filter(None, [self.note, "telemetry: psutil is not installed: host telemetry skipped"]))
        self._samples: list[tuple[float, Reading]] = []
        self._mark, self.label = 0, None
        self._lock, self._stop = threading.Lock(), threading.Event()
        self._thread: threading.Thread | None = None

    def sample(self) -> Reading:
        """Take one reading now (the thread calls this every interval)."""
        reading: Reading = {}
        for source in (self._host, self._nvml.read if self._nvml else None):
            if source is not None:
                reading.update(source())
        with self._lock:
            self._samples.append((time.monotonic(), reading))
        return reading

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def start(self) -> "Monitor":
        if self._thread is None:
            self.sample()
            self._thread = threading.Thread(target=self._run, name="commbench-telemetry", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
            self.sample()
        if self._nvml is not None:
            self._nvml.close()
            self._nvml = None

    def __enter__(self) -> "Monitor":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def mark(self, label: str | None = None) -> None:
        """Open a window here (a sample now is its first)."""
        self.sample()
        with self._lock:
            self._mark, self.label = len(self._samples) - 1, label

    def window(self) -> Reading:
        """Averages from the last mark() to now (a sample now is the window's last)."""
        self.sample()
        with self._lock:
            return averages(self._samples[self._mark:])

    def summary(self) -> Reading:
        """Averages over every sample since start()."""
        with self._lock:
            return averages(list(self._samples))

    def summary_line(self) -> str:
        return summary_line(self.summary())


def summary_line(values: Reading) -> str:
    """`telemetry: GPU util 97% ...; CPU util 12% ...` from averages (absent keys left out)."""
    def part(label: str, keys: tuple[str, ...], unit: str, digits: int = 0) -> str | None:
        found = [values[k] for k in keys if k in values]
        if len(found) != len(keys):
            return None
        return f"{label} {'/'.join(f'{v:.{digits}f}' for v in found)}{unit}"
    gpu = [part("GPU util", ("gpu_util_pct",), "%"), part("GPU mem", ("gpu_mem_used_mib",), " MiB"),
           part("power", ("gpu_power_w",), " W"), part("SM clock", ("sm_clock_mhz",), " MHz"),
           part("PCIe rx/tx", ("pcie_rx_mbps", "pcie_tx_mbps"), " MB/s", 1),
           part("NVLink rx/tx", ("nvlink_rx_mbps", "nvlink_tx_mbps"), " MB/s", 1)]
    host = [part("CPU util", ("cpu_util_pct",), "%"), part("mem", ("mem_used_mib",), " MiB"),
            part("NIC rx/tx", ("nic_rx_mbps", "nic_tx_mbps"), " MB/s", 2)]
    groups = [", ".join(p for p in group if p) for group in (gpu, host)]
    span = f" ({values.get('samples', 0):.0f} samples over {values.get('window_s', 0.0):.1f} s)"
    return "telemetry: " + "; ".join(g for g in groups if g) + span
