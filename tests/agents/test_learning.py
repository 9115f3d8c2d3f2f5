"""The agent learns: a short PPO run from scratch beats doing nothing and acting at random on a lasting
straggler; imitation reproduces its teacher; the shipped policy beats static and stays with threshold.
Every score is on held-out seeds (rlpipe.seeds: never drawn in training) and a real simulator."""

from dataclasses import dataclass, field

import numpy as np
import pytest
import torch

from rlpipe.agents import make_policy
from rlpipe.agents.imitation import BehaviourAnchor, CloningLoss, PrivilegedTeacher, clone, collect, learner_action
from rlpipe.agents.ppo import TrainConfig, train
from rlpipe.decision import DecisionContext, PolicyBase
from rlpipe.envs import RepartitionEnv
from rlpipe.envs.evaluation import run_episode
from rlpipe.observation import KEEP
from rlpipe.seeds import HELD_OUT_SEED_BASE

# one lasting straggler (1.3-3x, from the first second) in a 4-stage pipeline of one profile
STRAGGLER = {"profiles": ["transformer16"], "min_stages": 4, "max_stages": 4, "scenarios": ["persistent"],
             "microbatches": [16], "schedules": ["1f1b"], "duration_s": 1200.0}
HELD_OUT = [HELD_OUT_SEED_BASE + 900 + k for k in range(6)]


@dataclass
class RandomValidPolicy(PolicyBase):
    """Any valid action, uniformly: what an untrained agent does."""

    name: str = "random"
    rng: np.random.Generator = field(default_factory=lambda: np.random.default_rng(0))

    def reset(self) -> None:
        pass  # no memory of earlier episodes

    def act(self, observation: np.ndarray, mask: np.ndarray, context: DecisionContext) -> int:
        return int(self.rng.choice(np.flatnonzero(mask)))


def mean_efficiency(policy, env_kwargs: dict, seeds: list[int], scenario: str) -> float:
    env = RepartitionEnv(**env_kwargs)
    return float(np.mean([run_episode(env, policy, seed, scenario).efficiency for seed in seeds]))


@pytest.mark.slow
def test_a_short_run_from_scratch_learns_to_move_for_a_lasting_straggler(tmp_path):
    config = TrainConfig(n_timesteps=24_576, n_envs=8, n_steps=256, batch_size=512, n_epochs=5, eval_freq=10**9,
                         eval_episodes=2, eval_duration_s=1200.0, learning_rate=1e-3, env_kwargs=STRAGGLER)
    train(config, tmp_path, progress=False)
    learned = make_policy(f"ppo:{tmp_path}")
    scores = {name: mean_efficiency(policy, STRAGGLER, HELD_OUT, "persistent")
              for name, policy in (("ppo", learned), ("static", make_policy("static")),
                                   ("random", RandomValidPolicy()))}
    assert scores["ppo"] > scores["static"] + 0.05, scores
    assert scores["ppo"] > scores["random"] + 0.05, scores


@pytest.mark.slow
def test_imitation_reproduces_its_teacher_on_a_held_out_episode():
    """The threshold rule's decisions, cloned from 20,000 of them: on held-out episodes the actor takes
    the teacher's action in at least 90% of the intervals and on at least 85% of the teacher's moves
    (measured: 93% and 100%). Together they bind: an actor that always keeps agrees on ~96% of the
    intervals and on none of the moves, one that moves at random on few intervals. The rule counts time
    lost across intervals, which an observation shows only in part, so a clone cannot agree everywhere."""
    from sb3_contrib import MaskablePPO

    env_kwargs = {"duration_s": 3600.0, "scenarios": ["heavy", "periodic", "drift", "mixed"]}  # slowdowns to act on
    demonstrations = collect(env_kwargs, "threshold", 20_000)
    model = MaskablePPO("MlpPolicy", RepartitionEnv(**env_kwargs), seed=0, policy_kwargs={"net_arch": [256, 256]})
    clone(model.policy, demonstrations)
    actor, _ = load_artifact_of(model)
    env, teacher = RepartitionEnv(**env_kwargs), make_policy("threshold")
    agreed, moves, moves_agreed = 0, 0, 0
    total = 0
    for seed in HELD_OUT[:4]:
        observation, _ = env.reset(seed=seed)
        teacher.reset()
        done = False
        while not done:
            mask = env.action_masks()
            action = int(teacher.act(observation, mask, DecisionContext(env.encoder, env.boundaries, split=env.split)))
            mine = actor.act(observation, mask)
            total += 1
            agreed += mine == action
            if action != 0:
                moves += 1
                moves_agreed += mine == action
            observation, _, terminated, truncated, _ = env.step(action)  # the teacher's episode
            done = terminated or truncated
    assert moves >= 10, moves  # the episodes hold decisions worth copying
    assert agreed / total >= 0.90 and moves_agreed / moves >= 0.85, (agreed / total, moves_agreed / moves)


@pytest.mark.slow
def test_the_behaviour_anchor_keeps_ppo_near_what_it_imitated():
    """PPO at a large step size may drift from the cloned rule; the anchor's cloning minibatches after each
    rollout hold the actor to it. 20,000 decisions (235 moves) to judge by. Observation v6 carries the rule's
    verdict, so PPO at 1e-3 no longer drifts in 4,096 steps (measured: clone 0.92, PPO 1.00 unanchored); at 3e-2
    it drifts in some seeds (observation v10, after 4,096 steps, seeds 0 / 1 / 2 / 3 in one process: the clone
    repeats 1.00 of the teacher's moves, PPO then 1.00 / 0.87 / 1.00 / 0.00 without the anchor, 1.00 with it in
    all four; on v8, seeds 0 / 1 / 2: 0.00 / 0.60 / 0.03 without). So seeds are tried until one drifts: the anchor
    must hold in each, PPO repeating at least as many of the moves as the clone, and PPO without it must have
    drifted in one. At this step size the anchor takes 80 cloning minibatches a rollout (observation v12, seed 0:
    the clone 0.996, PPO 1.000 anchored, 0.987 with 40, 0.017 without)."""
    from sb3_contrib import MaskablePPO

    env_kwargs = {"duration_s": 1800.0, "scenarios": ["heavy", "periodic", "drift", "mixed"], "min_stages": 4,
                  "max_stages": 4}
    demonstrations = collect(env_kwargs, "threshold", 20_000)
    tried = []
    for seed in range(4):
        repeated = {}
        for anchored in (False, True):
            model = MaskablePPO("MlpPolicy", RepartitionEnv(**env_kwargs), seed=seed, learning_rate=3e-2,
                                n_steps=1024, batch_size=256, policy_kwargs={"net_arch": [64, 64]})
            cloned = clone(model.policy, demonstrations)
            model.learn(4096, callback=[BehaviourAnchor(demonstrations, 80, 3e-2)] if anchored else [])
            repeated[anchored] = CloningLoss(demonstrations).accuracy(model.policy)
        tried.append((seed, cloned, repeated))
        assert repeated[True] >= cloned, tried
        if repeated[False] <= repeated[True] - 0.1:
            break
    else:
        raise AssertionError(f"PPO at 3e-2 drifted in no seed tried: {tried}")


def untrained_learner():
    """An untrained MaskablePPO learner that moves layers about. SB3 starts the action head at gain 0.01, whose
    near-equal logits a few features can tip to the same action in every state (keep, on observation v8); a
    unit-scale head makes the untrained actor's choice depend on the state, as the tests below need."""
    from sb3_contrib import MaskablePPO

    learner = MaskablePPO("MlpPolicy", RepartitionEnv(**STRAGGLER), seed=0)
    torch.nn.init.normal_(learner.policy.action_net.weight, std=1.0, generator=torch.Generator().manual_seed(0))
    return learner


def test_dagger_labels_the_states_the_learner_reaches():
    """With a learner, the learner's decisions drive the episodes and the teacher labels what it reaches:
    the same first state, then other states than the teacher's own episodes, every label valid there."""
    learner = untrained_learner()
    own = collect(STRAGGLER, "threshold", 300)
    learners = collect(STRAGGLER, "threshold", 300, learner=learner)
    assert np.array_equal(own.observations[0], learners.observations[0])
    assert not np.array_equal(own.observations, learners.observations)
    assert all(mask[action] for mask, action in zip(learners.masks, learners.actions))


def test_the_learners_decision_from_its_actor_is_sb3s_deterministic_prediction():
    """DAgger asks the learner's actor alone; on the states it reaches (an untrained learner: every kind of
    action), the decisions are MaskablePPO.predict's, deterministic, with the same masks."""
    learner = untrained_learner()
    reached = collect(STRAGGLER, "threshold", 300, learner=learner)
    predicted = [int(learner.predict(o, action_masks=m, deterministic=True)[0])
                 for o, m in zip(reached.observations, reached.masks, strict=True)]
    from_actor = [learner_action(learner, o, m) for o, m in zip(reached.observations, reached.masks, strict=True)]
    assert from_actor == predicted
    assert len(set(from_actor)) > 2  # keep and more than one other action: the masks and logits mattered


def test_workers_label_the_same_decisions_as_one_process():
    """Episodes spread over forked workers give the decisions one process gives, in seed order, with a
    learner driving too (episodes of 1,200 s hold ~150 decisions: 700 spans several, the last cut short)."""
    from sb3_contrib import MaskablePPO

    # a learning-rate schedule, as training passes: a lambda that cannot be pickled to a worker
    learner = MaskablePPO("MlpPolicy", RepartitionEnv(**STRAGGLER), seed=0, learning_rate=lambda rest: rest * 1e-3)
    for driver in (None, learner):
        alone = collect(STRAGGLER, "threshold", 700, learner=driver)
        shared = collect(STRAGGLER, "threshold", 700, learner=driver, workers=2)
        assert len(alone) == len(shared) == 700
        for name in ("observations", "masks", "actions"):
            assert np.array_equal(getattr(alone, name), getattr(shared, name)), name


WORKERS_AFTER_CLONING = """
import torch
from sb3_contrib import MaskablePPO
from rlpipe.agents.imitation import clone, collect
from rlpipe.envs import RepartitionEnv
torch.set_num_threads(2)
straggler = {straggler!r}
learner = MaskablePPO("MlpPolicy", RepartitionEnv(**straggler), seed=0, policy_kwargs={{"net_arch": [256, 256]}})
clone(learner.policy, collect(straggler, "threshold", 3000), epochs=2)  # matrix products on 2 threads
print(len(collect(straggler, "threshold", 300, learner=learner, workers=2)), torch.get_num_threads())
"""


@pytest.mark.slow
def test_workers_label_after_a_cloning_on_several_threads():
    """DAgger's rounds fork labelling workers after a cloning has run torch's matrix products on several
    threads; a child forked with those threads up hung in its first product (training from the Python API,
    where nothing set one thread). It finishes, and the caller keeps its threads."""
    import subprocess
    import sys

    script = WORKERS_AFTER_CLONING.format(straggler=STRAGGLER)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["300", "2"]


# one pipeline where doing nothing sometimes wins (bursts that end) and sometimes moving does (a lasting straggler)
BURSTS_OR_STRAGGLER = {**STRAGGLER, "scenarios": ["bursty", "persistent"], "duration_s": 600.0}


@pytest.mark.parametrize("margin", [0.0, 0.005])  # 0.005: two of the four episodes static won go to falcon
def test_a_privileged_teacher_labels_each_episode_of_one_pipeline_with_the_rule_that_did_best_on_it(margin):
    """An episode of one pipeline is labelled along the run of the alternative where it beat the teacher's mean
    efficiency on that whole episode by more than the margin, else along the teacher's: over these seeds, each
    rule's own labels where it won, both rules winning some."""
    seeds = range(5000, 5012)
    env = RepartitionEnv(**BURSTS_OR_STRAGGLER)
    expected, winners = [], set()
    for seed in seeds:
        runs = {rule: run_episode(env, make_policy(rule), seed, None, record=True) for rule in ("static", "falcon")}
        winner = "static" if runs["static"].efficiency > runs["falcon"].efficiency + margin else "falcon"
        winners.add(winner)
        expected.append(collect(BURSTS_OR_STRAGGLER, winner, len(runs[winner].timeline["efficiency"]),
                                seed_base=seed))
    assert winners == {"static", "falcon"}
    wanted = sum(len(labels) for labels in expected)
    teacher = PrivilegedTeacher("falcon", ("static",), margin)
    labelled = collect(BURSTS_OR_STRAGGLER, teacher, wanted, seed_base=seeds[0], workers=2)
    assert np.array_equal(labelled.actions, np.concatenate([labels.actions for labels in expected]))
    assert np.array_equal(labelled.observations, np.concatenate([labels.observations for labels in expected]))


def test_a_privileged_teacher_leaves_a_replicated_job_to_the_teacher():
    """A replicated job's episodes are the teacher's, whatever another rule scored on them."""
    replicated = {**BURSTS_OR_STRAGGLER, "data_parallel": [2, 2]}
    alone = collect(replicated, "falcon", 400)
    assert (alone.actions != KEEP).any()  # the teacher moves: static's labels (all keep) would differ
    assert np.array_equal(collect(replicated, PrivilegedTeacher("falcon", ("static",)), 400).actions, alone.actions)


def test_a_clairvoyant_teacher_labels_from_the_simulators_future():
    """``hindsight`` (the oracle's timing with the learned policy's actions) needs the true future: collect
    hands it the simulator's view, and it moves on a lasting straggler, every label valid where it was taken."""
    labelled = collect(STRAGGLER, "hindsight", 300)
    assert all(mask[action] for mask, action in zip(labelled.masks, labelled.actions))
    assert (labelled.actions != KEEP).any()


def load_artifact_of(model):
    """An SB3 model's actor as rlpipe deploys it (no file: the exported actor itself)."""
    from rlpipe.agents.ppo import actor_of
    from rlpipe.observation import DEFAULT_D_MAX, DEFAULT_HISTORY, DEFAULT_S_MAX

    return actor_of(model, DEFAULT_S_MAX, DEFAULT_HISTORY, DEFAULT_D_MAX)


SHIPPED_CASES = [("persistent", 4), ("drift", 4), ("heavy", 4), ("seqlen", 4), ("mixed", 8)]


@pytest.mark.slow
@pytest.mark.parametrize("scenario, stages", SHIPPED_CASES)
def test_the_shipped_policy_beats_static_and_holds_with_threshold(scenario, stages):
    """The shipped artifact on fixed held-out seeds: at least static's efficiency (static is best where
    nothing lasts, as in seqlen) and within 0.01 of threshold's."""
    env_kwargs = {"min_stages": stages, "max_stages": stages, "duration_s": 1800.0}
    scores = {name: mean_efficiency(make_policy(name), env_kwargs, HELD_OUT[:3], scenario)
              for name in ("ppo", "static", "threshold")}
    assert scores["ppo"] >= scores["static"] - 0.002, scores
    assert scores["ppo"] >= scores["threshold"] - 0.01, scores


def test_the_random_policy_of_these_tests_takes_only_valid_actions():
    env = RepartitionEnv(**STRAGGLER)
    observation, _ = env.reset(seed=HELD_OUT[0])
    policy = RandomValidPolicy()
    for _ in range(20):
        mask = env.action_masks()
        action = policy.act(observation, mask, DecisionContext(env.encoder, env.boundaries))
        assert mask[action]
        observation, _, terminated, truncated, _ = env.step(action)
        if terminated or truncated:
            break
