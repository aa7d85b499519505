"""Exit codes and messages say the real reason, before anything runs (issue 32, item 9): an output on the
kernel's file systems is bad input (exit 2, named), not a rank's failure (exit 3) after the work; a report
directory that is a file or device says so; a setup's flags are checked before the model is loaded."""
from __future__ import annotations

import os

import pytest

from commbench import cli, job
from commbench.commands import proxy_plan
from commbench.commands.helpers import common


@pytest.fixture
def no_ranks(monkeypatch):
    monkeypatch.setattr(job, "run", lambda *args, **kwargs: pytest.fail("validation let the run start"))


def one_line(capsys, args) -> str:
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err


@pytest.fixture
def records(tmp_path):
    path = tmp_path / "s.jsonl"
    assert cli.main(["sweep", "--backend", "sim", "--hw", "dgx-a100", "-N", "2", "--sizes", "1K", "--json",
                     str(path)]) == 0
    return str(path)


@pytest.mark.parametrize("path", ["/proc/self/mem", "/proc/x.jsonl", "/sys/kernel/x.jsonl"])
def test_an_output_on_a_kernel_file_system_is_refused_naming_it(capsys, no_ranks, path):
    """`--json /proc/self/mem` passed the up-front check (a regular file, opened for writing) and the rank's
    first write failed: exit 3, "a rank failed"."""
    if not os.path.isdir("/" + path.split("/")[1]):
        pytest.skip("no such kernel file system here")
    err = one_line(capsys, ["sweep", "--backend", "sim", "--sizes", "1K", "--json", path])
    assert "is the kernel's" in err and "file system" in err, err


def test_report_names_why_its_directory_cannot_be_used(capsys, records):
    """`-o /dev/full` said "cannot create /dev/full: File exists"; `-o /proc` said "No such file or directory"."""
    assert "-o /dev/full: not a directory" in one_line(capsys, ["report", "-o", "/dev/full", records])
    assert "-o /proc: /proc is the kernel's proc file system" in one_line(capsys, ["report", "-o", "/proc", records])


def test_the_mount_table_names_the_file_system_of_a_path(tmp_path):
    table = tmp_path / "mounts"
    table.write_text("/dev/vda / ext4 rw 0 0\nproc /proc proc rw 0 0\nsysfs /sys sysfs rw 0 0\n"
                     "tmpfs /my\\040disk tmpfs rw 0 0\n")
    assert common.mount_of("/proc/self/mem", str(table)) == ("/proc", "proc")
    assert common.mount_of("/procfile", str(table)) == ("/", "ext4")
    assert common.mount_of("/my disk/x", str(table)) == ("/my disk", "tmpfs")
    assert common.mount_of("/x", str(tmp_path / "none")) == ("", "")


@pytest.mark.parametrize("args,message", [
    (["train", "resnet18", "--setup", "fsdp-full", "--bucket-mb", "5"], "setup fsdp-full has no knob --bucket-mb"),
    (["proxy", "resnet18", "--setup", "fsdp-full", "--bucket-mb", "5"], "setup fsdp-full has no knob --bucket-mb"),
    (["train", "resnet18", "--setup", "zero1"], "setup zero1 does not train here"),
    (["proxy", "resnet18", "--setup", "zero2", "--validate"], "setup zero2 does not train here"),
    (["proxy", "resnet18", "--setup", "fsdp-full", "--single-bucket"], "--no-bucketing/--single-bucket are DDP's"),
])
def test_setup_flags_are_checked_before_the_model_is_loaded(capsys, monkeypatch, no_ranks, args, message):
    """`train --setup fsdp-full --bucket-mb 5` refused the knob after 21 s of start-up (the model built first)."""
    monkeypatch.setattr(proxy_plan, "load_profile", lambda *a: pytest.fail("the model was loaded first"))
    monkeypatch.setattr(proxy_plan, "_check_model_available", lambda *a: pytest.fail("the model was built first"))
    assert message in one_line(capsys, args)
