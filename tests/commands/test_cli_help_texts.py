"""Help that says what an option does (issue 48, item 14): tune's --iters, --warmup and --min-time (and -c,
-T, --placement) had none; report's -o said "required but with --stragglers"."""
from __future__ import annotations

from commbench.commands.report import report_command
from commbench.commands.tune import tune_command


def test_every_tune_option_says_what_it_does():
    undescribed = [param.opts[0] for param in tune_command.params if not getattr(param, "help", None)]
    assert undescribed == [], undescribed


def test_report_o_says_when_it_is_required():
    help_text = next(param.help for param in report_command.params if "-o" in param.opts)
    assert "required, except with --stragglers" in help_text and "but with" not in help_text


def _help(command, option: str) -> str:
    return next(param.help for param in command.params if option in param.opts)


def test_every_predict_option_says_what_it_does_and_auto_is_not_nccl():
    from commbench.commands.predict import predict_command
    from commbench.commands.predict_scaling import predict_scaling_command

    undescribed = [param.opts[0] for param in predict_command.params if not getattr(param, "help", None)]
    assert undescribed == [], undescribed  # -c, -s, -f, -d, -A and --root had none
    assert "Not predict-scaling's default nccl" in _help(predict_command, "-A")
    assert "predict's default auto" in _help(predict_scaling_command, "-A")


def test_train_layout_help_is_trains_not_the_proxys():
    from commbench.commands.proxy import proxy_command, train_command

    train = _help(train_command, "--layout")
    assert "--backend" not in train and "--tflops" not in train and "Replay" not in train
    assert train.startswith("Train a parallel layout") and "FSDP2 (fsdpN)" in train
    assert "--tflops" in _help(proxy_command, "--layout") and "--backend torch" in _help(proxy_command, "--layout")


def test_microbatches_is_the_count_and_microbatch_the_size():
    from commbench.commands.predict_scaling import predict_scaling_command
    from commbench.commands.proxy import proxy_command, train_command

    for command in (proxy_command, train_command):
        assert "how many micro-batches a step runs" in _help(command, "--microbatches")
        assert "the size of one micro-batch, in sequences" in _help(command, "--microbatch")
    assert "the size of one micro-batch, in sequences" in _help(predict_scaling_command, "--microbatch")
    assert "--global-batch" in _help(predict_scaling_command, "--microbatch")


def test_checkpointing_says_each_default_and_why():
    from commbench.commands.predict_scaling import predict_scaling_command
    from commbench.commands.proxy import proxy_command, train_command

    helps = {c.name: _help(c, "--checkpointing") for c in (predict_scaling_command, proxy_command, train_command)}
    assert "[default: selective: the attention scores not stored" in helps["predict-scaling"]
    assert "[default: none: as train --layout runs" in helps["proxy"]
    assert "[default: none: train --layout keeps every activation" in helps["train"]
    assert all("none keeps every activation; selective recomputes" in h for h in helps.values())
