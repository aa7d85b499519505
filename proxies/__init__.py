"""Model proxies (installed as commbench.proxies): the gradient traffic PyTorch DDP issues for
real models, replayed on any backend with the backward compute emulated, beside real training.

profile.py   a model's parameter tensors, FLOPs and gradient-ready order (shipped as profiles/*.json)
extract.py   builds a profile from a torchvision / timm / transformers model or module:callable
buckets.py   DDP's bucket assignment
timeline.py  the overlap timeline of one step (pure), and its executed form with an injectable clock
replay.py    runs a proxy on the ranks of a job; train.py runs real DDP training
"""
