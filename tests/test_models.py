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
    assert spec.name == "user_models"  # named after its module, not the function


FACTORY = ("import torch\nfrom torch import nn\n\n\ndef build():\n"
           "    layers = [nn.Linear(4, 4), nn.Linear(4, 2)]\n"
           "    return layers, torch.randn(3, 4), torch.randn(3, 2), nn.functional.mse_loss\n")


def test_user_factory_is_loaded_by_file_path(tmp_path):
    (tmp_path / "mlp6.py").write_text(FACTORY)
    spec = load_model(f"{tmp_path / 'mlp6.py'}:build")
    assert len(spec.layers) == 2 and spec.name == "mlp6"


def test_a_module_in_the_working_directory_is_found(tmp_path, monkeypatch):
    (tmp_path / "mlp7.py").write_text(FACTORY)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.path", [p for p in __import__("sys").path if p not in ("", str(tmp_path))])
    assert load_model("mlp7:build").name == "mlp7"


@pytest.mark.parametrize("spec, message", [
    ("no_such_module_xyz:factory", "cannot import"),
    ("missing/file.py:factory", "no such file"),
    ("user_models:missing", "no callable"),
    ("user_models:broken", "must return"),
    ("resnet", "not a built-in"),
])
def test_bad_model_specs_are_input_errors(spec, message):
    with pytest.raises(InputError, match=message):
        load_model(spec)
