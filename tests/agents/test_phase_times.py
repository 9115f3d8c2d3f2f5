"""PhaseTimes: a training run's phases timed, on a real (short) imitated PPO run."""

import json
import time

import pytest

from rlpipe.agents.phase_times import PhaseTimes
from rlpipe.agents.ppo import TrainConfig, imitation_budget, train


def test_a_phase_is_timed_even_when_it_fails_and_its_evaluations_are_left_out_of_its_speed(tmp_path):
    times = PhaseTimes()
    with times.phase("ppo", steps=1000) as record:
        time.sleep(0.05)
        record["evaluation_seconds"] = 0.04
    with pytest.raises(KeyboardInterrupt), times.phase("interrupted", steps=10):
        raise KeyboardInterrupt
    assert list(times.phases) == ["ppo", "interrupted"] and times.phases["interrupted"]["seconds"] >= 0
    # 1,000 steps in ~0.05 s of which 0.04 s scoring: ~1,000 / 0.01 s, far above 1,000 / 0.05 s
    assert times.steps_per_s("ppo") > 1000 / 0.05 * 2
    times.write(tmp_path / "phases.json")
    assert PhaseTimes(json.loads((tmp_path / "phases.json").read_text())).phases == times.phases
    assert times.summary().startswith("training took: ppo 0.1 s (1,000 steps,")
    assert "steps/s not counting 0.0 s of held-out scoring), interrupted 0.0 s (10 steps," in times.summary()


@pytest.mark.slow
def test_a_training_run_writes_each_phase_in_order(tmp_path):
    config = TrainConfig(n_timesteps=1024, n_envs=2, n_steps=256, batch_size=128, n_epochs=1, eval_episodes=1,
                         imitate="falcon", imitation_share=1.0, env_kwargs={"duration_s": 300})
    warmup = imitation_budget(config)[2]
    assert warmup == 512  # half the imitation's share, in whole rollouts: the run has a critic phase
    train(config, tmp_path, progress=False)
    phases = json.loads((tmp_path / "phases.json").read_text())
    assert list(phases) == ["imitation", "critic warm-up", "scoring the imitated policy", "ppo"]
    assert phases["critic warm-up"]["steps"] == warmup and phases["ppo"]["steps"] == 1024
    assert all(record["seconds"] > 0 for record in phases.values())
    # the run is scored once more at its end, inside the PPO phase: counted as its evaluation
    assert 0 < phases["ppo"]["evaluation_seconds"] < phases["ppo"]["seconds"]
