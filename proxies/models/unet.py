"""U-Net for semantic segmentation, as published in milesial's Pytorch-UNet and vendored by TorchBench
as `pytorch_unet`; commbench builds it here because no installable package ships it.

Architecture (facts taken from github.com/milesial/Pytorch-UNet, unet/unet_model.py and
unet/unet_parts.py, as copied into pytorch/benchmark torchbenchmark/models/pytorch_unet/pytorch_unet/unet/):
every stage is a "double conv" (3x3 conv with bias -> BatchNorm -> ReLU, twice). The encoder widens
64 -> 128 -> 256 -> 512 -> 1024 channels, each step after a 2x2 max-pool. The decoder halves the width four
times; each step up-samples, pads to the skip tensor's size (odd sizes such as 959 pixels leave a
one-pixel gap), concatenates [skip, upsampled] on the channel axis and runs a double conv. A 1x1 conv maps
64 channels to the class logits.

Two up-sampling variants exist upstream:
* bilinear=False (the default here, as in Pytorch-UNet's own training script): a 2x2 stride-2 ConvTranspose2d halves the
  channels before the concat; 31,043,586 trainable parameters for 3 input channels and 2 classes.
* bilinear=True (what TorchBench's `pytorch_unet` actually instantiates, `UNet(n_channels=3, n_classes=2,
  bilinear=True)` in torchbenchmark/models/pytorch_unet/__init__.py): parameter-free bilinear up-sampling,
  the bottleneck and decoder double convs are narrowed by 2 (their middle width stays at in_channels // 2);
  17,267,458 trainable parameters. Select it with ``build_bilinear()``.

The parameter count does not depend on the image size. TorchBench feeds 3x640x959 images (Carvana's
1280x1918 frames scaled by 0.5) with a train batch size of 1.

This is commbench's own code; only the layer structure and hyper-parameters carry over.
"""
import torch
import torch.nn.functional as F
from torch import nn

N_CHANNELS = 3
N_CLASSES = 2
WIDTHS = (64, 128, 256, 512, 1024)

SOURCE = {
    "name": "pytorch_unet (milesial Pytorch-UNet)",
    "reference": ("https://github.com/milesial/Pytorch-UNet unet/unet_model.py + unet/unet_parts.py; "
                  "https://github.com/pytorch/benchmark torchbenchmark/models/pytorch_unet/__init__.py "
                  "(input 3x640x959, DEFAULT_TRAIN_BSIZE=1, bilinear=True) and "
                  "torchbenchmark/models/pytorch_unet/pytorch_unet/unet/unet_model.py, unet_parts.py"),
    "hyperparameters": {"n_channels": N_CHANNELS, "n_classes": N_CLASSES, "bilinear": False,
                        "widths": list(WIDTHS), "image": [3, 640, 959], "train_batch": 1},
    "note": ("build() gives the transposed-conv variant (bilinear=False, 31,043,586 parameters) as commbench "
             "specifies; TorchBench's pytorch_unet uses bilinear=True (17,267,458 parameters), available as "
             "build(bilinear=True). BatchNorm running statistics are buffers (DDP broadcasts them when "
             "broadcast_buffers=True). Parameter count is independent of the image size."),
}

INPUT = {"shape": [3, 640, 959], "unit": "images", "default_batch": 1}


class DoubleConv(nn.Module):
    """(3x3 conv -> BatchNorm -> ReLU) applied twice; the first conv may narrow to `mid` channels."""

    def __init__(self, cin, cout, mid=None):
        super().__init__()
        mid = mid or cout
        layers = []
        for a, b in ((cin, mid), (mid, cout)):
            layers += [nn.Conv2d(a, b, kernel_size=3, padding=1), nn.BatchNorm2d(b), nn.ReLU(inplace=True)]
        self.double_conv = nn.Sequential(*layers)

    def forward(self, x):
        return self.double_conv(x)


class Down(nn.Module):
    """Halve the resolution with a 2x2 max-pool, then a double conv."""

    def __init__(self, cin, cout):
        super().__init__()
        self.maxpool_conv = nn.Sequential(nn.MaxPool2d(2), DoubleConv(cin, cout))

    def forward(self, x):
        return self.maxpool_conv(x)


class OutConv(nn.Module):
    """1x1 conv from the last decoder width to the class logits."""

    def __init__(self, cin, n_classes):
        super().__init__()
        self.conv = nn.Conv2d(cin, n_classes, kernel_size=1)

    def forward(self, x):
        return self.conv(x)


class Up(nn.Module):
    """Double the resolution, pad to the skip tensor, concatenate [skip, up] and run a double conv."""

    def __init__(self, cin, cout, bilinear):
        super().__init__()
        if bilinear:
            self.up = nn.Upsample(scale_factor=2, mode="bilinear", align_corners=True)
            self.conv = DoubleConv(cin, cout, cin // 2)
        else:
            self.up = nn.ConvTranspose2d(cin, cin // 2, kernel_size=2, stride=2)
            self.conv = DoubleConv(cin, cout)

    def forward(self, x, skip):
        x = self.up(x)
        dh = skip.shape[-2] - x.shape[-2]
        dw = skip.shape[-1] - x.shape[-1]
        if dh or dw:
            x = F.pad(x, [dw // 2, dw - dw // 2, dh // 2, dh - dh // 2])
        return self.conv(torch.cat([skip, x], dim=1))


class UNet(nn.Module):
    def __init__(self, n_channels=N_CHANNELS, n_classes=N_CLASSES, bilinear=False, widths=WIDTHS):
        super().__init__()
        self.n_channels, self.n_classes, self.bilinear = n_channels, n_classes, bilinear
        w0, w1, w2, w3, w4 = widths
        shrink = 2 if bilinear else 1
        # Attribute names follow the upstream module tree, so parameter names and order match it
        # (e.g. down1.maxpool_conv.1.double_conv.0.weight, outc.conv.bias).
        self.inc = DoubleConv(n_channels, w0)
        self.down1 = Down(w0, w1)
        self.down2 = Down(w1, w2)
        self.down3 = Down(w2, w3)
        self.down4 = Down(w3, w4 // shrink)
        self.up1 = Up(w4, w3 // shrink, bilinear)
        self.up2 = Up(w3, w2 // shrink, bilinear)
        self.up3 = Up(w2, w1 // shrink, bilinear)
        self.up4 = Up(w1, w0, bilinear)
        self.outc = OutConv(w0, n_classes)

    def forward(self, x):
        s1 = self.inc(x)
        s2 = self.down1(s1)
        s3 = self.down2(s2)
        s4 = self.down3(s3)
        x = self.down4(s4)
        x = self.up1(x, s4)
        x = self.up2(x, s3)
        x = self.up3(x, s2)
        x = self.up4(x, s1)
        return self.outc(x)


def build(bilinear: bool = False) -> nn.Module:
    """Randomly initialised U-Net (3 channels in, 2 classes out); no weights are downloaded."""
    return UNet(N_CHANNELS, N_CLASSES, bilinear=bilinear)


def build_bilinear() -> nn.Module:
    """TorchBench's `pytorch_unet` variant (bilinear up-sampling, 17.3 M parameters)."""
    return build(bilinear=True)


def example_inputs(batch: int, device="cpu") -> tuple:
    """A batch of random RGB images of TorchBench's shape, [batch, 3, 640, 959]."""
    return (torch.rand(batch, *INPUT["shape"], device=device),)
