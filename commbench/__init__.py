"""commbench: communication-library microbenchmarks and model proxies for distributed training."""

__version__ = "0.1.0"
