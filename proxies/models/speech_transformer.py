"""Speech-Transformer (attention-only encoder-decoder ASR), as run by TorchBench's `speech_transformer`;
commbench builds it here because no installable package ships it.

Architecture (from github.com/kaituoxu/Speech-Transformer src/transformer/{encoder,decoder,attention,module,
transformer}.py, vendored by pytorch/benchmark under torchbenchmark/models/speech_transformer/
speech_transformer/transformer/):

* Input: 80-dim log-mel filterbanks, "low frame rate" stacked: every 3rd frame (LFR_n) carries 4 stacked
  frames (LFR_m), so each encoder step is 320 features and an utterance of T frames has ceil(T / 3) steps.
* Encoder: Linear(320 -> d_model) + LayerNorm replace the input embedding; sinusoidal positions are added
  (a fixed buffer, no parameters), then dropout; n_layers_enc layers of [multi-head self-attention, position-wise
  feed-forward]. Each sub-layer is post-norm (LayerNorm(dropout(f(x)) + x)) and its output is zeroed at padded
  frames.
* Decoder: the target gets <sos> prepended (<eos> appended for the labels, <eos> as padding); token embedding
  scaled by sqrt(d_model) (weight sharing is on) + positions, then n_layers_dec layers of [masked self-attention,
  encoder-decoder attention, feed-forward]; the output projection to the vocabulary shares the embedding matrix.
* Multi-head attention: separate q/k/v projections (d_model -> n_head * d_k), softmax(q k^T / sqrt(d_k)) with
  dropout, output projection `fc`, residual + LayerNorm. The parameter registration order inside it is
  w_qs, w_ks, w_vs, layer_norm, fc (layer_norm is registered before fc upstream); the feed-forward block
  registers w_1, w_2, layer_norm.

Module and attribute names follow upstream, so the trainable tensors (names, shapes, order) are the same; the
shared output projection appears once, as decoder.tgt_word_emb.weight. Like upstream, both positional
encodings are registered buffers of shape [1, pe_maxlen, d_model]; DDP broadcasts buffers each step when
broadcast_buffers=True.

Hyper-parameters: TorchBench's torchbenchmark/models/speech_transformer/config.py (SpeechTransformerTrainConfig),
the same architecture figures as kaituoxu's egs/aishell/run.sh (whose batching differs: batch_size=16).
Vocabulary: 1014 symbols (<unk>, <sos>=1, <eos>=2 and 1011 characters) from TorchBench's
input_data/lang_1char/train_chars.txt (the full AISHELL-1 dictionary is larger).
Batch: TorchBench declares DEFAULT_TRAIN_BSIZE = 32 (__init__.py), but its data loader batches by frames
(batch_frames = 15000) over a 10-utterance training set, so every step actually trains on 10 utterances
(pytorch/benchmark issue #1560; PyTorch's dynamo runner pins batch_size = 10 for this model). The 10 utterances
(input_data/train/data.json, as stored in the repository before TorchBench moved its inputs to a
downloaded archive) have 318..714 raw frames, i.e. 106..238 LFR steps, and 9..22 target tokens.

This is commbench's own code; only the layer structure and hyper-parameters carry over.
"""
import math

import torch
import torch.nn.functional as F
from torch import nn

IGNORE_ID = -1          # padding value of padded_target (upstream utils.IGNORE_ID)
SOS_ID, EOS_ID = 1, 2   # positions of <sos> and <eos> in TorchBench's dictionary

HPARAMS = {
    "d_input": 80, "LFR_m": 4, "LFR_n": 3,
    "n_layers_enc": 6, "n_head": 8, "d_k": 64, "d_v": 64, "d_model": 512, "d_inner": 2048,
    "dropout": 0.1, "pe_maxlen": 5000,
    "d_word_vec": 512, "n_layers_dec": 6, "tgt_emb_prj_weight_sharing": 1,
    "vocab_size": 1014, "sos_id": SOS_ID, "eos_id": EOS_ID,
}

# TorchBench's training batch, in the order its collate function yields it (longest first):
# raw frame counts 714, 656, 643, 597, 528, 508, 495, 418, 336, 318 -> LFR steps ceil(T / 3), with their
# target lengths (input_data/train/data.json).
LFR_LENGTHS = (238, 219, 215, 199, 176, 170, 165, 140, 112, 106)
TARGET_LENGTHS = (22, 19, 19, 18, 15, 17, 16, 13, 10, 9)

SOURCE = {
    "name": "speech_transformer (kaituoxu Speech-Transformer)",
    "reference": ("https://github.com/pytorch/benchmark torchbenchmark/models/speech_transformer/config.py "
                  "(SpeechTransformerTrainConfig), __init__.py (DEFAULT_TRAIN_BSIZE), "
                  "input_data/lang_1char/train_chars.txt (vocabulary), input_data/train/data.json (lengths), "
                  "speech_transformer/transformer/{encoder,decoder,attention,module,transformer}.py (structure); "
                  "original: https://github.com/kaituoxu/Speech-Transformer src/transformer/*.py, egs/aishell/run.sh"),
    "hyperparameters": dict(HPARAMS, batch_frames=15000, declared_train_batch=32, effective_train_batch=10,
                            lfr_lengths=list(LFR_LENGTHS), target_lengths=list(TARGET_LENGTHS)),
    "note": ("44,823,040 trainable parameters (output projection shared with the target embedding). "
             "TorchBench declares batch 32 but its frame-based batching over a 10-utterance set yields 10 "
             "utterances per step (pytorch/benchmark#1560); INPUT.default_batch is that effective 10. "
             "Forward returns the decoder logits [B, L+1, vocab], L the longest target (upstream also returns "
             "the shifted labels; see SpeechTransformer.labels). Two positional-encoding buffers "
             "[1, 5000, 512] are registered as upstream does."),
}

INPUT = {"shape": [LFR_LENGTHS[0], HPARAMS["d_input"] * HPARAMS["LFR_m"]], "unit": "utterances",
         "default_batch": 10}


class PositionalEncoding(nn.Module):
    """Fixed sinusoidal table (sin on even, cos on odd channels), returned for the first T positions."""

    def __init__(self, d_model, max_len=5000):
        super().__init__()
        pos = torch.arange(max_len, dtype=torch.float32)[:, None]
        freq = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(10000.0) / d_model))
        table = torch.zeros(max_len, d_model)
        table[:, 0::2] = torch.sin(pos * freq)
        table[:, 1::2] = torch.cos(pos * freq)
        self.register_buffer("pe", table[None])

    def forward(self, x):
        return self.pe[:, :x.size(1)]


class MultiHeadAttention(nn.Module):
    """Post-norm multi-head attention: LayerNorm(q + dropout(fc(attention(q, k, v))))."""

    def __init__(self, n_head, d_model, d_k, d_v, dropout=0.1):
        super().__init__()
        self.n_head, self.d_k, self.d_v, self.p = n_head, d_k, d_v, dropout
        self.w_qs = nn.Linear(d_model, n_head * d_k)
        self.w_ks = nn.Linear(d_model, n_head * d_k)
        self.w_vs = nn.Linear(d_model, n_head * d_v)
        self.layer_norm = nn.LayerNorm(d_model)
        self.fc = nn.Linear(n_head * d_v, d_model)
        self.dropout = nn.Dropout(dropout)

    def _heads(self, x, width):
        b, t, _ = x.shape
        return x.view(b, t, self.n_head, width).transpose(1, 2)      # b x h x t x width

    def forward(self, q, k, v, blocked=None):
        """`blocked`: bool [B, Lq, Lk], True where the query may not attend to the key."""
        b, lq, _ = q.shape
        qh = self._heads(self.w_qs(q), self.d_k)
        kh = self._heads(self.w_ks(k), self.d_k)
        vh = self._heads(self.w_vs(v), self.d_v)
        allowed = None if blocked is None else ~blocked[:, None]     # broadcast over heads
        ctx = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=allowed,
                                             dropout_p=self.p if self.training else 0.0)
        ctx = ctx.transpose(1, 2).reshape(b, lq, self.n_head * self.d_v)
        return self.layer_norm(self.dropout(self.fc(ctx)) + q)


class PositionwiseFeedForward(nn.Module):
    """Post-norm FFN: LayerNorm(x + dropout(w_2(relu(w_1(x)))))."""

    def __init__(self, d_model, d_inner, dropout=0.1):
        super().__init__()
        self.w_1 = nn.Linear(d_model, d_inner)
        self.w_2 = nn.Linear(d_inner, d_model)
        self.dropout = nn.Dropout(dropout)
        self.layer_norm = nn.LayerNorm(d_model)

    def forward(self, x):
        return self.layer_norm(self.dropout(self.w_2(F.relu(self.w_1(x)))) + x)


class EncoderLayer(nn.Module):
    def __init__(self, d_model, d_inner, n_head, d_k, d_v, dropout=0.1):
        super().__init__()
        self.slf_attn = MultiHeadAttention(n_head, d_model, d_k, d_v, dropout)
        self.pos_ffn = PositionwiseFeedForward(d_model, d_inner, dropout)

    def forward(self, x, keep, blocked):
        x = self.slf_attn(x, x, x, blocked) * keep
        return self.pos_ffn(x) * keep


class DecoderLayer(nn.Module):
    def __init__(self, d_model, d_inner, n_head, d_k, d_v, dropout=0.1):
        super().__init__()
        self.slf_attn = MultiHeadAttention(n_head, d_model, d_k, d_v, dropout)
        self.enc_attn = MultiHeadAttention(n_head, d_model, d_k, d_v, dropout)
        self.pos_ffn = PositionwiseFeedForward(d_model, d_inner, dropout)

    def forward(self, y, memory, keep, self_blocked, cross_blocked):
        y = self.slf_attn(y, y, y, self_blocked) * keep
        y = self.enc_attn(y, memory, memory, cross_blocked) * keep
        return self.pos_ffn(y) * keep


def _frame_mask(lengths, width):
    """bool [B, width]: True at the first lengths[b] positions of row b."""
    return torch.arange(width, device=lengths.device)[None, :] < lengths[:, None]


class Encoder(nn.Module):
    def __init__(self, d_input, n_layers, n_head, d_k, d_v, d_model, d_inner, dropout=0.1, pe_maxlen=5000):
        super().__init__()
        self.linear_in = nn.Linear(d_input, d_model)
        self.layer_norm_in = nn.LayerNorm(d_model)
        self.positional_encoding = PositionalEncoding(d_model, max_len=pe_maxlen)
        self.dropout = nn.Dropout(dropout)
        self.layer_stack = nn.ModuleList(
            EncoderLayer(d_model, d_inner, n_head, d_k, d_v, dropout) for _ in range(n_layers))

    def forward(self, x, lengths):
        valid = _frame_mask(lengths, x.size(1))                           # B x T
        blocked = (~valid)[:, None, :].expand(-1, x.size(1), -1)          # padded keys, B x T x T
        h = self.dropout(self.layer_norm_in(self.linear_in(x)) + self.positional_encoding(x))
        keep = valid[..., None].to(h.dtype)
        for layer in self.layer_stack:
            h = layer(h, keep, blocked)
        return h


class Decoder(nn.Module):
    def __init__(self, sos_id, eos_id, n_tgt_vocab, d_word_vec, n_layers, n_head, d_k, d_v, d_model, d_inner,
                 dropout=0.1, tgt_emb_prj_weight_sharing=True, pe_maxlen=5000):
        super().__init__()
        self.sos_id, self.eos_id = sos_id, eos_id
        self.tgt_word_emb = nn.Embedding(n_tgt_vocab, d_word_vec)
        self.positional_encoding = PositionalEncoding(d_model, max_len=pe_maxlen)
        self.dropout = nn.Dropout(dropout)
        self.layer_stack = nn.ModuleList(
            DecoderLayer(d_model, d_inner, n_head, d_k, d_v, dropout) for _ in range(n_layers))
        self.tgt_word_prj = nn.Linear(d_model, n_tgt_vocab, bias=False)
        if tgt_emb_prj_weight_sharing:
            self.tgt_word_prj.weight = self.tgt_word_emb.weight
            self.x_logit_scale = d_model ** 0.5
        else:
            self.x_logit_scale = 1.0

    def shift(self, padded_target):
        """Decoder input ([<sos>, y, <eos> padding]), label ([y, <eos>, IGNORE_ID padding]) and the number
        of real decoder positions per row (len(y) + 1). IGNORE_ID padding must sit at the end of each row."""
        n = (padded_target != IGNORE_ID).sum(dim=1)                                   # B
        # Upstream re-pads to the longest real target, dropping columns that are padding in every row.
        padded_target = padded_target[:, :int(n.max())]
        b, width = padded_target.shape
        real = _frame_mask(n, width)
        tokens = torch.where(real, padded_target, torch.full_like(padded_target, self.eos_id))
        ys_in = torch.cat([torch.full_like(padded_target[:, :1], self.sos_id), tokens], dim=1)
        ys_out = torch.cat([torch.where(real, padded_target, torch.full_like(padded_target, IGNORE_ID)),
                            torch.full_like(padded_target[:, :1], IGNORE_ID)], dim=1)
        ys_out[torch.arange(b, device=n.device), n] = self.eos_id
        return ys_in, ys_out, n + 1

    def forward(self, padded_target, memory, memory_lengths):
        ys_in, _, n_in = self.shift(padded_target)
        length = ys_in.size(1)
        valid = _frame_mask(n_in, length)                                              # B x L
        future = torch.ones(length, length, dtype=torch.bool, device=ys_in.device).triu(1)
        self_blocked = future[None] | (~valid)[:, None, :]                             # causal + padded keys
        cross_blocked = (~_frame_mask(memory_lengths, memory.size(1)))[:, None, :].expand(-1, length, -1)
        y = self.dropout(self.tgt_word_emb(ys_in) * self.x_logit_scale + self.positional_encoding(ys_in))
        keep = valid[..., None].to(y.dtype)
        for layer in self.layer_stack:
            y = layer(y, memory, keep, self_blocked, cross_blocked)
        return self.tgt_word_prj(y)


class SpeechTransformer(nn.Module):
    """Encoder over LFR features + autoregressive decoder; forward returns logits [B, L+1, vocab], where L is
    the longest target in the batch (its <sos>-shifted input has L+1 positions)."""

    def __init__(self, hp=HPARAMS):
        super().__init__()
        self.encoder = Encoder(hp["d_input"] * hp["LFR_m"], hp["n_layers_enc"], hp["n_head"], hp["d_k"],
                               hp["d_v"], hp["d_model"], hp["d_inner"], hp["dropout"], hp["pe_maxlen"])
        self.decoder = Decoder(hp["sos_id"], hp["eos_id"], hp["vocab_size"], hp["d_word_vec"],
                               hp["n_layers_dec"], hp["n_head"], hp["d_k"], hp["d_v"], hp["d_model"],
                               hp["d_inner"], hp["dropout"], bool(hp["tgt_emb_prj_weight_sharing"]),
                               hp["pe_maxlen"])
        # Upstream's final initialisation: Xavier-uniform on every matrix, module defaults elsewhere.
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)

    def forward(self, padded_input, input_lengths, padded_target):
        memory = self.encoder(padded_input, input_lengths)
        return self.decoder(padded_target, memory, input_lengths)

    def labels(self, padded_target):
        """Targets aligned with forward's logits ([y, <eos>], IGNORE_ID where padded)."""
        return self.decoder.shift(padded_target)[1]


def build() -> nn.Module:
    """Randomly initialised Speech-Transformer with TorchBench's hyper-parameters; nothing is downloaded."""
    return SpeechTransformer(HPARAMS)


def example_inputs(batch: int, device="cpu") -> tuple:
    """(padded_input [B, T, 320], input_lengths [B], padded_target [B, L]) shaped like TorchBench's batch.

    Row i takes the i-th (cyclically) of TorchBench's ten utterance lengths, rows sorted longest first as its
    collate function does; features are N(0, 1) (CMVN-normalised filterbanks) and zero past each length,
    targets are character ids in [3, vocab) and IGNORE_ID past each length.
    """
    g = torch.Generator().manual_seed(0)
    order = sorted(range(batch), key=lambda i: -LFR_LENGTHS[i % len(LFR_LENGTHS)])
    in_lens = torch.tensor([LFR_LENGTHS[i % len(LFR_LENGTHS)] for i in order], dtype=torch.long)
    out_lens = torch.tensor([TARGET_LENGTHS[i % len(TARGET_LENGTHS)] for i in order], dtype=torch.long)
    t, length = int(in_lens.max()), int(out_lens.max())
    feats = torch.randn(batch, t, INPUT["shape"][1], generator=g) * _frame_mask(in_lens, t)[..., None]
    tokens = torch.randint(3, HPARAMS["vocab_size"], (batch, length), generator=g)
    tokens = tokens.masked_fill(~_frame_mask(out_lens, length), IGNORE_ID)
    return feats.to(device), in_lens.to(device), tokens.to(device)
