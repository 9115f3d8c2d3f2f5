import json
import time

import numpy as np
import pytest
import torch

from rlpipe.errors import InputError
from rlpipe.models import load_model
from rlpipe.profile import LayerProfile, load_profile, measure_profile, shipped_profile_names


def test_measure_profile_records_every_field_of_a_real_model():
    spec = load_model("mlp", num_layers=4, microbatch_size=8)
    profile = measure_profile(spec.layers, spec.example_microbatch, spec.target, spec.loss_fn, repeats=2)
    assert profile.num_layers == 4 and profile.microbatch_size == 8
    first = profile.layers[0]
    assert first.fwd_ms > 0 and first.bwd_ms > 0
    assert first.activation_bytes == 8 * 512 * 4  # float32 output of Linear(512, 512) on 8 samples
    assert first.param_bytes == (512 * 512 + 512) * 4
    assert first.optimizer_bytes == 2 * first.param_bytes


def test_profile_json_round_trip(tmp_path):
    profile = load_profile("transformer16")
    path = tmp_path / "p.json"
    profile.save(path)
    assert LayerProfile.load(path) == profile
    assert set(json.loads(path.read_text())["layers"][0]) == {
        "name", "fwd_ms", "bwd_ms", "activation_bytes", "param_bytes", "optimizer_bytes"}


def test_shipped_profiles_load_and_differ_in_shape():
    names = shipped_profile_names()
    assert {"transformer16", "mlp16", "cnn16"} <= set(names)
    transformer = load_profile("transformer16").compute_ms()
    # embedding and head differ from the middle blocks
    middle = transformer[1:-1]
    assert transformer[0] < 0.5 * middle.min() and transformer[-1] > 1.2 * np.median(middle)


def _write(tmp_path, data) -> str:
    path = tmp_path / "bad.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return str(path)


GOOD_LAYER = {"name": "l", "fwd_ms": 1.0, "bwd_ms": 2.0, "activation_bytes": 10, "param_bytes": 4, "optimizer_bytes": 8}


@pytest.mark.parametrize("data, field", [
    ("{not json", "not valid JSON"),
    ({"microbatch_size": 4, "layers": [GOOD_LAYER]}, "'name'"),
    ({"name": "m", "microbatch_size": 0, "layers": [GOOD_LAYER]}, "microbatch_size"),
    ({"name": "m", "microbatch_size": 4, "layers": []}, "layers"),
    ({"name": "m", "microbatch_size": 4, "layers": [{**GOOD_LAYER, "fwd_ms": -1}]}, "layers[0].fwd_ms"),
    ({"name": "m", "microbatch_size": 4, "layers": [GOOD_LAYER, {**GOOD_LAYER, "bwd_ms": "fast"}]}, "layers[1].bwd_ms"),
    ({"name": "m", "microbatch_size": 4, "layers": [{k: v for k, v in GOOD_LAYER.items() if k != "param_bytes"}]},
     "'param_bytes'"),
    ({"name": "m", "microbatch_size": 4, "layers": [{**GOOD_LAYER, "activation_bytes": 1.5}]}, "activation_bytes"),
])
def test_malformed_profile_names_the_file_and_field(tmp_path, data, field):
    path = _write(tmp_path, data)
    with pytest.raises(InputError) as err:
        LayerProfile.load(path)
    assert path in str(err.value) and field in str(err.value)


def test_non_finite_time_is_refused(tmp_path):
    path = _write(tmp_path, '{"name": "m", "microbatch_size": 4, "layers": [{"name": "l", "fwd_ms": NaN, '
                            '"bwd_ms": 1, "activation_bytes": 1, "param_bytes": 1, "optimizer_bytes": 1}]}')
    with pytest.raises(InputError, match="fwd_ms"):
        LayerProfile.load(path)


def test_unknown_profile_name_lists_the_shipped_ones():
    with pytest.raises(InputError, match="transformer16"):
        load_profile("no-such-profile")


class _SlowFirstPass(torch.nn.Module):
    """A layer whose forward is slowed by 30 ms for its first ``slow_calls`` calls (a burst of other work
    on the machine while the profiler's first pass times it)."""

    def __init__(self, slow_calls: int):
        super().__init__()
        self.linear, self.calls, self.slow_calls = torch.nn.Linear(8, 8), 0, slow_calls

    def forward(self, x):
        self.calls += 1
        if self.calls <= self.slow_calls:
            time.sleep(0.03)
        return self.linear(x)


def test_a_burst_that_slows_one_pass_leaves_the_profile_as_the_other_passes_measured_it():
    layers = [torch.nn.Linear(8, 8), _SlowFirstPass(slow_calls=4), torch.nn.Linear(8, 8)]  # 2 of 3 timed
    x, target = torch.randn(4, 8), torch.randn(4, 8)
    one_pass = measure_profile(layers, x, target, torch.nn.functional.mse_loss, warmup=2, repeats=3, passes=1)
    layers[1].calls = 0
    profile = measure_profile(layers, x, target, torch.nn.functional.mse_loss, warmup=2, repeats=3, passes=2)
    assert one_pass.layers[1].fwd_ms > 30.0  # the burst covered the median of the only pass
    assert profile.layers[1].fwd_ms < 10.0 and layers[1].calls == 10  # 2 passes x (2 warm-up + 3 timed)
    assert [layer.activation_bytes for layer in profile.layers] == [4 * 8 * 4] * 3
