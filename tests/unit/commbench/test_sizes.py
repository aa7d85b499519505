"""--sizes parsing: ranges, lists, suffixes, and the errors users can make."""
import pytest

from commbench.sizes import MAX_SIZES, SizeError, format_size, parse_size, parse_sizes


@pytest.mark.parametrize("text,nbytes", [("1024", 1024), ("1K", 1024), ("1k", 1024), ("64KiB", 65536),
                                         ("64KB", 65536), ("1.5M", 1572864), ("1G", 1 << 30), ("2T", 2 << 40),
                                         ("8", 8)])
def test_parse_size(text, nbytes):
    assert parse_size(text) == nbytes


def test_range_doubles_by_default_like_nccl_tests():
    assert parse_sizes("1K-16K") == [1024, 2048, 4096, 8192, 16384]
    assert len(parse_sizes("1K-1G")) == 21


def test_range_with_factor_and_step():
    assert parse_sizes("8-128M", factor=4) == [8 * 4 ** i for i in range(13)]
    assert parse_sizes("1K-4K", step="1K") == [1024, 2048, 3072, 4096]
    assert parse_sizes("100-350", step=100) == [100, 200, 300]


def test_list_is_sorted_and_deduplicated():
    assert parse_sizes("4K,1K,1024,1M") == [1024, 4096, 1 << 20]


def test_single_size():
    assert parse_sizes("32M") == [32 << 20]


@pytest.mark.parametrize("spec,needle", [("1K-1Q", "'1Q'"), ("0", "positive"), ("1M-1K", "smaller than start"),
                                         ("abc", "'abc'"), ("", "empty"), ("1.3", "whole number"),
                                         ("-5", "sizes are positive"), (",", "an empty item"),
                                         ("1K,", "an empty item"), ("1K,,2K", "an empty item")])
def test_bad_sizes_name_the_bad_part(spec, needle):
    with pytest.raises(SizeError, match=needle.replace("(", r"\(")):
        parse_sizes(spec)


def test_bad_factor_and_step():
    with pytest.raises(SizeError, match="greater than 1"):
        parse_sizes("1K-1M", factor=1)
    with pytest.raises(SizeError, match="either --factor or --step"):
        parse_sizes("1K-1M", factor=2, step="1K")
    with pytest.raises(SizeError, match="more than"):
        parse_sizes("1-1G", step=1)
    assert MAX_SIZES >= 1000


def test_format_size():
    assert format_size(1024) == "1 KiB"
    assert format_size(1536 * 1024) == "1.5 MiB"
    assert format_size(1 << 30) == "1 GiB"
    assert format_size(100) == "100 B"
