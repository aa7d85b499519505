"""Each trainable setup's plan (proxies/setups.py) against what torch really issues.

Two gloo ranks train a small GPT-2 (2 layers, odd vocabulary and positions, so that FSDP pads)
as `commbench train` runs it (proxies/train_setups.py). A TorchDispatchMode sees every c10d
collective a step issues, DDP's from its C++ Reducer included; the calls of one steady step
(after 3 steps: DDP rebuilds its buckets in the second and broadcasts the new layout in it)
must equal the plan's, call for call in issue order: collective, bytes (the larger per-rank
buffer, nccl-tests' size), dtype and group. A wrapper on torch.distributed's Python calls
says which of them block where they are issued (async_op=False)."""
import os
import queue

import pytest
from conftest import c10d_trace, clean_env, commbench

from commbench.launch import free_port
from commbench.proxies.extract import extract
from commbench.proxies.setup_steps import Compute, Placement
from commbench.proxies.setups import settle
from commbench.results import read_records

SPEC = "transformers:GPT2LMHeadModel:n_layer=2,n_embd=30,n_head=2,vocab_size=101,n_positions=33"
# BERT ties its word embeddings (in BertEmbeddings, a unit of the wrapping policy) to its masked-LM decoder
TIED = ("transformers:BertForMaskedLM:num_hidden_layers=2,hidden_size=30,num_attention_heads=2,intermediate_size=37,"
        "vocab_size=101,max_position_embeddings=33")
CASES = {  # name: (model, setup, knobs, nodes, ranks per node)
    "ddp": ("gpt2-tiny", "ddp", {}, 1, 2),
    "ddp buckets": ("gpt2-tiny", "ddp", {"bucket_mb": 0.02}, 1, 2),
    "ddp accumulate 2": ("gpt2-tiny", "ddp", {"bucket_mb": 0.03, "accumulate": 2}, 1, 2),
    "ddp-fp16": ("gpt2-tiny", "ddp-fp16", {"bucket_mb": 0.02}, 1, 2),
    "ddp-bf16": ("gpt2-tiny", "ddp-bf16", {}, 1, 2),
    "apex": ("gpt2-tiny", "apex", {"message_size": 5000}, 1, 2),
    "fsdp-full": ("gpt2-tiny", "fsdp-full", {}, 1, 2),
    "fsdp-grad-op": ("gpt2-tiny", "fsdp-grad-op", {}, 1, 2),
    "fsdp-full prefetch 2": ("gpt2-tiny", "fsdp-full", {"prefetch": 2}, 1, 2),
    "fsdp-full accumulate 2": ("gpt2-tiny", "fsdp-full", {"accumulate": 2}, 1, 2),
    "fsdp-hybrid 2x1": ("gpt2-tiny", "fsdp-hybrid", {}, 2, 1),
    "fsdp-hybrid accumulate 2": ("gpt2-tiny", "fsdp-hybrid", {"accumulate": 2}, 2, 1),
    "resnet18 ddp": ("resnet18", "ddp", {}, 1, 2),  # batch norms: DDP broadcasts their buffers
    "resnet18 fsdp-full": ("resnet18", "fsdp-full", {"prefetch": 1}, 1, 2),
    "bert-tiny fsdp-full": ("bert-tiny", "fsdp-full", {}, 1, 2),  # tied parameters
    "bert-tiny fsdp-hybrid accumulate 4": ("bert-tiny", "fsdp-hybrid", {"accumulate": 4}, 2, 1),
    "bert-tiny ddp": ("bert-tiny", "ddp", {}, 1, 2),
}
WARMUP_STEPS = 3
OWN_WORK = ("ddp-fp16", "fsdp-full", "fsdp-hybrid")  # measure_compute's own work of the setup, at one rank


@pytest.fixture(scope="module")
def profiles():
    """A small GPT-2, a small BERT (tied parameters), and resnet18 on 32x32 images (batch norms: buffers)."""
    return {"gpt2-tiny": extract(SPEC, (16,), name="gpt2-tiny", default_batch=2),
            "bert-tiny": extract(TIED, (16,), name="bert-tiny", default_batch=2),
            "resnet18": extract("torchvision:resnet18", (3, 32, 32), name="resnet18-32px", default_batch=2)}


def _python_calls(log):
    """Wrap torch.distributed's tensor all-gather and reduce-scatter (the names this torch has: all_gather_single,
    or all_gather_into_tensor before it; torch_calls.shard_calls) and all_reduce: (name, blocking)."""
    import torch.distributed as dist

    from commbench.backends.torch_calls import shard_calls

    for name in (*(call.__name__ for call in shard_calls(dist)), "all_reduce"):
        original = getattr(dist, name)

        def wrapped(*args, _name=name, _original=original, **kwargs):
            log.append((_name, not kwargs.get("async_op", False)))
            return _original(*args, **kwargs)
        setattr(dist, name, wrapped)


def _rank(rank, port, profiles, out):
    import torch
    import torch.distributed as dist

    from commbench.proxies.train import Trainer, measure_compute
    from commbench.proxies.train_setups import apply

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    blocking = []
    _python_calls(blocking)
    try:
        for case, (model, name, knobs, nodes, per_node) in CASES.items():
            profile = profiles[model]
            torch.manual_seed(1234 + rank)
            trainer = Trainer(profile, 2, "cpu")
            layout = Placement(nodes, per_node, "cpu")
            running = apply(trainer, settle(name, knobs, layout), layout, profile)
            for _ in range(WARMUP_STEPS):
                running.step()
            steps, blocking[:] = [], []
            for _ in range(2):
                calls = []
                labels = {group.group_name: label for label, group in running.groups.items()}
                with c10d_trace(calls, labels):
                    running.step()
                steps.append(calls)
            if rank == 0:
                buffer_bytes = sum(b.numel() * b.element_size() for b in trainer.model.buffers())
                out.put((case, steps, list(blocking), running.what, buffer_bytes))
            trainer.wrapped = trainer.model = trainer.optimizer = running = None
            dist.barrier()
        for name in OWN_WORK:  # at one rank, on a group of this rank alone inside the 2-rank job
            calls = []
            with c10d_trace(calls, {}):
                measured = measure_compute(profiles["gpt2-tiny"], 2, "cpu", choice=settle(name, {}))
            if rank == 0:
                out.put((f"own {name}", measured, calls))
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def traced(profiles):
    """case -> (calls of two steady steps, Python calls with whether they block, the header's line, the bytes
    of the model's buffers)."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    old = {k: os.environ.pop(k) for k in list(os.environ) if k not in clean_env()}
    try:
        procs = [ctx.Process(target=_rank, args=(r, port, profiles, out)) for r in range(2)]
        for p in procs:
            p.start()
        results = {}
        try:
            while len(results) < len(CASES) + len(OWN_WORK):
                case, *result = out.get(timeout=240)
                results[case] = result
        except queue.Empty:
            pytest.fail(f"the ranks stopped after {sorted(results)}")
        for p in procs:
            p.join(timeout=60)
        assert all(p.exitcode == 0 for p in procs)
    finally:
        os.environ.update(old)
    return results


def _planned(profiles, case):
    model, name, knobs, nodes, per_node = CASES[case]
    profile = profiles[model]
    layout = Placement(nodes, per_node, "cpu")
    plan = settle(name, knobs, layout).plan(profile, Compute(100.0, 200.0, 10.0, 5.0), layout)
    return plan, [(c.collective, c.nbytes, c.dtype, c.group) for c in plan.comms]


@pytest.mark.parametrize("case", list(CASES))
def test_a_step_issues_the_plans_calls_exactly(profiles, traced, case):
    steps, _, _, buffer_bytes = traced[case]
    plan, planned = _planned(profiles, case)
    assert steps[0] == steps[1]  # steady: every step alike
    calls = [c for c in steps[0] if c[0] != "broadcast"]
    assert calls == planned  # call for call, in issue order
    bytes_by = {}
    for collective, nbytes, _, group in calls:
        count, total = bytes_by.get((collective, group), (0, 0))
        bytes_by[(collective, group)] = (count + 1, total + nbytes)
    assert bytes_by == plan.bytes_by()
    # DDP (broadcast_buffers=True) broadcasts the model's buffers every forward: profiles hold parameters only,
    # so the plan leaves them out (docs/setups.md); FSDP2 does not broadcast them
    broadcast = sum(c[1] for c in steps[0] if c[0] == "broadcast")
    assert broadcast == (buffer_bytes if CASES[case][1] == "ddp" else 0)


@pytest.mark.parametrize("name", OWN_WORK)
def test_own_work_is_measured_at_one_rank(traced, name):
    """measure_compute(choice=...) inside a 2-rank job: the setup on a group of this rank alone, so none of its
    calls leaves the rank (FSDP on a 1-rank mesh copies instead of gathering; DDP's hook allreduces on the 1-rank
    group, and DDP broadcasts its parameters when built and its bucket layout when it rebuilds it)."""
    (times, cpu_time), calls = traced[f"own {name}"]
    assert len(times) == 4 and all(t >= 0 and t == t for t in times) and times[0] > 0 and cpu_time
    assert all(c[3] == "1 rank(s)" for c in calls), calls
    assert any(c[0] == "allreduce" for c in calls) == (name == "ddp-fp16"), calls


def test_the_cases_cover_what_differs(profiles, traced):
    """The cases are not vacuous: several buckets, padding, halved bytes, both HSDP groups, buffers."""
    calls = {case: result[0][0] for case, result in traced.items()}
    nbytes = profiles["gpt2-tiny"].nbytes
    assert len(calls["ddp buckets"]) > 2 and len(calls["apex"]) > 2 and len(calls["ddp"]) == 1
    assert sum(c[1] for c in calls["ddp-fp16"]) * 2 == sum(c[1] for c in calls["ddp buckets"]) == nbytes
    assert {c[2] for c in calls["ddp-bf16"]} == {"bfloat16"}
    gathered = sum(c[1] for c in calls["fsdp-grad-op"] if c[0] == "allgather")
    assert gathered > nbytes  # the vocabulary's and positions' odd first dimensions, padded to 2 ranks
    assert {c[3] for c in calls["fsdp-hybrid 2x1"]} == {"cross"}  # shards of 1 rank: no all-gather
    assert [c[0] for c in calls["fsdp-full accumulate 2"]].count("allgather") == \
        2 * [c[0] for c in calls["fsdp-full"]].count("allgather")
    assert traced["resnet18 ddp"][3] > 0 and any(c[0] == "broadcast" for c in calls["resnet18 ddp"])


@pytest.mark.parametrize("case", [c for c in CASES if CASES[c][1].startswith("fsdp")])
def test_fsdp_on_cpu_blocks_at_every_call(profiles, traced, case):
    """On gloo every FSDP2 call is made with async_op=False: it is done before the compute goes on, so the
    plan on a CPU layout needs each call where it is ready."""
    steps, blocking, what, _ = traced[case]
    assert blocking and all(block for _, block in blocking)
    assert len(blocking) == len(steps[0]) + len(steps[1])  # each traced call came through those functions
    plan, _ = _planned(profiles, case)
    assert all(c.needed_us == c.ready_us for c in plan.comms)
    assert "fully_shard" in what


# ---------------------------------------------------------------- the command


def test_train_runs_fsdp_full_end_to_end(tmp_path):
    path = tmp_path / "t.jsonl"
    done = commbench("train", "resnet18", "--setup", "fsdp-full", "--nprocs", "2", "--steps", "2",
                     "--warmup-steps", "1", "--batch", "2", "--json", str(path), timeout=300)
    assert done.returncode == 0, done.stderr
    assert "fsdp-full: FSDP2 fully_shard on 8 unit(s) and the root, reshard_after_forward=True" in done.stdout
    assert ": ResNet, SGD momentum" in done.stdout  # the model's own class, not FSDPResNet
    records = read_records(str(path))
    assert records[0]["summary_fields"]["setup"] == "fsdp-full"
    summary = [r for r in records if r["record"] == "proxy"]
    assert len(summary) == 1 and summary[0]["kind"] == "train" and summary[0]["status"] == "ok"
    assert summary[0]["setup"] == "fsdp-full"
    assert summary[0]["knobs"] == {"accumulate": 1, "prefetch": None, "shard_group": "world"}
    assert len([r for r in records if r["record"] == "step"]) == 3


@pytest.mark.parametrize("args, says", [
    (["--setup", "zero2"], "nearest that trains here: --setup fsdp-grad-op"),
    (["--setup", "zero1"], "--setup fsdp-grad-op"),
    (["--setup", "horovod"], "Horovod is not installed"),
    (["--setup", "nosuch"], "unknown setup 'nosuch'"),
    (["--setup", "ddp", "--prefetch", "1"], "setup ddp has no knob --prefetch"),
    (["--setup", "fsdp-full", "--accumulate", "0"], "--accumulate 0: must be at least 1"),
    (["--setup", "fsdp-hybrid", "--shard-group", "world"], "setup fsdp-hybrid has no knob --shard-group"),
])
def test_train_refuses_in_one_line(args, says):
    done = commbench("train", "resnet18", "--nprocs", "2", "--steps", "1", *args, timeout=60)
    assert done.returncode == 2, done.stderr
    assert says in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "rank" not in done.stdout.lower()


@pytest.mark.parametrize("setup", [["--setup", "fsdp-full", "--shard-group", "node"], ["--setup", "fsdp-hybrid"]])
def test_shards_of_a_node_must_divide_the_ranks(setup, port):
    """Rank 0 of a torchrun job of 5 ranks with 2 on this node (nodes of unequal size): refused before any
    rendezvous."""
    env = clean_env(RANK="0", LOCAL_RANK="0", WORLD_SIZE="5", LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                    MASTER_PORT=str(port))
    done = commbench("train", "resnet18", "--steps", "1", *setup, env=env, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "shards span a node of 2 ranks, which does not divide 5 ranks" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_validate_refuses_a_setup_that_does_not_train():
    """`proxy --validate` trains too: the same one line before any rank starts."""
    done = commbench("proxy", "resnet18", "--nprocs", "2", "--steps", "1", "--setup", "zero2", "--validate",
                     timeout=60)
    assert done.returncode == 2, done.stderr
    assert "setup zero2 does not train here" in done.stderr and len(done.stderr.strip().splitlines()) == 1
