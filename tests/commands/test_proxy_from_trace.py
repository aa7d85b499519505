"""`commbench profiles extract --from-trace` as users run it: a profile of a traced DDP job that
`profiles show --buckets` lays out as DDP did, and bad input in one line."""
from conftest import DATA, commbench

DDP0 = str(DATA / "traces" / "ddp_2rank_gloo_rank0.json.gz")


def test_extract_from_trace_then_show_buckets(tmp_path):
    out = tmp_path / "mine.json"
    proc = commbench("profiles", "extract", "--from-trace", DDP0, "--batch", "32", "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    shown = commbench("profiles", "show", str(out), "--buckets")
    assert shown.returncode == 0, shown.stderr
    assert "2 bucket(s), 4,202,496 bytes" in shown.stdout


def test_extract_from_a_file_that_is_no_trace_is_one_line(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text("[1, 2")
    proc = commbench("profiles", "extract", "--from-trace", str(bad), "-o", str(tmp_path / "o.json"))
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "o.json").exists()
