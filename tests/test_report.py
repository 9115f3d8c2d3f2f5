"""Run reports (rlpipe/report.py): how each run's device time is described in the comparison table."""

from rlpipe.report import _split_history, describe_device_time


def summary(**fields):
    return {"device_time": "real", "oversubscribed": False, "transport": "gloo", "device_time_scale": 1.0,
            "profile_id": None, "emulation_overran": None, "emulation_valid": None, **fields}


def test_a_run_on_the_cpu_is_described_by_its_device_time_alone():
    assert describe_device_time(summary()) == "real"
    assert describe_device_time(summary(oversubscribed=True)) == "real, oversubscribed"


def test_a_run_on_gpus_names_its_transport():
    assert describe_device_time(summary(transport="nccl")) == "real, nccl"
    assert describe_device_time(summary(oversubscribed=True, transport="host-staged")) == \
        "real, oversubscribed, host-staged"
    emulated = summary(device_time="emulated", device_time_scale=2.0, profile_id="ab12", emulation_overran=0.01,
                       emulation_valid=True, transport="host-staged")
    assert describe_device_time(emulated) == "emulated x2, profile ab12, host-staged (1.0% overran)"


def test_an_emulated_run_too_short_to_measure_a_chunk_says_so():
    too_short = summary(device_time="emulated", device_time_scale=6.0)  # emulation_overran None: no chunk
    assert describe_device_time(too_short) == "emulated x6 (no chunk measured)"


def test_a_hybrid_runs_panel_names_its_splits_in_turn():
    records = [{"microbatch_split": split} for split in ([4, 4], [4, 4], [3, 5], [2, 6], [2, 6])]
    assert _split_history(records) == "; micro-batches per replica 4,4 -> 3,5 -> 2,6"
    assert _split_history([{"microbatch_split": [8]}]) == ""  # one pipeline: nothing to say

