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
