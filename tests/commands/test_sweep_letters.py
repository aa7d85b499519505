"""nccl-tests' letters on a sweep line (issue 48, item 11): where a letter means something else in nccl-tests
(-c, -T, -a, -b, -N) or sweep lacks it (-I, -J, -M, -S, -g, -e, ...), one line, exit 2, saying what it
means there, what says it here, and the `commbench nccl-tests` line that takes it as typed."""
from __future__ import annotations

import pytest

from commbench import cli


def error_of(capsys, *args: str) -> str:
    assert cli.main(["sweep", *args]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("args,there,here", [
    (["-c", "0"], "the number of checked iterations", "--check / --no-check"),  # was "unknown collective '0'"
    (["-c0"], "the number of checked iterations", "--check / --no-check"),
    (["-T", "60"], "a timeout in seconds", "--timeout SECONDS"),  # was "bad --topology '60'"
    (["-a", "1"], "how ranks' times combine", "--rank-agg avg|min|max"),  # was click's "Invalid value"
])
def test_a_letter_sweep_uses_otherwise_says_both_meanings(capsys, args, there, here):
    err = error_of(capsys, "--backend", "sim", *args)
    letter = args[0][:2]
    assert f"in nccl-tests, {there}" in err and f"(here {letter} is --" in err and here in err, err
    assert err.rstrip().endswith(f"commbench nccl-tests -B sim all_reduce_perf {letter} {args[-1][2:] or args[-1]}")


@pytest.mark.parametrize("letter,here", [("-I", "--p99"), ("-J", "--json FILE"), ("-M", "--memory-report"),
                                         ("-S", "--timestamps"), ("-g", "--nprocs N"), ("-K", "--skip-iters"),
                                         ("-t", "sweep has no counterpart")])
def test_a_letter_sweep_lacks_is_answered_for_that_letter(capsys, letter, here):
    """-I/-J/-M/-S got click's bare "No such option"; -g a sizes hint beside the point."""
    err = error_of(capsys, letter, "1")
    assert err.startswith(f"commbench: error: sweep has no {letter}: in nccl-tests, ") and here in err, err
    assert "No such option" not in err and "--sizes" not in err, err


def test_n_is_local_ranks_here_and_says_so_beside_nccl_tests_flags(capsys):
    """-N was accepted silently as local ranks; nccl-tests' -N is run cycles."""
    assert "(where -N is run cycles; here, --nprocs)" in error_of(capsys, "-N", "2", "-g", "2")
    err = error_of(capsys, "-N", "0")  # nccl-tests: cycles without end; was "--nprocs 0: must be at least 1"
    assert "here -N is --nprocs" in err and "run cycles" in err


def test_the_nccl_tests_line_keeps_what_nccl_tests_says(capsys):
    """sweep's own options become nccl-tests' where it has them; what it has not is left out."""
    err = error_of(capsys, "-c", "allgather", "-b", "shm", "--sizes", "8-1M", "--nprocs", "4", "-a", "max",
                   "-T", "1x4", "-I", "1")
    assert err.rstrip().endswith("commbench nccl-tests -B shm all_gather_perf -b 8 -e 1M -g 4 -a 3 -I 1"), err


def test_long_nccl_tests_flags_are_answered_too(capsys):
    err = error_of(capsys, "--minbytes", "8")
    assert "sweep has no --minbytes (nccl-tests' -b)" in err and "--sizes START-END" in err


def test_all_types_or_ops_point_to_nccl_tests(capsys):
    for letter in ("-d", "-o"):
        err = error_of(capsys, letter, "all")
        assert err.rstrip().endswith(f"commbench nccl-tests all_reduce_perf {letter} all"), err


def test_sweeps_own_values_of_the_letters_still_run(capsys):
    assert cli.main(["sweep", "--backend", "sim", "-N", "2", "-T", "1x2", "-a", "min", "-c", "allreduce",
                     "--sizes", "1K"]) == 0
    assert cli.main(["sweep", "--no-such-option"]) == 2 and "nccl-tests" not in capsys.readouterr().err
