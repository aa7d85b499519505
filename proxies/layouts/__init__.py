"""Parallel layouts, one wing: a layout's degrees and mesh (`parallelism`: `Parallelism`, the one value a
layout is, from its spelling to the ranks), the pipeline's orders (`pipeline`), a stage's share of the model
(`stage_share`), the calls each dimension issues (`calls`), a layer's operators at the layout's shapes
(`layer_ops`) and a rank's compute from them (`compute`), memory per GPU (`memory`, `memory_measure`), the
replay on real ranks (`replay`), and real training under `train/` (docs/layouts.md)."""
