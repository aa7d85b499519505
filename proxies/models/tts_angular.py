"""Speaker encoder of Mozilla TTS (trained with the angular prototypical loss), as run by TorchBench's
`tts_angular`; commbench builds it here because no installable package ships it.

Architecture (from github.com/mozilla/TTS TTS/speaker_encoder/model.py, vendored by pytorch/benchmark as
torchbenchmark/models/tts_angular/model.py): a stack of num_lstm_layers "LSTM with projection" blocks, each a
single-layer batch-first nn.LSTM(input, lstm_dim) followed by a bias-free Linear(lstm_dim -> proj_dim) applied
to every time step; the first block reads the 40 mel channels, the others read the 256-dim projection. The
embedding is the last time step's projection, L2-normalised: [B, proj_dim]. Initialisation: Xavier-normal
weights, zero biases. Module names follow upstream (layers.<i>.lstm.weight_ih_l0, layers.<i>.linear.weight, ...).

Hyper-parameters: TorchBench's torchbenchmark/models/tts_angular/angular_tts_main.py, CONFIG["model"]
(input_dim=40, proj_dim=256, lstm_dim=768, num_lstm_layers=3, use_lstm_with_projection=True). Input:
TorchBench trains on one synthetic batch torch.rand(batch, 50, 40) (50 frames of 40 mels) with
DEFAULT_TRAIN_BSIZE = 64 (torchbenchmark/models/tts_angular/__init__.py, after Mozilla TTS's
num_speakers_in_batch = 64). The loss (AngleProtoLoss) owns two scalar parameters (w, b), but TorchBench's
optimizer only sees the encoder's parameters and DDP would only wrap the encoder, so they are not part of
this module.

This is commbench's own code; only the layer structure and hyper-parameters carry over.
"""
import torch
import torch.nn.functional as F
from torch import nn

HPARAMS = {"input_dim": 40, "proj_dim": 256, "lstm_dim": 768, "num_lstm_layers": 3,
           "use_lstm_with_projection": True}
FRAMES = 50

SOURCE = {
    "name": "tts_angular (Mozilla TTS speaker encoder, angular prototypical loss)",
    "reference": ("https://github.com/pytorch/benchmark torchbenchmark/models/tts_angular/angular_tts_main.py "
                  "(CONFIG['model'], synthetic input torch.rand(batch, 50, 40)), "
                  "torchbenchmark/models/tts_angular/__init__.py (DEFAULT_TRAIN_BSIZE=64), "
                  "torchbenchmark/models/tts_angular/model.py (structure); "
                  "original: https://github.com/mozilla/TTS TTS/speaker_encoder/model.py"),
    "hyperparameters": dict(HPARAMS, frames=FRAMES, train_batch=64),
    "note": ("9,381,888 trainable parameters in 15 tensors (3 x [LSTM weight_ih, weight_hh, bias_ih, "
             "bias_hh, projection weight]). The loss's two scalars (w, b) are outside the module, as in "
             "TorchBench. Output: L2-normalised embeddings [B, 256]."),
}

INPUT = {"shape": [FRAMES, HPARAMS["input_dim"]], "unit": "utterances", "default_batch": 64}


class LSTMWithProjection(nn.Module):
    """One-layer LSTM whose every output step is projected (no bias) to proj_size."""

    def __init__(self, input_size, hidden_size, proj_size):
        super().__init__()
        self.lstm = nn.LSTM(input_size, hidden_size, batch_first=True)
        self.linear = nn.Linear(hidden_size, proj_size, bias=False)

    def forward(self, x):
        self.lstm.flatten_parameters()      # keeps cuDNN's weight buffer contiguous (no-op on CPU)
        out, _ = self.lstm(x)
        return self.linear(out)


class SpeakerEncoder(nn.Module):
    def __init__(self, input_dim=40, proj_dim=256, lstm_dim=768, num_lstm_layers=3):
        super().__init__()
        widths = [input_dim] + [proj_dim] * (num_lstm_layers - 1)
        self.layers = nn.Sequential(*(LSTMWithProjection(w, lstm_dim, proj_dim) for w in widths))
        for name, p in self.layers.named_parameters():
            if "bias" in name:
                nn.init.zeros_(p)
            else:
                nn.init.xavier_normal_(p)

    def forward(self, mels):
        """mels: [B, T, input_dim] -> unit-norm speaker embeddings [B, proj_dim] (last step)."""
        return F.normalize(self.layers(mels)[:, -1], p=2, dim=1)


def build() -> nn.Module:
    """Randomly initialised speaker encoder with TorchBench's hyper-parameters; nothing is downloaded."""
    hp = HPARAMS
    return SpeakerEncoder(hp["input_dim"], hp["proj_dim"], hp["lstm_dim"], hp["num_lstm_layers"])


def example_inputs(batch: int, device="cpu") -> tuple:
    """TorchBench's synthetic batch: uniform [0, 1) mel frames of shape [batch, 50, 40]."""
    return (torch.rand(batch, *INPUT["shape"], device=device),)
