import argparse

import pytest

from rlpipe.errors import InputError
from rlpipe.runtime.config import add_run_arguments, config_from_args


def parse(*argv: str):
    parser = argparse.ArgumentParser()
    add_run_arguments(parser)
    return config_from_args(parser.parse_args(["--model", "mlp", "--stages", "2", *argv]))


def test_repeated_repartition_flags_add_up():
    config = parse("--repartition-at", "4:0,2", "--repartition-at", "8:0,6")
    assert config.repartition_at == {4: (0, 2), 8: (0, 6)}
    assert parse("--repartition-at", "4:0,2", "8:0,6").repartition_at == config.repartition_at


def test_the_config_survives_the_trip_to_a_worker_process():
    config = parse("--repartition-at", "4:0,2", "--repartition-at", "8:0,6", "--boundaries", "0,3", "--log", "x")
    parser = argparse.ArgumentParser()
    add_run_arguments(parser)
    assert config_from_args(parser.parse_args(config.to_argv())) == config


def test_indivisible_batch_is_refused():
    with pytest.raises(InputError, match="--batch"):
        parse("--batch", "10", "--microbatches", "4")


@pytest.mark.parametrize("argv, message", [
    (["--time-scale", "0"], "--time-scale: must be > 0"),
    (["--time-scale", "-3"], "--time-scale: must be > 0"),
    (["--keep-checkpoints", "0"], "--keep-checkpoints: must be >= 1"),
    (["--timeout-s", "0"], "--timeout-s: must be > 0"),
    (["--timeout-s", "nan"], "--timeout-s: must be > 0"),
    (["--device-time-scale", "0"], "--device-time-scale: must be > 0"),
    (["--device-time-scale", "-1"], "--device-time-scale: must be > 0"),
    (["--checkpoint-every", "5"], "needs a value >= 1 and --checkpoint-dir"),
    (["--checkpoint-every", "0", "--checkpoint-dir", "x"], "needs a value >= 1 and --checkpoint-dir"),
    (["--duration-s", "0"], "--duration-s: must be > 0"),
    (["--data-parallel", "2", "--batch", "12"], "divisible by the job's 8 micro-batches"),
    (["--data-parallel", "2", "--rebalance-at", "3:2,7"], "--rebalance-at 3:2,7: totals 9"),
])
def test_each_bad_option_is_refused_by_name(argv, message):
    with pytest.raises(InputError, match=message.replace("(", r"\(").replace("+", r"\+")):
        parse(*argv)


def test_a_wall_time_budget_without_iterations_runs_until_it_is_spent():
    assert parse("--duration-s", "30").iterations > 10**9 and parse().iterations == 20
    assert parse("--duration-s", "30", "--iterations", "50").iterations == 50


def test_the_options_name_every_built_in_model():
    from rlpipe.models import BUILTIN_MODELS
    from rlpipe.runtime.config import BUILTIN_MODEL_NAMES

    assert set(BUILTIN_MODEL_NAMES) == set(BUILTIN_MODELS)

