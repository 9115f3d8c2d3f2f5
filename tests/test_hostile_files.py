"""Hostile files (hypothesis): every command that reads a profile, a trace, a YAML config, a policy
artifact, a run log or a calibration ends, on a malformed one, with one line and exit 2, never a
traceback. Files are valid ones mutated: a value replaced (wrong type, NaN, inf, huge, empty), a key
deleted, the text truncated, bytes that are not UTF-8, nothing at all.

Each example first asks the loader: a file it refuses must be refused by every command in one line
(exit 2); a file it accepts must not crash the cheap commands either (exit 0, or 2 for another
reason), and the commands that would start real work on it (run, train) are not started."""

from __future__ import annotations

import copy
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from live_runs import ENV

from rlpipe.cli import main
from rlpipe.errors import InputError

ROOT = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent
EXAMPLES = int(os.environ.get("RLPIPE_HOSTILE_EXAMPLES", "40"))  # more for a deeper search
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

# --- mutations ------------------------------------------------------------------------------------

HOSTILE_VALUES = st.one_of(
    st.none(), st.booleans(), st.sampled_from([0, -1, 1, 10**30, -(10**30), 2**63]),
    st.sampled_from([math.nan, math.inf, -math.inf, 1e308, -1e308, 1e-320, 0.5]),
    st.sampled_from(["", "x", "1", "nan", "\u2603"]), st.just([]), st.just({}), st.just([1, "a", None]),
)


def paths(document: Any, prefix: tuple = ()) -> list[tuple]:
    """Every place in a JSON-like document: a tuple of keys and indices."""
    found = [prefix]
    if isinstance(document, dict):
        for key, value in document.items():
            found += paths(value, (*prefix, key))
    elif isinstance(document, list):
        for index, value in enumerate(document[:6]):  # the first few items of long lists
            found += paths(value, (*prefix, index))
    return found


@st.composite
def mutated(draw, document: Any) -> Any:
    """``document`` with one place replaced by a hostile value, or deleted."""
    doc = copy.deepcopy(document)
    where = draw(st.sampled_from(paths(doc)))
    if not where:
        return draw(HOSTILE_VALUES)
    parent = doc
    for step in where[:-1]:
        parent = parent[step]
    if draw(st.booleans()) and isinstance(parent, (dict, list)):
        del parent[where[-1]]
    else:
        parent[where[-1]] = draw(HOSTILE_VALUES)
    return doc


@st.composite
def damaged(draw, text: str) -> bytes:
    """``text`` (a valid file) truncated, emptied, or carrying bytes that are not UTF-8."""
    raw = text.encode()
    kind = draw(st.sampled_from(["truncated", "empty", "not utf-8", "random"]))
    if kind == "truncated":
        return raw[:draw(st.integers(0, max(len(raw) - 1, 0)))]
    if kind == "empty":
        return b""
    if kind == "not utf-8":
        at = draw(st.integers(0, len(raw)))
        return raw[:at] + b"\xff\xfe\xc3" + raw[at:]
    return draw(st.binary(max_size=200))


def json_files(document: Any) -> st.SearchStrategy[bytes]:
    """A valid JSON document mutated, or its text damaged (JSON written with NaN and Infinity)."""
    return st.one_of(mutated(document).map(lambda doc: json.dumps(doc).encode()),
                     damaged(json.dumps(document, indent=1)))


# --- running a command ----------------------------------------------------------------------------

def run_cli(capsys, *argv: str) -> tuple[int, str]:
    """``rlpipe ARGV`` in this process: its exit code and stderr. An exception escaping ``main`` (a
    traceback for the user) fails the test by itself."""
    capsys.readouterr()
    code = main(list(argv))
    return code, capsys.readouterr().err


def assert_refused(capsys, argv: list[str]) -> None:
    code, err = run_cli(capsys, *argv)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, (argv, code, err)


def assert_no_crash(capsys, argv: list[str]) -> None:
    code, err = run_cli(capsys, *argv)
    assert code in (0, 2) and "Traceback" not in err, (argv, code, err)
    if code == 2:
        assert len(err.strip().splitlines()) == 1, (argv, err)


def check(capsys, load, cheap: list[list[str]], costly: list[list[str]], accepted=None) -> None:
    """The contract: what the loader refuses every command refuses in one line; what it accepts the
    cheap commands survive, and ``accepted(loaded)`` holds of it (what the loaded thing must be usable for)."""
    try:
        loaded = load()
    except InputError as err:
        assert len(str(err).splitlines()) == 1, str(err)
        for argv in cheap + costly:
            assert_refused(capsys, argv)
        return
    for argv in cheap:
        assert_no_crash(capsys, argv)
    if accepted is not None:
        accepted(loaded)


def evaluate_args(out: Path, *extra: str) -> list[str]:
    return ["evaluate", "--policies", "static", "--scenarios", "none", "--episodes", "1", "--stages", "2",
            "--duration-s", "20", "--out", str(out), *extra]


RUN = ["run", "--model", "mlp", "--layers", "16", "--stages", "2", "--iterations", "2", "--interval", "2"]

# --- profiles -------------------------------------------------------------------------------------

PROFILE = json.loads((ROOT / "rlpipe" / "profiles" / "mlp16.json").read_text())


@pytest.mark.slow
@SETTINGS
@given(content=json_files(PROFILE))
def test_hostile_profiles(tmp_path, capsys, content):
    from rlpipe.profile import load_profile

    path = tmp_path / "profile.json"
    path.write_bytes(content)
    check(capsys, lambda: load_profile(path),
          cheap=[["partition", "--profile", str(path), "--stages", "2"],
                 ["simulate", "--profile", str(path), "--boundaries", "0,1"],
                 evaluate_args(tmp_path / "eval", "--profile", str(path))],
          costly=[[*RUN, "--profile", str(path)]])


# --- traces ---------------------------------------------------------------------------------------

TRACE_ROWS = [["time_s", "device", "slowdown"], ["0", "0", "1.0"], ["5", "1", "2.5"], ["9", "link:0", "0.5"],
              ["12", "1", "1.0"]]
HOSTILE_CELLS = st.sampled_from(["", "x", "nan", "inf", "-inf", "-1", "1e999", "1e308", "0", "link:", "link:x",
                                 "99", "2.5.1", "\u2603", "0x10", "1_0"])


@st.composite
def trace_files(draw) -> bytes:
    rows = copy.deepcopy(TRACE_ROWS)
    kind = draw(st.sampled_from(["cell", "row", "column", "damaged"]))
    if kind == "cell":
        row, column = draw(st.integers(0, len(rows) - 1)), draw(st.integers(0, 2))
        rows[row][column] = draw(HOSTILE_CELLS)
    elif kind == "row":
        rows.insert(draw(st.integers(1, len(rows))), draw(st.lists(HOSTILE_CELLS, max_size=4)))
    elif kind == "column":
        column = draw(st.integers(0, 2))
        rows = [row[:column] + row[column + 1:] for row in rows]
    else:
        return draw(damaged("\n".join(",".join(row) for row in rows) + "\n"))
    return ("\n".join(",".join(row) for row in rows) + "\n").encode()


@pytest.mark.slow
@SETTINGS
@given(content=trace_files())
def test_hostile_traces(tmp_path, capsys, content):
    from rlpipe.interference import load_trace_csv

    path = tmp_path / "trace.csv"
    path.write_bytes(content)
    check(capsys, lambda: load_trace_csv(path),
          cheap=[evaluate_args(tmp_path / "eval", "--scenarios", f"trace:{path}")],
          costly=[["train", "--scenarios", f"trace:{path}", "--timesteps", "64", "--out", str(tmp_path / "t")],
                  [*RUN, "--interference", f"trace:{path}"]])


# --- YAML training configs ------------------------------------------------------------------------

CONFIG = yaml.safe_load((ROOT / "configs" / "ppo.yml").read_text())


@st.composite
def yaml_files(draw) -> bytes:
    if draw(st.booleans()):
        return draw(damaged((ROOT / "configs" / "ppo.yml").read_text()))
    return yaml.safe_dump(draw(mutated(CONFIG)), allow_unicode=True).encode()


@pytest.mark.slow
@SETTINGS
@given(content=yaml_files())
def test_hostile_training_configs(tmp_path, capsys, content):
    from rlpipe.agents.ppo import TrainConfig

    path = tmp_path / "ppo.yml"
    path.write_bytes(content)
    shutil.copy(ROOT / "configs" / "calibration-cpu.json", tmp_path)  # the config names it beside itself
    def runs_an_episode_step(config: TrainConfig) -> None:  # an accepted config must train: its environment steps
        from rlpipe.agents.ppo import _env_kwargs
        from rlpipe.envs import RepartitionEnv

        env = RepartitionEnv(**_env_kwargs(config))
        observation, _ = env.reset(seed=0)
        assert observation.shape == env.observation_space.shape and env.step(0)[0].shape == observation.shape
        assert config.n_timesteps >= 1 and config.batch_size <= config.n_steps * config.n_envs

    check(capsys, lambda: TrainConfig.from_yaml(path), cheap=[],
          costly=[["train", "--config", str(path), "--out", str(tmp_path / "t")]], accepted=runs_an_episode_step)


# --- policy artifacts (policy.json + policy.pt) ---------------------------------------------------

POLICY_DIR = ROOT / "rlpipe" / "policies"
POLICY_META = json.loads((POLICY_DIR / "default.json").read_text())


@st.composite
def policy_pairs(draw) -> tuple[bytes, bytes]:
    weights = (POLICY_DIR / "default.pt").read_bytes()
    if draw(st.booleans()):
        return draw(json_files(POLICY_META)), weights
    kind = draw(st.sampled_from(["truncated", "flipped", "empty", "random"]))
    if kind == "truncated":
        return json.dumps(POLICY_META).encode(), weights[:draw(st.integers(0, len(weights) - 1))]
    if kind == "flipped":
        at = draw(st.integers(0, len(weights) - 1))
        return json.dumps(POLICY_META).encode(), weights[:at] + bytes([weights[at] ^ 0xFF]) + weights[at + 1:]
    return json.dumps(POLICY_META).encode(), b"" if kind == "empty" else draw(st.binary(max_size=300))


@pytest.mark.slow
@SETTINGS
@given(pair=policy_pairs())
def test_hostile_policy_artifacts(tmp_path, capsys, pair):
    from rlpipe.agents.deployed import load_deployed_policy

    folder = tmp_path / "artifact"
    folder.mkdir(exist_ok=True)
    (folder / "policy.json").write_bytes(pair[0])
    (folder / "policy.pt").write_bytes(pair[1])
    check(capsys, lambda: load_deployed_policy(str(folder)),
          cheap=[evaluate_args(tmp_path / "eval", "--policies", f"ppo:{folder}")],
          costly=[[*RUN, "--policy", f"ppo:{folder}"]])


# --- run logs (report, calibrate) and calibrations ------------------------------------------------

@pytest.fixture(scope="module")
def run_log(tmp_path_factory) -> list[dict]:
    """The records of a real short live run (with its run header), to mutate."""
    log = tmp_path_factory.mktemp("live") / "run.jsonl"
    result = subprocess.run([sys.executable, "-m", "rlpipe.cli", "run", "--model", "mlp", "--layers", "6",
                             "--stages", "2", "--microbatches", "4", "--batch", "16", "--iterations", "25",
                             "--interval", "5", "--policy", "dynpipe", "--log", str(log)],
                            capture_output=True, text=True, timeout=240,
                            env=ENV)
    assert result.returncode == 0, result.stderr[-2000:]
    return [json.loads(line) for line in log.read_text().splitlines()]


@st.composite
def log_files(draw, records: list[dict]) -> bytes:
    text = "".join(json.dumps(record) + "\n" for record in records)
    if draw(st.integers(0, 3)) == 0:
        return draw(damaged(text))
    changed = draw(mutated(records))
    if not isinstance(changed, list):
        return json.dumps(changed).encode()
    return "".join(json.dumps(record) + "\n" for record in changed).encode()


@pytest.mark.slow
@SETTINGS
@given(data=st.data())
def test_hostile_run_logs(tmp_path, capsys, run_log, data):
    from rlpipe.runlog import load_run

    path = tmp_path / "run.jsonl"
    path.write_bytes(data.draw(log_files(run_log)))
    check(capsys, lambda: load_run(path),
          cheap=[["report", str(path), "-o", str(tmp_path / "report")],
                 ["calibrate", str(path), "-o", str(tmp_path / "calibration.json")]],
          costly=[])


CALIBRATION = json.loads((ROOT / "configs" / "calibration-cpu.json").read_text())


@pytest.mark.slow
@SETTINGS
@given(data=st.data())
def test_hostile_calibrations(tmp_path, capsys, run_log, data):
    from rlpipe.calibration import Calibration

    path, log = tmp_path / "calibration.json", tmp_path / "run.jsonl"
    path.write_bytes(data.draw(json_files(CALIBRATION)))
    log.write_text("".join(json.dumps(record) + "\n" for record in run_log))
    check(capsys, lambda: Calibration.load(path),
          cheap=[evaluate_args(tmp_path / "eval", "--calibration", str(path)),
                 ["report", str(log), "-o", str(tmp_path / "report"), "--calibration", str(path)]],
          costly=[["train", "--calibration", str(path), "--timesteps", "64", "--out", str(tmp_path / "t")]])
