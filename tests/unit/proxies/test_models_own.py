"""commbench's own model definitions (proxies/models: unet, speech_transformer, tts_angular).

Each model must build, train one tiny step with a gradient on every parameter, and have exactly the
parameter count derived here, independently, from the published hyper-parameters (layer by layer, so a
missing or wrong layer shows). Shapes are kept tiny: the parameter count does not depend on them.
"""
import importlib
import importlib.util

import pytest
from conftest import REPO

torch = pytest.importorskip("torch")

MODELS_DIR = REPO / "proxies" / "models"


def _load(name):
    try:
        return importlib.import_module(f"commbench.proxies.models.{name}")
    except ImportError:
        # An editable install made before proxies/ was mapped to commbench.proxies: load the file itself.
        spec = importlib.util.spec_from_file_location(f"_commbench_own_{name}", MODELS_DIR / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module


unet = _load("unet")
speech_transformer = _load("speech_transformer")
tts_angular = _load("tts_angular")
ALL = [unet, speech_transformer, tts_angular]


@pytest.fixture(autouse=True)
def _one_thread():
    """Keep these CPU runs light (the machine is shared); restore the setting afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    yield
    torch.set_num_threads(before)


# -- parameter counts from the published hyper-parameters ---------------------------------------------

def linear(i, o, bias=True):
    return i * o + (o if bias else 0)


def conv(i, o, k):
    return i * o * k * k + o


def norm(c):            # BatchNorm2d / LayerNorm: weight + bias
    return 2 * c


def lstm(i, h):         # one layer: W_ih (4h x i), W_hh (4h x h), b_ih, b_hh
    return 4 * h * i + 4 * h * h + 2 * 4 * h


def unet_expected(bilinear, n_channels=3, n_classes=2, widths=(64, 128, 256, 512, 1024)):
    """milesial Pytorch-UNet: unet/unet_model.py, unet/unet_parts.py."""
    def double(i, o, mid=None):
        mid = mid or o
        return conv(i, mid, 3) + norm(mid) + conv(mid, o, 3) + norm(o)

    f = 2 if bilinear else 1
    w0, w1, w2, w3, w4 = widths
    total = double(n_channels, w0) + double(w0, w1) + double(w1, w2) + double(w2, w3) + double(w3, w4 // f)
    for cin, cout in ((w4, w3 // f), (w3, w2 // f), (w2, w1 // f), (w1, w0)):
        if bilinear:
            total += double(cin, cout, cin // 2)
        else:   # ConvTranspose2d(cin, cin // 2, 2, stride 2): cin * cin/2 * 2 * 2 + cin/2
            total += cin * (cin // 2) * 4 + cin // 2 + double(cin, cout)
    return total + conv(w0, n_classes, 1)


# TorchBench torchbenchmark/models/speech_transformer/config.py; vocabulary = lines of its
# input_data/lang_1char/train_chars.txt (and the 1014 in every target "shape" of input_data/*/data.json).
ST = dict(d_input=80, LFR_m=4, n_layers_enc=6, n_head=8, d_k=64, d_v=64, d_model=512, d_inner=2048,
          d_word_vec=512, n_layers_dec=6, vocab=1014)


def speech_transformer_expected(p=ST):
    d, h = p["d_model"], p["n_head"]
    mha = 2 * linear(d, h * p["d_k"]) + linear(d, h * p["d_v"]) + norm(d) + linear(h * p["d_v"], d)
    ffn = linear(d, p["d_inner"]) + linear(p["d_inner"], d) + norm(d)
    encoder = linear(p["d_input"] * p["LFR_m"], d) + norm(d) + p["n_layers_enc"] * (mha + ffn)
    # The output projection shares the embedding matrix (tgt_emb_prj_weight_sharing=1): counted once.
    decoder = p["vocab"] * p["d_word_vec"] + p["n_layers_dec"] * (2 * mha + ffn)
    return encoder + decoder


# TorchBench torchbenchmark/models/tts_angular/angular_tts_main.py, CONFIG["model"].
TTS = dict(input_dim=40, proj_dim=256, lstm_dim=768, num_lstm_layers=3)


def tts_angular_expected(p=TTS):
    total = 0
    for i in range(p["num_lstm_layers"]):
        cin = p["input_dim"] if i == 0 else p["proj_dim"]
        total += lstm(cin, p["lstm_dim"]) + linear(p["lstm_dim"], p["proj_dim"], bias=False)
    return total


def n_params(model):
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def test_parameter_counts_match_published_structure():
    assert n_params(unet.build()) == unet_expected(bilinear=False) == 31_043_586
    assert n_params(unet.build(bilinear=True)) == unet_expected(bilinear=True) == 17_267_458
    assert n_params(speech_transformer.build()) == speech_transformer_expected() == 44_823_040
    assert n_params(tts_angular.build()) == tts_angular_expected() == 9_381_888


@pytest.mark.parametrize("module", ALL, ids=lambda m: m.__name__.rsplit(".", 1)[-1])
def test_module_interface(module):
    assert {"name", "reference", "hyperparameters", "note"} <= set(module.SOURCE)
    assert "github.com" in module.SOURCE["reference"]
    assert set(module.INPUT) == {"shape", "unit", "default_batch"}
    assert module.INPUT["unit"] in ("images", "sequences", "utterances")
    inputs = module.example_inputs(2)
    assert isinstance(inputs, tuple)
    assert list(inputs[0].shape) == [2] + list(module.INPUT["shape"])


def _train_step(model, inputs):
    model.train()
    out = model(*inputs)
    assert isinstance(out, torch.Tensor) and torch.isfinite(out).all()
    out.float().mean().backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not torch.isfinite(p.grad).all()]
    assert not missing, f"no (finite) gradient for {missing}"
    return out


@pytest.mark.parametrize("bilinear", [False, True])
def test_unet_trains_on_small_images(bilinear):
    model = unet.build(bilinear=bilinear)
    out = _train_step(model, (torch.rand(2, 3, 64, 67),))     # odd width exercises the skip padding
    assert out.shape == (2, 2, 64, 67)
    assert unet.INPUT == {"shape": [3, 640, 959], "unit": "images", "default_batch": 1}


def test_speech_transformer_trains_on_short_sequences():
    model = speech_transformer.build()
    lengths = torch.tensor([12, 9, 5])
    feats = torch.randn(3, 12, 320) * (torch.arange(12)[None, :, None] < lengths[:, None, None])
    target = torch.tensor([[5, 6, 7, 8, 9], [10, 11, 12, -1, -1], [13, -1, -1, -1, -1]])
    out = _train_step(model, (feats, lengths, target))
    assert out.shape == (3, 6, 1014)                            # <sos> + 5 tokens positions
    assert model.decoder.tgt_word_prj.weight is model.decoder.tgt_word_emb.weight
    assert model.labels(target).tolist() == [[5, 6, 7, 8, 9, 2], [10, 11, 12, 2, -1, -1],
                                             [13, 2, -1, -1, -1, -1]]


def test_speech_transformer_parameter_names_follow_upstream_order():
    def mha(prefix):
        return [f"{prefix}.{m}.{t}" for m in ("w_qs", "w_ks", "w_vs", "layer_norm", "fc") for t in ("weight", "bias")]

    def ffn(prefix):
        return [f"{prefix}.{m}.{t}" for m in ("w_1", "w_2", "layer_norm") for t in ("weight", "bias")]

    names = ["encoder.linear_in.weight", "encoder.linear_in.bias",
             "encoder.layer_norm_in.weight", "encoder.layer_norm_in.bias"]
    for i in range(ST["n_layers_enc"]):
        names += mha(f"encoder.layer_stack.{i}.slf_attn") + ffn(f"encoder.layer_stack.{i}.pos_ffn")
    names.append("decoder.tgt_word_emb.weight")
    for i in range(ST["n_layers_dec"]):
        p = f"decoder.layer_stack.{i}"
        names += mha(f"{p}.slf_attn") + mha(f"{p}.enc_attn") + ffn(f"{p}.pos_ffn")
    model = speech_transformer.build()
    assert [n for n, _ in model.named_parameters()] == names
    assert sorted(n for n, _ in model.named_buffers()) == ["decoder.positional_encoding.pe",
                                                           "encoder.positional_encoding.pe"]


def test_speech_transformer_masks_padding_and_future():
    model = speech_transformer.build().eval()
    feats = torch.randn(1, 10, 320)
    target = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        alone = model(feats, torch.tensor([10]), target)
        # Extra padded frames (with garbage in them) and an extra padded target column change nothing.
        padded = torch.cat([feats, 100 * torch.randn(1, 6, 320)], dim=1)
        batch_feats = torch.cat([padded, torch.randn(1, 16, 320)])
        batch_target = torch.tensor([[5, 6, 7, 8, -1], [9, 10, 11, 12, 13]])
        both = model(batch_feats, torch.tensor([10, 16]), batch_target)
        assert torch.allclose(both[0, :5], alone[0], atol=1e-4)
        # Causality: changing the last token changes no earlier position's logits.
        changed = model(feats, torch.tensor([10]), torch.tensor([[5, 6, 7, 99]]))
        assert torch.allclose(changed[0, :4], alone[0, :4], atol=1e-4)
        assert not torch.allclose(changed[0, 4], alone[0, 4], atol=1e-4)


def test_speech_transformer_example_inputs_follow_torchbench_batch():
    feats, lengths, target = speech_transformer.example_inputs(10)
    assert feats.shape == (10, 238, 320) and lengths.dtype == torch.long and target.dtype == torch.long
    assert lengths.tolist() == [238, 219, 215, 199, 176, 170, 165, 140, 112, 106]
    assert ((target != -1).sum(1)).tolist() == [22, 19, 19, 18, 15, 17, 16, 13, 10, 9]
    assert int(target.max()) < 1014 and int(target[target != -1].min()) >= 3
    assert speech_transformer.INPUT == {"shape": [238, 320], "unit": "utterances", "default_batch": 10}
    with torch.no_grad():
        out = speech_transformer.build().eval()(*speech_transformer.example_inputs(2))
    assert out.shape == (2, 23, 1014)


def test_tts_angular_trains_and_embeds():
    model = tts_angular.build()
    out = _train_step(model, (torch.rand(4, 8, 40),))
    assert out.shape == (4, 256)
    assert torch.allclose(out.norm(dim=1), torch.ones(4), atol=1e-5)
    assert tts_angular.INPUT == {"shape": [50, 40], "unit": "utterances", "default_batch": 64}
    with torch.no_grad():
        assert model(*tts_angular.example_inputs(2)).shape == (2, 256)
