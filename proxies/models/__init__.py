"""Model definitions commbench writes itself, from the published hyper-parameters of models that
no installable package provides (TorchBench's speech_transformer and tts_angular, Pytorch-UNet)."""
