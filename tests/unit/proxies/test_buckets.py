"""DDP bucketing: the rule on hand-made profiles, and the layouts of real models against
torch's own Reducer (a real DDP model on gloo with 2 ranks; a comm hook records every
bucket's parameters from the second iteration on, after DDP has rebuilt its buckets)."""
import os

import pytest

from commbench.launch import free_port
from commbench.proxies import buckets as B
from commbench.proxies.profile import Profile, TensorSpec, load_profile

MIB = 1 << 20


def profile_of(sizes_bytes, dtype="float32", ready=None):
    """Tensors of the given byte sizes (float32), gradients ready in reverse registration order."""
    n = len(sizes_bytes)
    ready = ready or list(range(n))[::-1]
    tensors = tuple(TensorSpec(f"t{i}", (size // 4,), dtype, float(ready[i] + 1), ready[i])
                    for i, size in enumerate(sizes_bytes))
    return Profile("toy", tensors, 1.0, float(n), (1,), "samples", 1)


def test_default_cap_has_a_one_mib_first_bucket():
    # ready order: t5 t4 t3 t2 t1 t0
    profile = profile_of([20 * MIB, 3 * MIB, 20 * MIB, 10 * MIB, MIB // 2, MIB // 2])
    layout = B.assign(profile)
    assert [b.tensors for b in layout] == [(5, 4), (3, 2), (1, 0)]
    assert [b.nbytes for b in layout] == [MIB, 30 * MIB, 23 * MIB]


def test_an_explicit_cap_applies_to_the_first_bucket_too():
    profile = profile_of([4 * MIB, 3 * MIB, 2 * MIB, 1 * MIB, MIB // 2, MIB // 2])
    layout = B.assign(profile, bucket_mb=4)
    assert [b.tensors for b in layout] == [(5, 4, 3, 2), (1, 0)]  # 4 MiB closes the first; the rest
    assert [b.nbytes for b in layout] == [4 * MIB, 7 * MIB]


def test_a_bucket_overshoots_by_one_tensor_and_the_rest_is_the_last_bucket():
    profile = profile_of([MIB, 10 * MIB, 20 * MIB, 2 * MIB])
    layout = B.assign(profile)
    assert [b.tensors for b in layout] == [(3,), (2, 1), (0,)]  # 2 MiB >= 1 MiB; 30 MiB >= 25; remainder
    assert layout[1].nbytes == 30 * MIB


def test_modes_none_and_single():
    profile = profile_of([MIB, 2 * MIB, 3 * MIB])
    assert [b.tensors for b in B.assign(profile, mode="none")] == [(2,), (1,), (0,)]
    single = B.assign(profile, mode="single")
    assert len(single) == 1 and single[0].nbytes == 6 * MIB and single[0].ready_flops == 3.0


def test_buckets_follow_the_gradient_ready_order_not_registration():
    profile = profile_of([MIB, MIB, MIB], ready=[1, 0, 2])  # t1 ready first, then t0, then t2
    assert [b.tensors for b in B.assign(profile, mode="none")] == [(1,), (0,), (2,)]


def test_dtypes_fill_separate_buckets():
    tensors = (TensorSpec("a", (MIB // 4,), "float32", 1.0, 0), TensorSpec("b", (MIB // 2,), "float16", 2.0, 1),
               TensorSpec("c", (MIB // 4,), "float32", 3.0, 2))
    layout = B.assign(Profile("mixed", tensors, 1.0, 3.0, (1,), "samples", 1))
    assert [(b.dtype, b.tensors) for b in layout] == [("float32", (0,)), ("float16", (1,)), ("float32", (2,))]


def test_a_bucket_is_ready_with_its_last_gradient():
    profile = profile_of([MIB, MIB, 30 * MIB])
    layout = B.assign(profile)
    assert [b.ready_flops for b in layout] == [1.0, 3.0]  # t2 alone (>= 1 MiB), then t1+t0


def test_bad_bucketing_arguments():
    profile = profile_of([MIB])
    with pytest.raises(ValueError, match="must be positive"):
        B.assign(profile, bucket_mb=0)
    with pytest.raises(ValueError, match="unknown bucketing"):
        B.assign(profile, mode="fancy")


# ---------------------------------------------------------------- against torch's Reducer


# Small images: the buckets follow the order gradients become ready, which the image size does not change
# (resnet50 at 32x32 reaches its 1x1 pooled map; 64x64 took 4x the suite's time for the same layouts).
CASES = [("resnet50", (3, 32, 32), None), ("vgg16", (3, 32, 32), None), ("resnet50", (3, 32, 32), 5)]


def _ddp_rank(rank, world, port, cases, out):
    """One rank of the job that wraps each case's model in DDP in turn (one process group, one spawn for all)."""
    import torch
    import torch.distributed as dist
    import torchvision

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    layouts = {}
    for model_name, input_shape, bucket_mb in cases:
        torch.manual_seed(0)
        model = torchvision.models.get_model(model_name, weights=None)
        ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=bucket_mb)  # None: DDP's default
        names = {p.data_ptr(): n for n, p in model.named_parameters()}
        seen = []

        def hook(state, bucket, names=names, seen=seen):
            seen.append((bucket.index(), [names[p.data_ptr()] for p in bucket.parameters()]))
            fut = torch.futures.Future()
            fut.set_result(bucket.buffer())  # the layout is what is tested; skip the traffic
            return fut
        ddp.register_comm_hook(None, hook)
        x = torch.randn(2, *input_shape)
        for _ in range(2):  # the second forward runs on the buckets DDP rebuilt from the first backward's order
            seen.clear()
            ddp(x).sum().backward()
        layouts[(model_name, input_shape, bucket_mb)] = [params for _, params in sorted(seen)]
        del ddp, model
    if rank == 0:
        out.put(layouts)
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def reducer_layouts():
    """{case: torch's Reducer's buckets (parameter names)} for every case, from one 2-rank spawn."""
    pytest.importorskip("torchvision")
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_ddp_rank, args=(r, 2, port, CASES, out)) for r in range(2)]
    for p in procs:
        p.start()
    layouts = out.get(timeout=300)
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    return layouts


@pytest.mark.parametrize("model_name,input_shape,bucket_mb", CASES)
def test_layout_matches_torch_reducer(reducer_layouts, model_name, input_shape, bucket_mb):
    profile = load_profile(model_name)
    ours = [[profile.tensors[i].name for i in b.tensors] for b in B.assign(profile, bucket_mb=bucket_mb)]
    theirs = reducer_layouts[(model_name, input_shape, bucket_mb)]
    assert [len(b) for b in ours] == [len(b) for b in theirs]
    assert [sorted(b) for b in ours] == [sorted(b) for b in theirs]
