"""A real (short) PPO run: train, export, reload without stable-baselines3, act; refusals; fallback."""

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from rlpipe.agents import DecisionContext, make_policy
from rlpipe.agents.artifact import load_artifact
from rlpipe.agents.deployed import default_artifact_path, load_deployed_policy
from rlpipe.agents.ppo import (
    SHORTEST_SCORING_S,
    EfficiencyEvalCallback,
    RolloutThreads,
    TrainConfig,
    beats_beyond_noise,
    imitation_budget,
    train,
    without_distribution_checks,
)
from rlpipe.envs import RepartitionEnv
from rlpipe.envs.evaluation import run_episode
from rlpipe.errors import InputError
from rlpipe.observation import OBSERVATION_VERSION


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("ppo")
    config = TrainConfig(n_timesteps=2048, n_envs=2, n_steps=256, batch_size=128, n_epochs=2, eval_freq=1024,
                         eval_episodes=1, checkpoint_freq=1024, env_kwargs={"duration_s": 600})
    train(config, out, progress=False)
    return out


@pytest.mark.slow
def test_training_writes_the_artifact_and_logs(trained):
    for name in ["policy.pt", "policy.json", "final_model.zip"]:
        assert (trained / name).exists()
    assert (trained / "best" / "best_model.zip").exists() and any((trained / "checkpoints").iterdir())
    assert any((trained / "tb").rglob("events.out.tfevents.*"))
    meta = json.loads((trained / "policy.json").read_text())
    assert meta["observation_version"] == OBSERVATION_VERSION and meta["s_max"] == 8 and meta["training"]["seed"] == 1
    assert (trained / "policy.pt").stat().st_size < 1_000_000


@pytest.mark.slow
def test_exported_actor_acts_exactly_like_sb3(trained):
    from sb3_contrib import MaskablePPO

    model = MaskablePPO.load(trained / "best" / "best_model.zip", device="cpu")
    actor, _ = load_artifact(trained)
    env = RepartitionEnv(duration_s=1800)
    checked = 0
    for seed in range(12):
        observation, _ = env.reset(seed=seed)
        done = False
        while not done and checked < 2000:
            mask = env.action_masks()
            expected, _ = model.predict(observation, action_masks=mask, deterministic=True)
            assert actor.act(observation, mask) == int(expected)
            checked += 1
            observation, _, terminated, truncated, _ = env.step(int(expected))
            done = terminated or truncated
    assert checked > 500


@pytest.mark.slow
def test_artifact_for_another_layout_is_refused(trained, tmp_path):
    meta = json.loads((trained / "policy.json").read_text())
    (tmp_path / "policy.pt").write_bytes((trained / "policy.pt").read_bytes())
    (tmp_path / "policy.json").write_text(json.dumps({**meta, "observation_version": 99}))
    with pytest.raises(InputError, match="observation version 99"):
        load_artifact(tmp_path)
    with pytest.raises(InputError, match="s_max"):
        load_artifact(trained, s_max=16)
    with pytest.raises(InputError, match="nowhere: no such folder .* holding policy.pt and policy.json"):
        make_policy(f"ppo:{tmp_path / 'nowhere'}")
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="empty: no policy artifact there .* holding policy.pt and policy.json"):
        make_policy(f"ppo:{tmp_path / 'empty'}")


def test_the_fallback_is_any_live_heuristic():
    for name in ("static", "greedy", "dynpipe", "threshold", "falcon"):
        assert make_policy("ppo", fallback=name).fallback.name == name  # type: ignore[attr-defined]
    for name in ("oracle", "ppo", "dynpipee"):
        with pytest.raises(InputError, match="fallback"):
            make_policy("ppo", fallback=name)


@pytest.mark.slow
def test_fallback_engages_and_is_counted(trained, tmp_path):
    policy = load_deployed_policy(str(trained))
    env = RepartitionEnv(duration_s=600)
    observation, _ = env.reset(seed=1)
    context = DecisionContext(env.encoder, env.boundaries)
    bad = observation.copy()
    bad[3] = math.nan
    policy.act(bad, env.action_masks(), context)
    assert policy.fallbacks["non-finite statistics"] == 1 and policy.last_fallback == "non-finite statistics"
    missing = load_deployed_policy(str(tmp_path / "missing"), strict=False)
    missing.act(observation, env.action_masks(), context)
    assert missing.last_fallback.startswith("artifact unavailable") and "no such folder" in missing.last_fallback
    assert sum(missing.fallbacks.values()) == 1
    # a whole episode with a broken artifact is dynpipe's episode
    a = run_episode(env, missing, 5, "heavy")
    b = run_episode(env, make_policy("dynpipe"), 5, "heavy")
    assert a.efficiency == pytest.approx(b.efficiency)


def test_config_file_is_validated(tmp_path):
    bad = tmp_path / "bad.yml"
    bad.write_text("rlpipe/Repartition-v0:\n  n_timestep: 5\n")
    with pytest.raises(InputError, match="n_timestep"):
        TrainConfig.from_yaml(bad)
    for key, value in (("imitation_rounds", "-1"), ("anchor_learning_rate", "0"), ("imitate", "nobody"),
                       ("imitation_rare_weight", "0"), ("imitation_workers", "0"), ("imitation_workers", "65"),
                       ("vec_env", "threads"), ("imitation_best_of", "[static, nobody]"),
                       ("imitation_best_of", "static"), ("imitation_best_margin", "1")):
        bad.write_text(f"rlpipe/Repartition-v0:\n  {key}: {value}\n")
        with pytest.raises(InputError, match=key):
            TrainConfig.from_yaml(bad)
    bad.write_text("rlpipe/Repartition-v0:\n  imitation_best_of: [static]\n")
    with pytest.raises(InputError, match="imitation_best_of: .* name the teacher in imitate"):
        TrainConfig.from_yaml(bad)
    config = TrainConfig.from_yaml(Path(__file__).resolve().parents[2] / "configs" / "ppo.yml")
    assert config.n_envs == 16 and "heavy" in config.env_kwargs["scenarios"]


def test_the_shipped_default_policy_loads_and_acts():
    policy = make_policy("ppo")
    assert policy.actor is not None and policy.meta.s_max == 8
    policy_path = default_artifact_path()
    assert policy_path.stat().st_size < 1_000_000
    env = RepartitionEnv(duration_s=1200)
    observation, _ = env.reset(seed=3)
    action = policy.act(observation, env.action_masks(), DecisionContext(env.encoder, env.boundaries))
    assert env.action_masks()[action] and not policy.fallbacks
    assert policy_path.with_suffix(".json").exists()


@pytest.mark.slow
def test_a_short_run_still_scores_keeps_its_best_and_leaves_no_empty_folder(tmp_path):
    from synthetic_logs import synthetic_run

    from rlpipe.calibration import fit

    fit([synthetic_run(0, intervals=30)]).save(tmp_path / "cal.json")
    config = TrainConfig(n_timesteps=512, n_envs=2, n_steps=128, batch_size=128, n_epochs=1, eval_episodes=1,
                         vec_env="subproc", env_kwargs={"duration_s": 300, "calibration": str(tmp_path / "cal.json")})
    # eval_freq and checkpoint_freq lie far beyond the run
    train(config, tmp_path, progress=False)
    history = json.loads((tmp_path / "eval" / "efficiency.json").read_text())
    assert len(history) == 1 and history[0][0] >= 512  # scored once, at the end
    assert (tmp_path / "best" / "best_model.zip").exists() and not (tmp_path / "checkpoints").exists()
    training = json.loads((tmp_path / "policy.json").read_text())["training"]
    assert training["selected"] == "best on held-out seeds"
    assert training["calibration"]["noise_sigma"] > 0  # the artifact records the calibration it trained with


def test_a_later_model_replaces_the_kept_one_only_beyond_the_held_out_noise():
    kept = np.array([0.95, 0.90, 0.99, 0.97])
    assert beats_beyond_noise(kept, None)  # the first model scored is kept
    assert beats_beyond_noise(kept + 0.001, kept)  # better on every episode
    assert not beats_beyond_noise(kept + np.array([0.02, 0.0, 0.0, 0.0]), kept)  # one lucky episode: a tie
    assert not beats_beyond_noise(kept + np.array([0.004, -0.001, 0.002, -0.002]), kept)  # mixed: a tie
    assert not beats_beyond_noise(kept, kept)  # equal: the earlier model stays


def test_a_short_run_imitates_warms_up_and_is_scored_in_proportion(tmp_path):
    """The README's 4,096-step trial of configs/ppo.yml: 40% of its steps imitated, no critic warm-up (819 steps
    would cost a whole 4,096-step rollout), scored on 2 held-out episodes of 120 s spread over the scenarios;
    the full run keeps its budget (the warm-up in whole rollouts, as the shipped policy trained) and scoring."""
    shipped = TrainConfig.from_yaml(Path(__file__).resolve().parents[2] / "configs" / "ppo.yml")
    trial = replace(shipped, n_timesteps=4096)
    assert imitation_budget(trial) == (1638, 546, 0)
    assert imitation_budget(shipped) == (300_000, 100_000, 102_400)
    scorer = EfficiencyEvalCallback(trial, tmp_path)
    assert scorer.env.config.duration_s == SHORTEST_SCORING_S
    assert [scenario for scenario, _ in scorer.episodes] == ["none", "periodic"]  # not none and light
    full = EfficiencyEvalCallback(shipped, tmp_path)
    assert full.env.config.duration_s == shipped.eval_duration_s and len(full.episodes) == shipped.eval_episodes
    scenarios = shipped.env_kwargs["scenarios"]
    assert [scenario for scenario, _ in full.episodes] == [scenarios[i % len(scenarios)] for i in range(22)]


def test_distribution_checks_are_off_while_training_and_back_after_even_on_failure():
    """Training builds its categoricals unchecked (a twentieth of a rollout's time); the process's default
    comes back afterwards, also when training fails."""
    checking = torch.distributions.Distribution._validate_args
    logits = torch.tensor([[0.0, float("nan")]])
    with pytest.raises(RuntimeError), without_distribution_checks():
        torch.distributions.Categorical(logits=logits)  # unchecked: built without complaint
        assert not torch.distributions.Distribution._validate_args
        raise RuntimeError("training failed")
    assert torch.distributions.Distribution._validate_args == checking
    if checking:  # the default (python without -O) checks again: the same logits are refused
        with pytest.raises(ValueError):
            torch.distributions.Categorical(logits=logits)


def test_rollouts_run_on_one_torch_thread_and_updates_on_the_default():
    """Where environments step in other processes, a rollout's idle torch threads would spin on their core."""
    threads, callback = torch.get_num_threads(), RolloutThreads()
    callback.on_rollout_start()
    assert torch.get_num_threads() == 1
    callback.on_rollout_end()
    assert torch.get_num_threads() == threads
