"""The compute block: operators' times read back exactly where measured, between points by the nearest rates,
and a block in a hardware file validated field by field."""
import math

import pytest

from commbench.costmodel import HardwareError, hardware_from_dict, load_hardware
from commbench.costmodel.compute import AttentionPoint, ComputeBlock, ComputeError, MatmulPoint, attention_flops


def _block(**extra) -> ComputeBlock:
    matmul = (MatmulPoint(64, 64, 64, "float32", 10.0), MatmulPoint(1024, 1024, 1024, "float32", 5000.0),
              MatmulPoint(8, 1024, 1024, "float32", 400.0))
    attention = (AttentionPoint(4, 64, 64, 16, True, "float32", 20.0, 50.0),)
    return ComputeBlock("test device", matmul, attention, 100.0, 1.0, **extra)


def test_a_measured_shape_reads_back_exactly_and_others_between_their_neighbours():
    block = _block()
    assert block.matmul_us(64, 64, 64, "float32") == pytest.approx(10.0)
    assert block.matmul_us(1024, 1024, 1024, "float32") == pytest.approx(5000.0)
    rates = sorted(p.tflops for p in block.matmul)
    between = 2 * 256 ** 3 / (block.matmul_us(256, 256, 256, "float32") * 1e6)
    assert rates[0] <= between <= rates[-1]
    # a skinny product is read near the skinny point, not at the square's rate
    skinny = 2 * 16 * 1024 * 1024 / (block.matmul_us(16, 1024, 1024, "float32") * 1e6)
    assert abs(math.log(skinny / block.matmul[2].tflops)) < abs(math.log(skinny / block.matmul[1].tflops))


def test_attention_scales_by_its_flops_at_the_nearest_rate():
    block = _block()
    assert block.attention_us(4, 64, 64, 16, True, "float32") == pytest.approx((20.0, 50.0))
    forward, backward = block.attention_us(8, 64, 64, 16, True, "float32")  # twice the heads: twice the time
    assert 20.0 < forward < 40.0 + 1e-9 and backward > forward
    assert attention_flops(1, 8, 8, 4, False) == 2 * attention_flops(1, 8, 8, 4, True)


def test_what_the_block_lacks_is_one_line():
    with pytest.raises(ComputeError, match="no bfloat16 matrix products"):
        _block().matmul_us(8, 8, 8, "bfloat16")
    with pytest.raises(ComputeError, match="no memory_gbps"):
        ComputeBlock("d").memory_us(10)


def test_a_block_survives_the_hardware_file(tmp_path):
    hw = load_hardware("dgx-h100")
    from dataclasses import replace

    path = tmp_path / "hw.json"
    replace(hw, compute=_block(framework_us={"forward": 3.0, "backward": 4.0})).save(str(path))
    back = load_hardware(str(path)).compute
    assert back == _block(framework_us={"forward": 3.0, "backward": 4.0})


@pytest.mark.parametrize("compute,message", [
    ([], "compute must be a JSON object"),
    ({"device": ""}, "compute.device"),
    ({"device": "d", "matmul": [{"m": 1, "n": 1, "k": 1, "dtype": "float32", "time_us": -1}]}, "time_us"),
    ({"device": "d", "matmul": [{"m": 1.5, "n": 1, "k": 1, "dtype": "float32", "time_us": 1}]}, "whole number"),
    ({"device": "d", "matmul": [{"m": 1, "n": 1, "k": 1, "dtype": "int4", "time_us": 1}]}, "dtype"),
    ({"device": "d", "matmul": [{"m": 1, "n": 1, "k": 1, "dtype": "float32", "time_us": float("nan")}]}, "finite"),
    ({"device": "d", "attention": [{"batch_heads": 1, "seq_q": 1, "seq_kv": 1, "head_dim": 1, "causal": 1,
                                    "dtype": "float32", "forward_us": 1, "backward_us": 1}]}, "causal"),
    ({"device": "d", "memory_gbps": 0}, "memory_gbps"),
    ({"device": "d", "framework_us": {"sideways": 1}}, "framework_us"),
    ({"device": "d", "sources": {"op_us": "guessed"}}, "sources"),
    ({"device": "d", "matmul": [{}] * 5000}, "at most"),
    ({"device": "d", "matmul": [{"m": 10 ** 400, "n": 1, "k": 1, "dtype": "float32", "time_us": 1}]}, "at most"),
    ({"device": "d", "memory_gbps": 1e-300}, "at least 0.001"),
    ({"device": "d", "op_us": 1e15}, "one operator's fixed cost"),
    ({"device": "d", "framework_us": 0}, "framework_us"),
    ({"device": "d", "meta": []}, "meta must be a JSON object"),
    ({"device": "d", "meta": {"cpus": "two"}}, "meta.cpus"),
    ({"device": "d", "meta": {"cpus": True}}, "meta.cpus"),
    ({"device": "d", "meta": {"threads": 0}}, "meta.threads"),
    ({"device": "d", "meta": {"dtype": "int4"}}, "meta.dtype"),
    ({"device": "d", "meta": {"clock": 3}}, "meta.clock"),
])
def test_a_bad_block_is_one_line_naming_the_field(compute, message):
    data = load_hardware("dgx-h100").to_dict()
    data["compute"] = compute
    with pytest.raises(HardwareError, match=message) as caught:
        hardware_from_dict(data, "hw.json")
    assert "\n" not in str(caught.value) and str(caught.value).startswith("hw.json: ")


def test_ranks_share_a_cpus_cores_by_their_threads_and_a_gpu_is_its_own():
    cpu = ComputeBlock("cpu (x)", meta={"cpus": 2, "threads": 1})
    assert cpu.core_share(1) == 1.0 and cpu.core_share(2) == 1.0 and cpu.core_share(4) == 2.0
    assert ComputeBlock("cpu (x)", meta={"cpus": 2, "threads": 2}).core_share(2) == 2.0
    assert ComputeBlock("NVIDIA H100", meta={"cpus": 2}).core_share(8) == 1.0
    assert ComputeBlock("cpu (x)").core_share(8) == 1.0  # cores not said: none assumed shared
