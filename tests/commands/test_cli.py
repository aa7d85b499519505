"""The command line: help, and bad input ending in one line with exit code 2."""
import subprocess
import sys

import pytest

from commbench.cli import main


def run(capsys, *args):
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize("args,needle", [
    (["--sizes", "1K-1Q"], "'1Q'"),
    (["--sizes", "0"], "'0'"),
    (["--sizes", "1M-1K"], "smaller than start"),
    (["--sizes", "1K-1M", "--factor", "0.5"], "--factor"),
    (["-c", "allfoo"], "'allfoo'"),
    (["--dtype", "float8"], "'float8'"),
    (["--op", "xor"], "'xor'"),
    (["--op", "avg", "--dtype", "int32"], "avg"),
    (["--nprocs", "0"], "--nprocs 0"),
    (["--iters", "0"], "--iters 0"),
    (["--timeout", "0"], "--timeout"),
    (["--min-time", "-1"], "--min-time"),
    (["-c", "broadcast", "--root", "5", "--nprocs", "2"], "--root 5"),
    (["--device", "cuda"], "cuda"),
    (["--torch-backend", "nccl", "--device", "cpu"], "nccl"),
    (["--backend", "carrier-pigeon"], "'carrier-pigeon'"),
    (["--placement", "sideways"], "sideways"),
    (["--bogus-flag"], "--bogus-flag"),
    (["--json", "/proc/no/such/dir/r.jsonl"], "/proc/no/such/dir"),
    (["-c", "sendrecv", "--nprocs", "1"], "sendrecv needs at least 2 ranks"),
    (["--sizes", "1K-1M", "--factor", "inf"], "--factor"),
    (["--backend", "shm", "--op", "avg", "--dtype", "int32"], "avg needs a float dtype"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, args, needle):
    code, out, err = run(capsys, "sweep", *args)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert needle in lines[0]
    assert "Traceback" not in err and out == ""


def test_console_script_bad_input_has_no_traceback():
    proc = subprocess.run([sys.executable, "-m", "commbench", "sweep", "--sizes", "1K-1Q"], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("commbench: error: bad size '1Q': "
                                   "expected bytes with an optional K, M, G or T suffix, e.g. 64K")


def test_help_lists_options_and_examples(capsys):
    code, out, _ = run(capsys, "sweep", "--help")
    assert code == 0
    for text in ("--sizes", "--factor", "--collective", "--placement", "--rank-agg", "--timeout", "torchrun", "srun",
                 "Exit codes"):
        assert text in out


def test_bare_command_prints_the_overview(capsys):
    code, out, err = run(capsys)
    assert code == 0 and "sweep" in out and "predict" in out and err == ""


def test_top_level_help_and_version(capsys):
    code, out, _ = run(capsys, "--help")
    assert code == 0 and "sweep" in out
    code, out, _ = run(capsys, "--version")
    assert code == 0 and "commbench" in out


def test_help_lists_every_algorithm_of_the_table(capsys):
    """sweep's --algorithm help comes from the algorithm table: a new entry shows up without editing it."""
    from commbench.algorithms import TABLE

    code, out, _ = run(capsys, "sweep", "--help")
    text = " ".join(out.split())
    assert code == 0
    assert all(name in text for entries in TABLE.values() for name in entries)
    assert "twoshot (cuda only)" in text
