"""Telemetry: what the hardware did while commbench measured (GPUs through NVML, the host through psutil).

A sampler thread reads the counters every `interval_s`; `mark()` and `window()` only note
the time (a reading can block for milliseconds: NVML's PCIe counters sample for ~20 ms
per GPU, and no caller should wait for that between a barrier and its timed calls).
A window's averages come from the thread's readings taken inside it; when fewer than
two fall inside, the last reading before it is added, so a window shorter than the
interval still reports its gauges (from the nearest readings) and, given one reading
inside, its rates:

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
  samples (readings averaged), window_s (the time they span)
Summed metrics are kept per GPU in a reading (pcie_rx_mbps.0, nvlink_rx_kib.1, ...) and
summed after averaging, so a GPU whose counter stops answering mid-run changes no rate
of the others (and a counter that goes backwards gives no rate, never a negative one).
mbps here is MB/s (1e6 bytes per second), as gbps is GB/s everywhere in commbench.
The OS counts CPU time in ticks (10 ms): a window shorter than a few ticks leaves
cpu_util_pct out rather than report a number it could not measure.

Without nvidia-ml-py, without an NVIDIA driver or without a GPU the GPU part is
skipped (`note` says why) and the host part still works; psutil is needed for the
host part (`pip install psutil`). NVML sees every GPU of the host; pass `gpu_bus_ids`
(PCI bus ids, e.g. from `cuda_bus_ids`: NVML numbers GPUs its own way, ignoring
CUDA_VISIBLE_DEVICES) or `gpu_indices` (NVML order) to watch only some. The thread
wakes every interval and holds the GIL briefly: on CPU backends timed in microseconds
it can add noise. NVLink throughput is read summed over all links (scope id UINT_MAX,
as nvml.h defines it); not yet read on a real GPU.
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


def cuda_bus_ids(devices: list[int] | None = None) -> list[str]:
    """PCI bus ids of CUDA devices as this process numbers them (default: the current one),
    through CuPy, else torch; [] when neither can tell."""
    try:
        import cupy

        return [cupy.cuda.Device(d).pci_bus_id for d in (devices if devices is not None else [cupy.cuda.Device().id])]
    except Exception:  # noqa: BLE001 - no CuPy, or a CuPy that sees no GPU: try torch
        pass
    try:
        import torch

        if not torch.cuda.is_available():
            return []
        found = []
        for d in devices if devices is not None else [torch.cuda.current_device()]:
            props = torch.cuda.get_device_properties(d)
            found.append(f"{props.pci_domain_id:04x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0")
        return found
    except Exception:  # noqa: BLE001 - torch without these properties, or no driver
        return []


_ALL_LINKS = 0xFFFFFFFF  # NVML's scope id for "summed over all links"


class _Nvml:
    """NVML readings of some GPUs; a metric a device does not support is dropped after its first error."""

    def __init__(self, gpu_indices: list[int] | None, gpu_bus_ids: list[str] | None = None):
        import pynvml

        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
        if count == 0:
            raise RuntimeError("NVML sees no GPU")
        self.nvml = pynvml
        if gpu_bus_ids:
            self.handles = [pynvml.nvmlDeviceGetHandleByPciBusId(bus_id) for bus_id in gpu_bus_ids]
        else:
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
        # nvml.h: the NVLink throughput fields take the link in scopeId, and UINT_MAX sums every link;
        # a bare field id would leave scopeId 0 and count link 0 alone
        value = self.nvml.nvmlDeviceGetFieldValues(handle, [(field, _ALL_LINKS)])[0]
        if value.nvmlReturn != 0:
            raise self.nvml.NVMLError(value.nvmlReturn)
        return float(value.value.ullVal)

    def read(self) -> Reading:
        """Means over GPUs of the gauges; summed metrics per GPU (`name.index`), summed by averages()."""
        reading: Reading = {}
        per_metric: dict[str, list[float]] = {}
        for index, handle in enumerate(self.handles):
            for name, get in self._metrics(handle).items():
                if (index, name) in self.broken:
                    continue
                try:
                    value = get()
                except self.nvml.NVMLError:
                    self.broken.add((index, name))
                    continue
                if name in _SUMMED:
                    reading[f"{name}.{index}"] = value
                else:
                    per_metric.setdefault(name, []).append(value)
        reading.update({k: sum(v) / len(v) for k, v in per_metric.items()})
        return reading

    def close(self) -> None:
        try:
            self.nvml.nvmlShutdown()
        except self.nvml.NVMLError:
            pass


def _open_nvml(gpu_indices: list[int] | None, gpu_bus_ids: list[str] | None) -> tuple[_Nvml | None, str | None]:
    """(NVML reader, None), or (None, why the GPU part is skipped)."""
    try:
        import pynvml  # noqa: F401 - from nvidia-ml-py
    except ImportError:
        return None, "telemetry: nvidia-ml-py is not installed: GPU telemetry skipped (pip install nvidia-ml-py)"
    try:
        return _Nvml(gpu_indices, gpu_bus_ids), None
    except Exception as exc:  # noqa: BLE001 - NVMLError_LibraryNotFound, DriverNotLoaded, no GPU, unknown bus id
        return None, f"telemetry: no NVIDIA GPU or driver ({str(exc) or type(exc).__name__}): GPU telemetry skipped"


def averages(samples: list[tuple[float, Reading]]) -> Reading:
    """Means of the gauges and rates of the counters over `samples` (time, reading), oldest
    first; per-GPU keys (`name.index`) are summed over GPUs."""
    if not samples:
        return {}
    out: Reading = {"samples": float(len(samples)), "window_s": samples[-1][0] - samples[0][0]}
    for key in sorted({k for _, r in samples for k in r} - {"cpu_total_s"}):
        base = key.split(".")[0]
        if base in _RATES:
            name, scale = _RATES[base]
            rate = _rate(samples, key)
            if rate is not None:
                out[name] = out.get(name, 0.0) + rate * scale
        else:
            values = [r[key] for _, r in samples if key in r]
            out[base] = out.get(base, 0.0) + sum(values) / len(values)
    return out


def _rate(samples: list[tuple[float, Reading]], key: str) -> float | None:
    """Growth per second of a counter between the first and last readings that have it (CPU
    time: per second of CPU time); None for one reading, no time between, or a counter that
    went backwards (reset), rather than a wrong or negative rate."""
    having = [(t, r) for t, r in samples if key in r]
    if len(having) < 2:
        return None
    (t0, first), (t1, last) = having[0], having[-1]
    span = last.get("cpu_total_s", 0.0) - first.get("cpu_total_s", 0.0) if key == "cpu_busy_s" else t1 - t0
    grown = last[key] - first[key]
    return grown / span if span > 0 and grown >= 0 else None


def in_window(samples: list[tuple[float, Reading]], start: float, end: float) -> list[tuple[float, Reading]]:
    """The readings taken in [start, end], and the last one before `start` when fewer than two are inside."""
    inside = [s for s in samples if start <= s[0] <= end]
    if len(inside) >= 2:
        return inside
    return [s for s in samples if s[0] < start][-1:] + inside


class Monitor:
    """Samples GPUs (NVML) and the host (psutil) on a thread; see the module docstring."""

    def __init__(self, interval_s: float = 0.1, gpu: bool = True, gpu_indices: list[int] | None = None,
                 gpu_bus_ids: list[str] | None = None):
        self.interval_s = interval_s
        self._nvml, self.note = _open_nvml(gpu_indices, gpu_bus_ids) if gpu else (None, None)
        self._host = _host_reader()
        if self._host is None:
            self.note = "; ".join(filter(None, [self.note,
                                                "telemetry: psutil is not installed: host telemetry skipped"]))
        self._samples: list[tuple[float, Reading]] = []
        self._mark_s, self.label = time.monotonic(), None
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

    def start(self) -> Monitor:
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

    def __enter__(self) -> Monitor:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def mark(self, label: str | None = None) -> None:
        """Open a window now: notes the time only, takes no reading (never blocks)."""
        with self._lock:
            self._mark_s, self.label = time.monotonic(), label

    def window(self) -> Reading:
        """Averages over the thread's readings from the last mark() to now (see the module
        docstring for short windows); takes no reading itself."""
        end_s = time.monotonic()
        with self._lock:
            return averages(in_window(self._samples, self._mark_s, end_s))

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


def run_monitor(backend: Any, lead: bool) -> Monitor | None:
    """--monitor of a sweep, proxy or train run (every rank calls this: it gathers): each rank
    reports the PCI bus ids of its GPUs; `lead` (rank 0) gets an unstarted Monitor of its host
    that watches those of them on its host (every GPU when the run is not on GPUs, or the ids
    are unknown), the other ranks None."""
    import socket

    on_gpu = backend.device == "cuda"
    mine = (socket.gethostname(), cuda_bus_ids(getattr(backend, "gpus", None))) if on_gpu else None
    everyone = backend.gather_objects(mine)
    if not lead:
        return None
    host = socket.gethostname()
    bus_ids = sorted({b for place in everyone or [] if place and place[0] == host for b in place[1]})
    monitor = Monitor(gpu_bus_ids=bus_ids or None)
    if on_gpu and not bus_ids and monitor.note is None:
        monitor.note = "telemetry: the run's GPUs have no known PCI bus id: watching every GPU of the host"
    return monitor
