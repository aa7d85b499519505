"""What the corpus loaders read alike (analysis/corpus/files.py): a file that is not JSON, or nests past what
the decoder takes, is one line; systems give a preset or their own hardware, never both or neither; each
loader names its file in front of the field."""
import json

import pytest

from commbench.analysis.corpus import collectives, layouts, published
from commbench.analysis.corpus.files import CorpusFormatError, is_int, is_number, objects, read_json, system_hardware


def test_a_file_that_is_not_json_or_nests_too_deep_is_one_error(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(CorpusFormatError, match="Expecting property name"):
        read_json(str(bad))
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(CorpusFormatError):
        read_json(str(deep))
    with pytest.raises(CorpusFormatError):
        read_json(str(tmp_path / "missing.json"))


def test_objects_wants_a_non_empty_object_of_objects():
    assert objects({"systems": {"a": {}}}, "systems") == {"a": {}}
    for value in (None, {}, [], {"a": 1}):
        with pytest.raises(CorpusFormatError, match="systems must be an object of objects"):
            objects({"systems": value}, "systems")


def test_numbers_are_finite_and_never_booleans():
    assert is_number(1) and is_number(2.5) and is_int(3)
    assert not any(is_number(v) for v in (True, float("nan"), float("inf"), "1", None))
    assert not is_int(True) and not is_int(1.0)


def test_a_system_is_a_preset_or_its_own_hardware():
    assert system_hardware("systems.x", {"preset": "dgx-h100"}).name == "dgx-h100"
    for entry in ({}, {"preset": "dgx-h100", "hardware": {}}):
        with pytest.raises(CorpusFormatError, match="give either preset"):
            system_hardware("systems.x", entry)
    with pytest.raises(CorpusFormatError, match="systems.x.preset: "):
        system_hardware("systems.x", {"preset": "no-such-machine"})


@pytest.mark.parametrize("module, load, error", [
    (published, published.load_corpus, published.CorpusError),
    (collectives, collectives.load_collectives, collectives.CollectiveCorpusError),
    (layouts, layouts.load_layout_corpus, layouts.LayoutCorpusError)])
def test_each_loader_names_its_file_and_raises_its_own_error(tmp_path, module, load, error):
    path = tmp_path / "corpus.json"
    path.write_text(json.dumps({"schema": 0}))
    with pytest.raises(error, match=f"^{path}: not a"):
        load(str(path))
    path.write_text("[")
    with pytest.raises(error, match=f"^{path}: "):
        load(str(path))
    assert issubclass(error, CorpusFormatError)
