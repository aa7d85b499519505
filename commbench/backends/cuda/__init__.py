"""The CUDA wing of backends/: everything that runs on NVIDIA GPUs through CuPy.

- `sched`: `--backend cuda`, commbench's schedules run by the kernels in cuda/, in the virtual
  and peer pointer modes (every rank in this process); `ipc`: the ipc mode (one process per
  GPU, buffers shared through CUDA IPC) and the factory that picks the mode's class.
- `plan`: how a schedule is cut into launches (tables, grids, staging), pure Python, tested
  without a GPU; `kernels`: finding, compiling (NVRTC) and loading the .cu files.
- `nccl`: `--backend cupy`, NCCL's collectives through CuPy.
- `device`: what both backends share (finding a GPU, element storage, CUDA-event timing).
- `host`: the same kernels built for the CPU, and `checks`: the kernel checks run against
  NumPy on that build (tests, `commbench selftest`) and against CuPy on a GPU.

Nothing here imports CuPy at module level, and this file imports nothing: the registry
(backends/registry.py) loads a backend's module only when it is asked for.
"""
