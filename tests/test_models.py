import pytest
import torch

from rlpipe.errors import InputError
from rlpipe.models import BUILTIN_MODELS, load_model


@pytest.mark.parametrize("name", sorted(BUILTIN_MODELS))
def test_builtin_models_run_forward_and_backward(name):
    spec = load_model(name, num_layers=6, microbatch_size=2)
    assert len(spec.layers) == 6
    x = spec.example_microbatch
    for layer in spec.layers:
        x = layer(x)
    loss = spec.loss_fn(x, spec.target)
    loss.backward()
    assert loss.dim() == 0 and torch.isfinite(loss)


def test_same_seed_builds_the_same_parameters():
    a = load_model("mlp", num_layers=3, seed=7)
    b = load_model("mlp", num_layers=3, seed=7)
    assert all(torch.equal(p, q) for p, q in zip(a.layers[0].parameters(), b.layers[0].parameters()))


def test_user_factory_is_loaded_by_module_path():
    spec = load_model("user_models:tiny")
    assert len(spec.layers) == 5 and spec.example_microbatch.shape == (4, 8)


@pytest.mark.parametrize("spec, message", [
    ("no_such_module_xyz:factory", "cannot import"),
    ("user_models:missing", "no callable"),
    ("user_models:broken", "must return"),
    ("resnet", "not a built-in"),
])
def test_bad_model_specs_are_input_errors(spec, message):
    with pytest.raises(InputError, match=message):
        load_model(spec)
