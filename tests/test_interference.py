import re

import numpy as np
import pytest

from rlpipe.errors import InputError
from rlpipe.interference import (
    PRESETS,
    InterferenceTrace,
    colocation_slowdown,
    generate_scenario,
    load_scenario,
    load_trace_csv,
)


@pytest.mark.parametrize("name", PRESETS)
def test_presets_are_seeded_and_valid(name):
    a = generate_scenario(name, 4, 3600, seed=3)
    b = generate_scenario(name, 4, 3600, seed=3)
    np.testing.assert_array_equal(a.change_s, b.change_s)
    np.testing.assert_array_equal(a.slowdown, b.slowdown)
    assert np.all(a.slowdown >= 1.0) and np.all((a.link_factor > 0) & (a.link_factor <= 1.0))
    assert np.all(np.diff(a.change_s) > 0) and a.duration_s == 3600
    if name != "none":
        c = generate_scenario(name, 4, 3600, seed=4)
        assert not (np.array_equal(a.change_s, c.change_s) and np.array_equal(a.slowdown, c.slowdown))


def test_colocation_magnitudes_match_published_measurements():
    rng = np.random.default_rng(0)
    samples = np.array([colocation_slowdown(rng) for _ in range(20000)])
    assert 1.05 <= np.median(samples) <= 1.12
    assert 0.06 <= np.mean(samples > 1.25) <= 0.16  # about one pair in ten slower than 1.25x
    assert samples.max() <= 2.3


def test_heavy_has_rare_stragglers_and_bursty_is_heavy_tailed():
    heavy = [generate_scenario("heavy", 4, 3600, seed) for seed in range(5)]
    assert any(t.slowdown.max() >= 3.0 for t in heavy)
    durations = []
    for seed in range(10):
        trace = generate_scenario("bursty", 1, 3600, seed)
        on = trace.slowdown[:, 0] > 1.0
        for k in np.nonzero(on)[0]:
            end = trace.change_s[k + 1] if k + 1 < len(trace.change_s) else trace.duration_s
            durations.append(end - trace.change_s[k])
    durations = np.array(durations)
    assert np.median(durations) < 20  # many short bursts...
    assert durations.max() > 10 * np.median(durations)  # ...and a few very long ones


def test_drift_degrades_one_device_step_by_step():
    trace = generate_scenario("drift", 4, 3600, seed=1)
    worst = int(np.argmax(trace.slowdown[-1]))
    steps = trace.slowdown[:, worst]
    assert steps[-1] >= 2.0 and np.all(np.diff(steps) >= 0)


def test_a_span_across_a_change_weighs_each_side_by_the_work_done_in_it():
    trace = InterferenceTrace(change_s=np.array([0.0, 10.0]), slowdown=np.array([[1.0, 2.0], [3.0, 2.0]]),
                              link_factor=np.ones((2, 1)), duration_s=60.0)
    # 5 s at 1x and 5 s at 3x: 5 + 5/3 s of nominal work in 10 s, so 1.5x (the mean of the two, 2x, is wrong)
    np.testing.assert_allclose(trace.effective_slowdown(5.0, 15.0), [1.5, 2.0])
    np.testing.assert_allclose(trace.effective_slowdown(10.0, 30.0), [3.0, 2.0])  # inside one stretch: its own
    np.testing.assert_allclose(trace.effective_slowdown(12.0, 12.0), [3.0, 2.0])  # an empty span: the instant's


def test_trace_csv_round_trip_and_device_fit(tmp_path):
    trace = generate_scenario("bursty", 4, 600, seed=2)
    path = tmp_path / "t.csv"
    trace.save_csv(path)
    loaded = load_scenario(f"trace:{path}", 4)
    for t in [5.0, 100.0, 333.3, 599.0]:
        np.testing.assert_allclose(loaded.at(t)[0], trace.at(t)[0], atol=1e-4)
    assert loaded.duration_s == pytest.approx(600)
    assert load_scenario(f"trace:{path}", 6).num_devices == 6  # extra devices run undisturbed
    with pytest.raises(InputError, match="only 2 stages"):
        load_scenario(f"trace:{path}", 2)


@pytest.mark.parametrize("text, message", [
    ("time,device,slowdown\n0,0,1.5\n", "missing column"),
    ("time_s,device,slowdown\n5,0,1.5\n3,0,1.0\n", "goes backwards"),
    ("time_s,device,slowdown\n5,gpu0,1.5\n", "unknown device"),
    ("time_s,device,slowdown\n5,0,0.5\n", "[1, 1000]"),
    ("time_s,device,slowdown\n5,0,1e308\n", "[1, 1000]"),
    ("time_s,device,slowdown\n5,link:0,1.5\n", "[0.001, 1]"),
    ("time_s,device,slowdown\nsoon,0,1.5\n", "time_s"),
    ("time_s,device,slowdown\n5,0,inf\n", "[1, 1000]"),
])
def test_malformed_trace_names_file_line_and_field(tmp_path, text, message):
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(InputError, match=re.escape(message)) as err:
        load_trace_csv(path)
    assert str(path) in str(err.value)


def test_link_rows_set_bandwidth_factors(tmp_path):
    path = tmp_path / "links.csv"
    path.write_text("time_s,device,slowdown\n0,1,2.0\n10,link:0,0.5\n20,1,1.0\n")
    trace = load_trace_csv(path)
    assert trace.num_devices == 2
    np.testing.assert_allclose(trace.at(15.0)[0], [1.0, 2.0])
    np.testing.assert_allclose(trace.at(15.0)[1], [0.5])
    np.testing.assert_allclose(trace.at(25.0)[0], [1.0, 1.0])
