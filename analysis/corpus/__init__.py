"""Published figures commbench checks its model against, as JSON beside their loaders (README.md here says
what each file holds and where every figure was read):
- `published.json`, `published.py`: data-parallel training throughput by GPU count (benchmarks/model_published.py);
- `collectives.json`, `collectives.py`: nccl-tests figures, and the interval they give `predict` without a fit;
- `layouts.json`, `layouts.py`: multi-dimensional (TP, PP, CP, EP) training throughput (benchmarks/model_layouts.py);
- `calibration.json`: the published rows' residuals that analysis/calibration.py reads.
`files.py` is what the loaders read alike. Reading a corpus runs no code: JSON, every field checked.
"""
