"""PhaseTimes: a training run's phases timed, on a real (short) imitated PPO run."""

import json
import re
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
    assert times.phases["ppo"]["seconds"] >= 0.05
    # the 0.04 s of scoring is not the phase's own: 1,000 steps over the rest of its time
    assert times.steps_per_s("ppo") == pytest.approx(1000 / (times.phases["ppo"]["seconds"] - 0.04))
    times.write(tmp_path / "phases.json")
    assert PhaseTimes(json.loads((tmp_path / "phases.json").read_text())).phases == times.phases
    assert re.fullmatch(r"training took: ppo \d+\.\d s \(1,000 steps, [\d,]+ steps/s not counting 0\.0 s of held-out "
                        r"scoring\), interrupted \d+\.\d s \(10 steps, [\d,]+ steps/s\)", times.summary())


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
