"""Transformer-XL large, at the sizes of NVIDIA's wt103_large.yaml (the definition and its sources:
proxies/models/transformer_xl.py); a module of its own because a segment is 384 tokens, not the base's 192."""
from commbench.proxies.models import transformer_xl as X


def example_inputs(batch: int, device="cpu") -> tuple:
    return X.example_inputs(batch, device, X.LARGE)


def build() -> X.TransformerXL:
    return X.TransformerXL(**X.LARGE)
