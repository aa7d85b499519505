"""The `commbench` command line. Thin: each command parses, validates, and calls one library function.

Commands live in commbench/commands/ (sweep; proxy, train, profiles; fit, predict,
predict-scaling, report, compare; selftest); heavy
modules (torch, the backends) are imported inside them, so `--help` starts fast.
Errors a user can cause print one line and exit with code 2.
"""
from __future__ import annotations

import re
import sys

import click

from commbench import __version__
from commbench.commands import (
    check,
    compare,
    compute,
    emulate,
    fit,
    nccltests,
    predict,
    predict_scaling,
    proxy,
    replay,
    report,
    selftest,
    sweep,
    tune,
)
from commbench.commands.helpers.common import refuse_empty_values
from commbench.environment import torch_version
from commbench.errors import EXIT_FAULT, EXIT_INTERRUPTED, EXIT_USAGE
from commbench.files import shown


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="commbench")
def cli() -> None:
    """commbench: communication benchmarks and model proxies for distributed training."""


for command in (sweep.sweep, nccltests.nccl_tests_command, proxy.proxy_command, proxy.train_command,
                proxy.profiles_group, fit.fit_command, predict.predict_command, predict_scaling.predict_scaling_command,
                report.report_command, compare.compare_command, selftest.selftest_command, check.check_command,
                compute.compute_command,
                emulate.emulate_group, tune.tune_command, replay.replay_command):
    cli.add_command(command)
refuse_empty_values(cli)  # one rule for every command: an empty value, or nan or inf, is one line and exit 2


def main(argv: list[str] | None = None) -> int:
    """Console entry point: click's usage errors become one line and exit code 2. Called as the
    process's own entry (argv None: the `commbench` script, `python -m commbench`), it ends the
    process without the interpreter's teardown once the command is done (job.exit_now: torch's
    teardown costs about a second and has aborted finished ranks); called in process, it returns."""
    if argv is None:
        from commbench.files import escape_unencodable_output

        escape_unencodable_output()
    code = _main(argv)
    if argv is None:
        from commbench.job import exit_now

        exit_now(code)
    return code


def _main(argv: list[str] | None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args:  # bare `commbench`: the overview, not an error
        click.echo(cli.get_help(click.Context(cli, info_name="commbench")))
        return 0
    if any("\x00" in arg for arg in args):  # only a caller in process can pass one; os calls would raise
        print("commbench: error: an argument holds a NUL byte", file=sys.stderr)
        return EXIT_USAGE
    old = None if {"-h", "--help", "--version"} & set(args) else torch_below_floor(torch_version())
    if old:
        print(f"commbench: error: {old}", file=sys.stderr)
        return EXIT_USAGE
    try:
        cli.main(args=argv, prog_name="commbench", standalone_mode=False)
    except click.exceptions.Abort:
        print("commbench: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except click.ClickException as exc:  # one line, whatever a file it names held (files.shown)
        print(f"commbench: error: {shown(_message(exc))}", file=sys.stderr)
        return EXIT_FAULT if exc.exit_code == EXIT_FAULT else EXIT_USAGE  # a fault (tune past --timeout): 3
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return 0


TORCH_FLOOR = (2, 11)  # setup.py's install_requires says the same (a test checks); README, "Which torch"


def torch_below_floor(version: str | None) -> str | None:
    """One line when this torch (its version string: 2.6.0+cu124) is older than TORCH_FLOOR, else None (a
    version not spelled as digits is let through). Older torch met commbench's calls half-way: tracebacks
    in the ranks, or a rendezvous that failed, rather than one line."""
    found = re.match(r"(\d+)\.(\d+)", version or "")
    if found and (int(found[1]), int(found[2])) >= TORCH_FLOOR:
        return None
    if version and not found:
        return None
    need = ".".join(map(str, TORCH_FLOOR))
    return (f"commbench needs torch >= {need}, and this is {'torch ' + version if version else 'no torch'}: "
            f"pip install 'torch>={need}' (README, \"Which torch\", says what older ones lack)")


# torchrun's flag given to commbench: click's guess by spelling (--gpus-per-node) sends a CPU user the wrong way
TORCHRUN_NPROCS = ("--nproc-per-node", "--nproc_per_node")
OWN_WAYS = (("--nprocs", "--nprocs N spawns N local ranks (CPU or GPU)"),
            ("--gpus-per-node", "--nodes N --gpus-per-node G lays them out in nodes"),
            ("-g", "-g N runs N ranks, as nccl-tests' flag"))


def _message(exc: click.ClickException) -> str:
    if isinstance(exc, click.NoSuchOption) and exc.option_name in TORCHRUN_NPROCS and exc.ctx is not None:
        flags = {flag for param in exc.ctx.command.params for flag in getattr(param, "opts", [])}
        ways = [text for flag, text in OWN_WAYS if flag in flags]
        if ways:
            return f"no option {exc.option_name} (torchrun's): here, {'; '.join(ways)}"
    return exc.format_message()


if __name__ == "__main__":
    sys.exit(main())
