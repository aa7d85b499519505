"""commbench: communication-library microbenchmarks and model proxies for distributed training."""
import re
from pathlib import Path

from setuptools import find_packages, setup

HERE = Path(__file__).parent
VERSION = re.search(r'__version__ = "([^"]+)"', (HERE / "commbench" / "__init__.py").read_text()).group(1)

setup(
    name="commbench",
    version=VERSION,
    description="Collective-communication benchmarks (nccl-tests-style sweeps over torch.distributed) "
                "and model proxies for distributed training",
    long_description=(HERE / "README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",  # kw_only dataclasses (commands/helpers/ranks_options.py)
    # analysis/ and proxies/ install as commbench.analysis and commbench.proxies (no top-level
    # `analysis` or `proxies` module); presets, the published corpus and its calibration, and model
    # profiles ship as data. The CUDA kernels
    # in cuda/ ship as commbench/cuda/*.cu (data, no __init__.py: a top-level `cuda` package would
    # shadow NVIDIA's `cuda` namespace that CuPy imports).
    packages=find_packages(include=["commbench", "commbench.*"]) + [
        "commbench.analysis", "commbench.analysis.corpus", "commbench.proxies", "commbench.proxies.models",
        "commbench.proxies.layouts", "commbench.proxies.layouts.train", "commbench.proxies.traces", "commbench.cuda"],
    package_dir={"commbench.analysis": "analysis", "commbench.proxies": "proxies", "commbench.cuda": "cuda"},
    package_data={"commbench": ["presets/*.json", "presets/README.md", "presets/tuning/*.json"],
                  "commbench.analysis.corpus": ["*.json", "README.md"],
                  "commbench.proxies": ["profiles/*.json"], "commbench.backends.shm": ["shm_native.c"],
                  "commbench.cuda": ["*.cu", "*.cuh", "*.h"]},
    # Ranges, not pins: a cluster's own torch build (CUDA, NCCL) must keep working. The floors are the oldest
    # releases run (README, "Which torch": 2.6.0 and 2.1.2 fail; cli.TORCH_FLOOR says the same).
    install_requires=["torch>=2.11", "numpy>=1.22", "click>=8.0", "scipy>=1.8", "matplotlib>=3.5"],
    extras_require={
        "test": ["pytest>=7", "pytest-xdist>=3", "psutil>=5", "ruff>=0.6"],
        # Real model definitions for profiles and `commbench train` (random init, no weights downloaded).
        # torchvision 0.26 pairs with torch 2.11; transformers 4.49 lacks the AttentionInterface CP trains with, and
        # under 5.0 and 5.1 a GPT-2's or BERT's DDP and FSDP2 calls differ from its profile's (README, "Which torch").
        "models": ["torchvision>=0.26", "timm>=0.9", "transformers>=5.2"],
        "mpi": ["mpi4py>=3.1"],
        # benchmarks/deepspeed_peer.py: DeepSpeed's CPU shared-memory allreduce as a peer (its op builds with g++).
        "deepspeed": ["deepspeed>=0.14"],
        # CUDA 12: CuPy with NVRTC and the CUDA headers (its ctk extra), NCCL, NVML; the CuPy wheel
        # alone has neither NCCL nor NVRTC. On CUDA 13 install the -cuda13x/-cu13 names (docs/gpu.md).
        "gpu": ["cupy-cuda12x[ctk]>=14", "nvidia-nccl-cu12", "nvidia-ml-py>=12"],
    },
    entry_points={"console_scripts": ["commbench=commbench.cli:main"]},
    classifiers=["Programming Language :: Python :: 3", "Topic :: System :: Distributed Computing",
                 "Environment :: GPU :: NVIDIA CUDA"],
)
