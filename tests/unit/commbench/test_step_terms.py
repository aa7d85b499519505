"""The step terms of a hardware file (commbench/step_terms.py): read with their source, refused in one line when
damaged, defaulted by device class where a file has none, and applied by the step's prediction."""
import json

import pytest

from commbench.analysis.predict_scaling import applied_terms
from commbench.analysis.scaling import StepQuestion, predict_step
from commbench.costmodel import HardwareError, hardware_from_dict, load_hardware, terms_of
from commbench.proxies.profile import load_profile
from commbench.step_terms import CPU_DEFAULTS, GPU_DEFAULTS, SOURCES
from commbench.topology import Topology


def _file(**terms) -> dict:
    data = load_hardware("dgx-a100").to_dict()
    data["step_terms"] = terms
    return data


def test_a_files_terms_are_read_with_their_source_and_the_rest_defaulted():
    hw = hardware_from_dict(_file(overlap_slowdown={"value": 0.3, "source": "fitted", "evidence": "a run"}))
    terms = terms_of(hw)
    assert (terms.overlap_slowdown.value, terms.overlap_slowdown.source) == (0.3, "fitted")
    assert terms.step_cv == GPU_DEFAULTS.step_cv and terms.per_bucket_us == GPU_DEFAULTS.per_bucket_us
    again = hardware_from_dict(json.loads(json.dumps(hw.to_dict())))  # written and read back: the same terms
    assert terms_of(again) == terms


@pytest.mark.parametrize("terms, words", [
    ({"overlap_slowdown": {"value": -1, "source": "measured"}}, "step_terms.overlap_slowdown.value"),
    ({"overlap_slowdown": {"value": "0.3", "source": "measured"}}, "step_terms.overlap_slowdown.value"),
    ({"step_cv": {"value": 0.01, "source": "guessed"}}, "step_terms.step_cv.source"),
    ({"jitter": {"value": 0.01, "source": "measured"}}, "unknown term 'jitter'"),
    ({"per_bucket_us": 5}, "step_terms.per_bucket_us must be a JSON object"),
    ({"step_cv": {"value": 50, "source": "measured"}}, "step_terms.step_cv.value must be a number from 0 to 1,"),
    ({"overlap_slowdown": {"value": 1e308, "source": "fitted"}}, "overlap_slowdown.value must be a number from 0"),
    ({"per_bucket_us": {"value": 10**400, "source": "fitted"}}, "per_bucket_us.value must be a number from 0 to"),
])
def test_a_damaged_block_is_one_line_naming_the_field(terms, words):
    with pytest.raises(HardwareError) as info:
        hardware_from_dict(_file(**terms), "hw.json")
    assert words in str(info.value) and str(info.value).startswith("hw.json: ") and "\n" not in str(info.value)


def test_defaults_by_device_class_say_their_source():
    gpu = load_hardware("dgx-a100")
    assert gpu.step_terms is None and terms_of(gpu) == GPU_DEFAULTS
    cpu = hardware_from_dict({**_file(), "step_terms": None, "meta": {"measured_on": {"device": "cpu"}}})
    assert terms_of(cpu) == CPU_DEFAULTS
    for terms in (GPU_DEFAULTS, CPU_DEFAULTS):
        for name in ("overlap_slowdown", "step_cv", "per_bucket_us"):
            term = getattr(terms, name)
            assert term.source in SOURCES and term.evidence  # every figure says where it came from
    assert GPU_DEFAULTS.overlap_slowdown.source == "defaulted"  # no GPU measured it


def test_a_fitted_file_without_a_block_applies_none_and_with_one_applies_it():
    fitted = {**_file(), "step_terms": None, "meta": {"levels_fitted": {"intra": True, "inter": False}}}
    assert applied_terms(hardware_from_dict(fitted)) is None
    own = {**fitted, "step_terms": {"per_bucket_us": {"value": 50.0, "source": "measured", "evidence": "x"}}}
    assert applied_terms(hardware_from_dict(own)).per_bucket_us.value == 50.0


def test_the_terms_lengthen_the_step_as_they_say():
    """overlap_slowdown s: the compute overlapped by a call runs at 1 / (1 + s); per_bucket_us: each call's
    framework time added to the step (as other)."""
    profile, topo = load_profile("resnet50"), Topology(2, 8)
    base = load_hardware("dgx-a100")

    def step(**terms):
        hw = hardware_from_dict(_file(**{k: {"value": v, "source": "measured", "evidence": "t"}
                                         for k, v in terms.items()}))
        return predict_step(StepQuestion.ddp(profile, 32, 10_000.0, 20_000.0, terms=terms_of(hw)), topo, hw)

    plain = step()
    alone = predict_step(StepQuestion.ddp(profile, 32, 10_000.0, 20_000.0), topo, base)
    assert plain.times.step_us == pytest.approx(alone.times.step_us)
    buckets = step(per_bucket_us=100.0)
    assert buckets.times.step_us - plain.times.step_us == pytest.approx(100.0 * plain.calls)
    slowed = step(overlap_slowdown=1.0)  # half pace while a call runs: the overlapped compute takes longer
    assert plain.times.step_us < slowed.times.step_us <= plain.times.step_us + plain.times.comm_us
    assert slowed.times.other_us > plain.times.other_us  # what it takes shows as other, as measured


def test_a_fitted_files_own_step_cv_gives_stragglers_said_as_its_own():
    from commbench.analysis.predict_scaling import evidence_terms

    fitted = {**_file(), "meta": {"levels_fitted": {"intra": True, "inter": True}},
              "step_terms": {"step_cv": {"value": 0.05, "source": "fitted", "evidence": "run.jsonl"}}}
    hw = hardware_from_dict(fitted)
    used, ratios, said = evidence_terms(hw, None)
    assert used == hw  # its bandwidths are measured: no NIC term
    assert ratios is not None and said == tuple(s for s in said if s.startswith("the file's step_terms: stragglers"))
    assert len(said) == 1 and "CV 5.00% (step_cv, fitted: run.jsonl" in said[0]
