"""How a replayed step hands its buckets to the communication library, as DDP does.

- `WorkChannel` (torch.distributed, gloo or NCCL): each bucket's allreduce is launched
  asynchronously from the step's own thread the moment it is ready, as DDP's Reducer
  launches it from the autograd hook; the library queues and runs it as it runs DDP's
  (gloo with its worker threads, two by default, so two buckets may be in flight; NCCL in
  order on its stream). A waiter thread waits on the works in launch order and notes when
  each is done.
- `ThreadChannel` (commbench's own schedules, shm/p2p/hybrid, whose calls block): one
  communication thread runs the prepared calls one after another.

Both give (start, end) per bucket in wall time: start is the launch, end the completion.
"""
from __future__ import annotations

import queue
import threading
from typing import Any, Callable

from commbench.proxies.clocks import SleepClock


class _Waiter:
    """A daemon thread that runs `finish(item)` for queued items in order; errors go to wait_all."""

    def __init__(self, finish: Callable[[Any], tuple[float, float]], init: Callable[[], None] | None, name: str):
        self.finish, self.init = finish, init
        self.pending: queue.SimpleQueue = queue.SimpleQueue()
        self.done: queue.SimpleQueue = queue.SimpleQueue()
        self.launched = 0
        self.finished: list = []  # results taken from `done` so far in this step (wait_for)
        self.error: BaseException | None = None  # the first call that failed, for the compute to see (watch)
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        if self.init:
            self.init()  # e.g. the rank's CUDA device: the current device is per thread
        while True:
            item = self.pending.get()
            if item is None:
                return
            try:
                self.done.put(self.finish(item))
            except BaseException as exc:  # noqa: BLE001 - handed to the main thread, which reports it
                self.error = self.error or exc
                self.done.put(exc)

    def submit(self, item: Any) -> None:
        self.launched += 1
        self.pending.put(item)

    def wait_for(self, count: int) -> None:
        """Block until the first `count` items launched this step are done (they finish in launch order)."""
        while len(self.finished) < min(count, self.launched):
            item = self.done.get()
            self.finished.append(item)
            if isinstance(item, BaseException):
                raise item

    def wait_all(self) -> list[tuple[float, float]]:
        error = next((item for item in self.finished if isinstance(item, BaseException)), None)
        for _ in range(self.launched - len(self.finished)):
            item = self.done.get()
            error = error or (item if isinstance(item, BaseException) else None)
            self.finished.append(item)
        intervals = [item for item in self.finished if not isinstance(item, BaseException)]
        self.launched, self.finished = 0, []
        if error is not None:
            raise error
        return intervals

    def close(self, timeout_s: float = 1.0) -> None:
        self.pending.put(None)
        self.thread.join(timeout=timeout_s)


class ThreadChannel:
    """Blocking calls (commbench's schedules) run one after another on a communication thread."""

    def __init__(self, calls: list[Callable[[], None]], synchronize: Callable[[], None], clock: SleepClock):
        self.calls, self.synchronize, self.clock = calls, synchronize, clock
        self.waiter = _Waiter(self._run_one, None, "commbench-comm")
        clock.watch(lambda: self.waiter.error)

    def _run_one(self, bucket: int) -> tuple[float, float]:
        start = self.clock.now_us()
        self.calls[bucket]()
        self.synchronize()
        return start, self.clock.now_us()

    def launch(self, bucket: int) -> None:
        self.waiter.submit(bucket)

    def wait_for(self, count: int) -> None:
        self.waiter.wait_for(count)

    def wait_all(self) -> list[tuple[float, float]]:
        return self.waiter.wait_all()

    def close(self) -> None:
        self.waiter.close()


class WorkChannel:
    """torch.distributed: async allreduce at launch, as DDP; a waiter thread times completions."""

    def __init__(self, buffers: list[Any], clock: SleepClock, device: Any = None,
                 issue: list[Callable[[], Any]] | None = None):
        """`issue[i]()` launches call i and returns its work (default: an allreduce of buffers[i])."""
        import torch
        import torch.distributed as dist

        self.buffers, self.clock, self.dist = buffers, clock, dist
        self.issue = issue or [lambda b=b: dist.all_reduce(b, async_op=True) for b in buffers]
        on_gpu = device is not None and getattr(device, "type", device) == "cuda"
        self.sync = (lambda: torch.cuda.synchronize(device)) if on_gpu else (lambda: None)
        init = (lambda: torch.cuda.set_device(device)) if on_gpu else None
        self.waiter = _Waiter(self._finish, init, "commbench-wait")
        clock.watch(lambda: self.waiter.error)

    def _finish(self, item: tuple[float, Any]) -> tuple[float, float]:
        start, work = item
        work.wait()
        self.sync()  # NCCL: wait() orders streams; the host waits for the device here
        return start, self.clock.now_us()

    def launch(self, bucket: int) -> None:
        start = self.clock.now_us()
        self.waiter.submit((start, self.issue[bucket]()))

    def wait_for(self, count: int) -> None:
        self.waiter.wait_for(count)

    def wait_all(self) -> list[tuple[float, float]]:
        return self.waiter.wait_all()

    def close(self) -> None:
        self.waiter.close()
