import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env as gym_check_env
from stable_baselines3.common.env_checker import check_env as sb3_check_env

import rlpipe  # noqa: F401  (registers the environment)
from rlpipe.envs import RepartitionEnv
from rlpipe.errors import InputError


def test_registered_and_keyword_options():
    env = gym.make("rlpipe/Repartition-v0", min_stages=3, max_stages=3, duration_s=300)
    obs, _ = env.reset(seed=0)
    assert env.unwrapped.situation.num_stages == 3
    assert env.observation_space.contains(obs)


def test_passes_gymnasium_and_sb3_checks():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a checker's warning is a failure here, not a message to scroll past
        gym_check_env(RepartitionEnv(duration_s=300), skip_render_check=True)
        sb3_check_env(RepartitionEnv(duration_s=300), warn=True)
        sb3_check_env(RepartitionEnv(duration_s=300, data_parallel=(2, 4)), warn=True)


def test_reset_seed_reproduces_an_episode_exactly():
    def rollout(seed, step_info=True):
        env = RepartitionEnv(duration_s=600, step_info=step_info)
        obs, _ = env.reset(seed=seed)
        trajectory, rng = [obs], np.random.default_rng(0)
        done = False
        while not done:
            action = rng.choice(np.flatnonzero(env.action_masks()))
            obs, reward, terminated, truncated, info = env.step(action)
            assert bool(info) == step_info  # training's environments step without the details
            trajectory += [obs, np.array([reward])]
            done = terminated or truncated
        return np.concatenate(trajectory)

    assert np.array_equal(rollout(5), rollout(5))
    assert np.array_equal(rollout(5), rollout(5, step_info=False))
    assert not np.array_equal(rollout(5)[:50], rollout(6)[:50])


def test_working_ahead_between_steps_changes_no_observation_reward_or_mask():
    """prefetch(), what a training process does while it would only wait, works out the reward's reference for
    rows of conditions to come: an episode with calls between its steps is the one without them, bit for bit."""
    def rollout(calls_between_steps):
        env = RepartitionEnv(duration_s=900, scenarios=("seqlen", "mixed"), data_parallel=(2, 2), step_info=False)
        assert not env.prefetch()  # no episode yet
        obs, _ = env.reset(seed=3)
        trajectory, rng, answers, done = [obs], np.random.default_rng(0), [], False
        while not done:
            answers += [env.prefetch() for _ in range(calls_between_steps)]
            mask = env.action_masks()
            action = 0 if rng.random() < 0.9 else rng.choice(np.flatnonzero(mask))
            obs, reward, terminated, truncated, _ = env.step(action)
            trajectory += [mask, obs, np.array([reward])]
            done = terminated or truncated
        return np.concatenate(trajectory), answers

    plain, _ = rollout(0)
    ahead, answers = rollout(40)
    assert sum(answers) > 20 and not all(answers)  # rows were worked out ahead, up to the horizon
    np.testing.assert_array_equal(plain, ahead)


def test_a_step_taken_ahead_changes_no_observation_reward_or_mask():
    """speculate(), what a training process does while it would only wait, takes the next step as if the policy
    keeps the plan: step(keep) returns it, the mask meanwhile is the one before it; any other action (or a
    cancel) goes back first. An episode stepped so, with moves among its actions, is the one stepped plainly,
    bit for bit."""
    def rollout(ahead):
        env = RepartitionEnv(duration_s=900, scenarios=("seqlen", "heavy"), data_parallel=(2, 2), step_info=False)
        assert not env.speculate()  # no episode yet
        obs, _ = env.reset(seed=5)
        trajectory, rng, choices, done = [obs], np.random.default_rng(0), np.random.default_rng(1), False
        used, taken_back = 0, 0
        while not done:
            if ahead:
                assert env.speculate() and not env.speculate()  # one step ahead at most
                if choices.random() < 0.1:  # going back, then ahead again
                    env.cancel_speculation()
                    assert env.speculate()
            mask = env.action_masks()
            action = 0 if rng.random() < 0.8 else rng.choice(np.flatnonzero(mask))
            used, taken_back = used + int(ahead and action == 0), taken_back + int(ahead and action != 0)
            obs, reward, terminated, truncated, _ = env.step(action)
            trajectory += [mask, obs, np.array([reward, env.time_s, env.repartitions, env.stall_total_s])]
            done = terminated or truncated
        assert not env.speculate()  # none past the episode's end
        if ahead:
            assert used > 20 and taken_back > 5  # steps taken ahead were used, and taken back
        obs, _ = env.reset()  # the next episode draws from the generator where the plain one left it
        return np.concatenate([*trajectory, obs])

    np.testing.assert_array_equal(rollout(False), rollout(True))


def test_episode_is_a_stretch_of_time_and_reward_is_efficiency():
    env = RepartitionEnv(duration_s=900, scenarios=("none",), timer_noise=0.0)
    env.reset(seed=1)
    rewards, done = [], False
    while not done:
        _, reward, terminated, truncated, info = env.step(0)
        rewards.append(reward)
        done = terminated or truncated
    assert 900 <= env.time_s < 900 + info["wall_s"] + 1e-9
    assert np.allclose(rewards, 1.0)  # the launch partition is optimal without interference


def test_episode_lengths_drawn_between_min_and_max_duration():
    env = RepartitionEnv(duration_s=900, min_duration_s=30, scenarios=("drift",))
    lengths = []
    for seed in range(12):
        env.reset(seed=seed)
        done = False
        while not done:
            _, _, terminated, truncated, info = env.step(0)
            done = terminated or truncated
        assert env.situation.duration_s <= env.time_s < env.situation.duration_s + info["wall_s"] + 1e-9
        assert env.situation.trace.duration_s == pytest.approx(env.situation.duration_s)  # the scenario fits
        lengths.append(env.situation.duration_s)
    assert 30 <= min(lengths) < 200 and 300 < max(lengths) <= 900  # log-uniform: short and long ones alike
    # without min_duration_s every episode lasts duration_s, drawn as before (the golden evaluation holds)
    fixed = RepartitionEnv(duration_s=900)
    assert fixed.reset(seed=3)[1]["time_s"] > 0
    assert fixed.situation.duration_s == 900 and fixed.situation.trace.duration_s == pytest.approx(900)
    with pytest.raises(InputError, match="min_duration_s"):
        RepartitionEnv(duration_s=900, min_duration_s=1000)


def test_profile_time_scale_draws_slower_devices_whose_state_moves_as_fast():
    """A live job emulated at x6 runs iterations of seconds, where a re-split's stall is a tenth of one: the
    option draws such jobs, each episode's profile times scaled by a factor in the range, the stall unchanged."""
    plain = RepartitionEnv(profiles=("transformer16",), scenarios=("none",), duration_s=300)
    plain.reset(seed=4)
    base_ms = plain.situation.profile.compute_ms()
    scaled = RepartitionEnv(profiles=("transformer16",), scenarios=("none",), duration_s=300,
                            profile_time_scale=(2.0, 8.0))
    factors = []
    for seed in range(8):
        scaled.reset(seed=seed)
        ratio = scaled.situation.profile.compute_ms() / base_ms
        assert np.allclose(ratio, ratio[0])  # every layer alike
        factors.append(float(ratio[0]))
        assert scaled.situation.migration.overhead_s == plain.situation.migration.overhead_s
    assert 2.0 <= min(factors) < 4.0 < max(factors) <= 8.0
    again = RepartitionEnv(profiles=("transformer16",), scenarios=("none",), duration_s=300)
    again.reset(seed=4)  # without the option, episodes are drawn as before
    assert np.array_equal(again.situation.profile.compute_ms(), base_ms)
    with pytest.raises(InputError, match="profile_time_scale"):
        RepartitionEnv(profile_time_scale=(4.0, 2.0))


def test_min_interval_iterations_draws_each_episodes_decision_interval():
    """A live job may decide every 2 iterations: with the option each episode draws its K, and its intervals
    run that many iterations, with the reward still an efficiency (about 1 on a calm job)."""
    env = RepartitionEnv(profiles=("transformer16",), scenarios=("none",), duration_s=120,
                         min_interval_iterations=2, interval_iterations=10, timer_noise=0.0)
    drawn = set()
    for seed in range(12):
        env.reset(seed=seed)
        k, before = env.situation.interval_iterations, env.iteration
        _, reward, _, _, _ = env.step(0)
        assert env.iteration - before == k and reward == pytest.approx(1.0, abs=0.05)
        drawn.add(k)
    assert min(drawn) >= 2 and max(drawn) <= 10 and len(drawn) >= 4
    plain = RepartitionEnv(profiles=("transformer16",), scenarios=("none",), duration_s=120)
    plain.reset(seed=0)
    assert plain.situation.interval_iterations == 10  # without the option, K is interval_iterations
    for bad in ({"min_interval_iterations": 12}, {"min_interval_iterations": 0}, {"interval_iterations": 0}):
        with pytest.raises(InputError, match="interval_iterations"):
            RepartitionEnv(**bad)


def test_repartition_pays_its_stall_in_that_interval():
    env = RepartitionEnv(duration_s=600, scenarios=("none",), min_stages=4, max_stages=4)
    env.reset(seed=2)
    action = next(a for a in range(2, env.action_space.n) if env.action_masks()[a])
    _, reward, _, _, info = env.step(action)
    assert info["stall_s"] >= 0.5 and reward < 1.0
    assert env.repartitions == 1


def test_invalid_action_is_a_penalised_no_op():
    env = RepartitionEnv(duration_s=600, scenarios=("none",), min_stages=2, max_stages=2, timer_noise=0.0)
    env.reset(seed=3)
    before = env.boundaries
    invalid = next(a for a in range(env.action_space.n) if not env.action_masks()[a])
    _, reward, _, _, info = env.step(invalid)
    assert env.boundaries == before and info["invalid_action"]
    assert reward == pytest.approx(1.0 - env.config.invalid_action_penalty)


def test_slowdown_hurts_static_and_replanning_recovers():
    def mean_reward(action):
        env = RepartitionEnv(duration_s=1800, scenarios=("drift",), min_stages=4, max_stages=4, timer_noise=0.0)
        env.reset(seed=4)
        rewards, done = [], False
        while not done:
            a = action if env.action_masks()[action] else 0
            _, reward, terminated, truncated, _ = env.step(a)
            rewards.append(reward)
            done = terminated or truncated
        return np.mean(rewards)

    keep, replan = mean_reward(0), mean_reward(1)
    assert keep < 0.97 and replan > keep + 0.02
