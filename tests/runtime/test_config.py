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
