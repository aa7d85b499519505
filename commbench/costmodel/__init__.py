"""The analytic cost model, one package (docs/model.md): a machine's figures (`hardware`: Hardware, hardware
files and presets), a schedule's rounds -> time (`rounds`), NCCL's own choice and time for an allreduce
(`nccl_tuning`), and the cost of one call by any algorithm a prediction names (`call`: call_us), in that order
up: each imports only those before it. `from commbench.costmodel import ...` reaches every public name.
"""
from commbench.costmodel.call import (
    ALLREDUCE_ALGORITHMS,
    FULL_SCHEDULE_MAX_RANKS,
    algorithm_us,
    call_form,
    call_us,
    call_variants_us,
    table_form,
)
from commbench.costmodel.hardware import (
    HARDWARE_FIELDS,
    MAX_HARDWARE_BYTES,
    PRESET_DIR,
    Hardware,
    HardwareError,
    hardware_from_dict,
    load_hardware,
    presets,
    terms_of,
)
from commbench.costmodel.rounds import (
    form_us,
    in_cache,
    link_loads,
    phases_us,
    round_us,
    schedule_us,
    variants_us,
    working_set_bytes,
)

__all__ = ["ALLREDUCE_ALGORITHMS", "FULL_SCHEDULE_MAX_RANKS", "HARDWARE_FIELDS", "MAX_HARDWARE_BYTES", "PRESET_DIR",
           "Hardware", "HardwareError", "algorithm_us", "call_form", "call_us", "call_variants_us", "form_us",
           "hardware_from_dict", "in_cache", "link_loads", "load_hardware", "phases_us", "presets", "round_us",
           "schedule_us", "table_form", "terms_of", "variants_us", "working_set_bytes"]
