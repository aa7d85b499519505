"""Parallel layouts trained for real on CPU ranks (`commbench train --layout`, and the ground truth of the
layout plans): the Llama and what it needs (`model`), its layout on the mesh (`build`: TP, PP, FSDP2 or DDP
from `parts`, ring attention from `ring`, the experts' MoE from `moe`), the calls traced (`trace`), one rank of
the `train` job (`run`) and local ranks spawned for the tests (`local`)."""
