"""A teacher that is, in each training episode, the rule that did best on it (issue #19, 2026-12-03; not part of
the package, not tested).

`rare_weight.py` showed that no copy of `falcon` meets "ppo >= best rule - 0.003" in every cell: on bursty at
4 x 1 `falcon` is 0.0036 under static, on mixed at 4 x 2 0.0033 under threshold. This tries a privileged
teacher (as in "learning by cheating", Chen et al. 2019): each training episode is first run with static,
threshold and falcon (the only rules that are ever the best in the README's table), and the one with the
highest efficiency on that episode labels it (ties go to the rule that moves least). The student sees only the
observation, so it has to learn from it when holding pays; the teacher's choice uses the episode's outcome,
which no causal policy has.

The clone is made as `rlpipe train` makes it (the shipped budget: 300,000 of the teacher's decisions, 8 epochs,
`imitation_rare_weight` 5), with 2 DAgger rounds of 100,000 (the teacher labels the clone's states with the rule
that was best on the episode), and scored on the cells of the README's table that decide the bar (seed 4242,
3 episodes each), against the rules on the same episodes.

Run from the repository root: `RLPIPE_CACHE_DIR=/tmp/cache .venv/bin/python docs/experiments/episode_best_teacher.py`
[--hybrid-falcon] (about 8 minutes on 2 cores). It writes /tmp/episode_best/ (`rlpipe evaluate --policies
ppo:/tmp/episode_best ...`). With `--hybrid-falcon`, replicated episodes are labelled by `falcon` alone.

Results (2026-12-03, 10:12-10:20; clone minus the best rule, and minus `falcon`, on the README table's episodes):

| cell | clone | best rule | clone - best | clone - falcon |
|---|---|---|---|---|
| 4 x 1 bursty | 0.9886 | static 0.9912 | -0.0026 | +0.0011 |
| 2 x 1 bursty | 0.9900 | static 0.9927 | -0.0026 | -0.0003 |
| 4 x 2 mixed | 0.9073 | threshold 0.9137 | -0.0063 | -0.0030 |
| 4 x 4 mixed | 0.8244 | falcon 0.8297 | -0.0053 | -0.0053 |
| 4 x 1 heavy | 0.9828 | threshold 0.9811 | +0.0017 | +0.0017 |
| 4 x 2 heavy | 0.9616 | falcon 0.9633 | -0.0017 | -0.0017 |
| 4 x 1 light | 0.9963 | static 0.9964 | -0.0001 | +0.0000 |
| 4 x 1 seqlen | 0.9644 | static 0.9644 | +0.0000 | +0.0000 |
| 4 x 4 persistent | 0.9861 | falcon 0.9935 | -0.0074 | -0.0074 |
| 4 x 1 drift | 0.9946 | threshold 0.9946 | +0.0000 | +0.0000 |

The episode's best rule was static on 45% of the first 303,453 decisions, threshold on 35%, falcon on 20%. On one
pipeline the clone gains over its rules' copy where bursts end (bursty 4 x 1 +0.0011 over falcon) and on heavy
(+0.0017 over threshold, the best rule): there the outcome-chosen labels hold through what ends and move on
what lasts, and the student found some of that in the observation. On replicated jobs it loses up to 0.0074:
labels that switch between threshold (layers only) and falcon (micro-batches first) from episode to episode,
on states that look alike, leave a clone that does neither well.

With `--hybrid-falcon` (10:25-10:32; replicated episodes labelled by falcon alone, one pipeline by the episode's
best of static, threshold and falcon; the first 301,588 decisions: falcon 61%, threshold 23%, static 15%):

| cell | clone | best rule | clone - best | clone - falcon |
|---|---|---|---|---|
| 4 x 1 bursty | 0.9883 | static 0.9912 | -0.0030 | +0.0007 |
| 2 x 1 bursty | 0.9905 | static 0.9927 | -0.0022 | +0.0002 |
| 4 x 2 mixed | 0.9125 | threshold 0.9137 | -0.0012 | +0.0021 |
| 4 x 4 mixed | 0.8270 | falcon 0.8297 | -0.0026 | -0.0026 |
| 4 x 1 heavy | 0.9808 | threshold 0.9811 | -0.0003 | -0.0003 |
| 4 x 2 heavy | 0.9616 | falcon 0.9633 | -0.0017 | -0.0017 |
| 4 x 1 light | 0.9963 | static 0.9964 | -0.0001 | +0.0000 |
| 4 x 1 seqlen | 0.9644 | static 0.9644 | +0.0000 | +0.0000 |
| 4 x 4 persistent | 0.9932 | falcon 0.9935 | -0.0003 | -0.0003 |
| 4 x 1 drift | 0.9946 | threshold 0.9946 | +0.0000 | +0.0000 |

Every one of these ten cells is within 0.003 of its best rule (bursty 4 x 1 at the edge), the first clone of this
session to hold all three cells that decide the bar at once (bursty 4 x 1, mixed 4 x 2, mixed 4 x 4). It is a clone
without PPO, scored on 10 of the table's 55 cells, and the gains over falcon on bursty are small (+0.0002 to
+0.0007): a candidate teacher for the next retrain (`imitate:` would need it in the package, and the retrain the
full table and the live benchmark), not a result.

The `--hybrid-falcon` teacher is now the training option `imitation_best_of` (`rlpipe.agents.imitation.
PrivilegedTeacher`: `imitate: falcon` with `imitation_best_of: [static, threshold]`; ties go to falcon). The retrain
with it (2026-12-03, 10:57-11:19, `rlpipe train --config configs/ppo.yml` with those two lines; 22 min, imitation with 3
DAgger rounds 8 min) kept its imitated policy (held-out 0.9595; PPO's 0.9587-0.9590 never beat it), and on the
README table's 55 cells it fell below the bar in four, none of them among the ten scored above:

| cell | policy | best rule | policy - best |
|---|---|---|---|
| 2 x 1 drift | 0.9817 | threshold 0.9972 | -0.0155 |
| 8 x 1 mixed | 0.9216 | threshold 0.9372 | -0.0156 |
| 8 x 1 network | 0.9931 | threshold 0.9978 | -0.0047 |
| 4 x 4 mixed | 0.8247 | falcon 0.8297 | -0.0050 |

with gains where falcon moved on what ends (4 x 4 heavy +0.0033, bursty +0.0017) and bursty 4 x 1 at -0.0030.
Layout means against the envelope: 2 x 1 -0.0017, 4 x 1 -0.0002, 8 x 1 -0.0020, 4 x 2 -0.0002, 4 x 4 -0.0001.
Not shipped; configs/ppo.yml imitates falcon alone again.

Why: the rule that wins an episode of one pipeline is not only a matter of bursts. On 240 training episodes of
one pipeline (these seeds, configs/ppo.yml's options), static beat falcon on 35% of `none` episodes, 33% of
`light`, 11% of `jitter` (median win 0.036) and 20% of `seqlen`, where the scenario has nothing to move for and
falcon moved on what the timers showed: timer noise (mostly the calibrated model's, below), which looks like
the onset of a lasting imbalance. Drift and persistent episodes were never won by static. Labels of "keep" on
states that look like a lasting imbalance's onset teach the student to hold at the onset of drift and of a
congested link too, at stage counts the ten cells did not score.

Most of those wins come from the calibrated timer model (the fit of real-mode runs on 2 CPU cores): static beat
falcon on 50% of its `none` episodes and 75% of its `light` ones, against 0-33% with clean timers (on `none` by
a median 0.0002). So `imitation_best_margin` (an alternative labels an episode only where it beat falcon by more
than the margin) was tried: imitation alone (`imitation_best_of: [static]`, 300,000 decisions and 3 DAgger rounds
of 100,000, no PPO, which never beat the imitated policy above; about 6 minutes each), scored on all 55 cells
(policy minus the best rule, the cells more than 0.002 under it in one of the three):

| cell | margin 0 (the retrain) | 0.002 | 0.005 |
|---|---|---|---|
| 2 x 1 drift | **-0.0155** | +0.0000 | +0.0000 |
| 2 x 1 bursty | -0.0025 | -0.0024 | -0.0028 |
| 4 x 1 bursty | -0.0030 | **-0.0033** | **-0.0031** |
| 8 x 1 mixed | **-0.0156** | -0.0005 | -0.0011 |
| 8 x 1 network | **-0.0047** | +0.0000 | -0.0000 |
| 4 x 2 bursty | -0.0024 | -0.0021 | -0.0016 |
| 4 x 2 mixed | -0.0022 | **-0.0049** | **-0.0038** |
| 4 x 4 mixed | **-0.0050** | -0.0021 | -0.0027 |
| 2 x 1 mean - envelope | -0.0017 | -0.0002 | -0.0003 |
| 4 x 1 mean - envelope | -0.0002 | -0.0001 | -0.0002 |
| 8 x 1 mean - envelope | -0.0020 | -0.0001 | +0.0000 |
| 4 x 2 mean - envelope | -0.0002 | -0.0004 | -0.0005 |
| 4 x 4 mean - envelope | -0.0001 | -0.0001 | -0.0003 |

(bold: more than 0.003 under the best rule; every cell not listed is within 0.002 of it in all three.)

A margin removes the failures at drift, network and mixed on one pipeline, and with them the gain on bursty:
at 4 x 1 the policy is then only +0.0003 to +0.0005 over falcon, which is 0.0036 under static. Mixed at 4 x 2
is falcon's own shortfall (the teacher there is falcon): on its three episodes falcon stalls 8.6, 13.1 and 13.2
s an hour against threshold's 5.1, 8.8 and 9.1, and in the first it departs from threshold at a re-split that
also rebalances micro-batches where threshold holds (0.027 under it for the next tenth of the episode). Which
rule is right there is a question about falcon's escalation under slowdowns that hop between devices, not
about the student (a falcon whose re-split moves layers only is no answer: docs/experiments/falcon_layers_only.py).
"""

from __future__ import annotations

import multiprocessing
import sys
import time
from collections import Counter
from typing import Any

import numpy as np
import torch
from sb3_contrib import MaskablePPO

from rlpipe.agents import imitation, make_policy
from rlpipe.agents.deployed import load_deployed_policy
from rlpipe.agents.ppo import TrainConfig, _env_kwargs, export
from rlpipe.decision import DecisionContext
from rlpipe.envs.evaluation import run_episode
from rlpipe.envs.repartition import EnvConfig, RepartitionEnv
from rlpipe.seeds import DAGGER_SEED_STRIDE, DEMONSTRATION_SEED_BASE, EPISODE_SEED_STRIDE

RULES = ["static", "threshold", "falcon"]  # in order of preference on a tie: the one that moves least
CELLS = [(4, 1, "bursty"), (2, 1, "bursty"), (4, 2, "mixed"), (4, 4, "mixed"), (4, 1, "heavy"), (4, 2, "heavy"),
         (4, 1, "light"), (4, 1, "seqlen"), (4, 4, "persistent"), (4, 1, "drift")]  # (stages, replicas, preset)
ALL_RULES = ["static", "greedy", "dynpipe", "threshold", "falcon"]
HYBRID_FALCON = "--hybrid-falcon" in sys.argv  # replicated episodes labelled by falcon alone

_job: tuple[dict[str, Any], Any] | None = None  # a worker's environment options and learner


def _hold(job: tuple[dict[str, Any], Any]) -> None:
    global _job
    _job = job


def _drive(env: RepartitionEnv, seed: int, driver: Any, teacher: str | None) -> tuple[float, list, list, list]:
    """One episode: ``driver`` (a rule's name or an SB3 learner) decides; ``teacher`` (a rule) labels each state
    (None: the driver's own decisions). Returns (efficiency, observations, masks, labels)."""
    rule = make_policy(driver) if isinstance(driver, str) else None
    labeller = make_policy(teacher) if teacher else rule
    observation, _ = env.reset(seed=seed)
    for policy in {id(p): p for p in (rule, labeller) if p is not None}.values():
        policy.reset()
    observations, masks, labels, efficiencies = [], [], [], []
    done = False
    while not done:
        mask = env.action_masks()
        context = DecisionContext(env.encoder, env.boundaries, env.future(), env.split)
        label = int(labeller.act(observation, mask, context))
        action = label if labeller is rule else (int(rule.act(observation, mask, context)) if rule is not None
                                                 else imitation.learner_action(driver, observation, mask))
        observations.append(observation)
        masks.append(mask)
        labels.append(label)
        observation, _, terminated, truncated, info = env.step(action)
        efficiencies.append(info["efficiency"])
        done = terminated or truncated
    return float(np.mean(efficiencies)), observations, masks, labels


def label_episode(seed: int) -> tuple[str, imitation.Demonstrations]:
    """The episode's best rule and its labels: along its own run, or (a learner given) along the learner's."""
    assert _job is not None
    env_kwargs, learner = _job
    env = RepartitionEnv(**env_kwargs)
    env.reset(seed=seed)
    rules = ["falcon"] if HYBRID_FALCON and env.situation.replicas > 1 else RULES
    runs = {rule: _drive(env, seed, rule, None) for rule in rules}
    best = rules[0]
    for rule in rules[1:]:
        if runs[rule][0] > runs[best][0] + 1e-6:
            best = rule
    _, observations, masks, labels = runs[best] if learner is None else _drive(env, seed, learner, best)
    return best, imitation.Demonstrations(np.array(observations, dtype=np.float32), np.array(masks),
                                          np.array(labels))


def collect(env_kwargs: dict[str, Any], steps: int, seed_base: int, learner: Any = None) -> imitation.Demonstrations:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # fork from one thread (see imitation._episodes)
    parts, total, chosen = [], 0, Counter()
    with multiprocessing.get_context("fork").Pool(2, initializer=_hold, initargs=((env_kwargs, learner),)) as pool:
        for best, part in pool.imap(label_episode, range(seed_base, seed_base + 10**6), chunksize=4):
            parts.append(part)
            chosen[best] += len(part)
            total += len(part)
            if total >= steps:
                break
        pool.terminate()
    torch.set_num_threads(threads)
    print(f"  {total:,} decisions labelled by the episode's best rule: " +
          ", ".join(f"{rule} {count / total:.1%}" for rule, count in chosen.most_common()), flush=True)
    merged = imitation.merge(*parts)
    return imitation.Demonstrations(merged.observations[:steps], merged.masks[:steps], merged.actions[:steps])


def score(path: str) -> None:
    for stages, replicas, scenario in CELLS:
        config = EnvConfig(min_stages=stages, max_stages=stages, s_max=8, data_parallel=(replicas, replicas), d_max=8)
        seeds = [4242 * EPISODE_SEED_STRIDE + episode for episode in range(3)]
        means = {name: float(np.mean([run_episode(RepartitionEnv(config), make_policy(name), seed, scenario).efficiency
                                      for seed in seeds])) for name in ALL_RULES}
        mine = float(np.mean([run_episode(RepartitionEnv(config), load_deployed_policy(path), seed, scenario).efficiency
                              for seed in seeds]))
        best = max(ALL_RULES, key=lambda name: means[name])
        print(f"  {stages} x {replicas} {scenario}: clone {mine:.4f}, best rule {best} {means[best]:.4f} "
              f"({mine - means[best]:+.4f}), falcon {means['falcon']:.4f} ({mine - means['falcon']:+.4f})", flush=True)


def main() -> None:
    config = TrainConfig.from_yaml("configs/ppo.yml")
    env_kwargs = _env_kwargs(config)
    start = time.time()
    data = collect(env_kwargs, config.imitation_steps, DEMONSTRATION_SEED_BASE)
    model = MaskablePPO("MlpPolicy", RepartitionEnv(**env_kwargs), seed=config.seed,
                        policy_kwargs=dict(config.policy_kwargs))
    imitation.clone(model.policy, data, epochs=config.imitation_epochs, seed=config.seed)
    print(f"cloned ({time.time() - start:.0f} s)", flush=True)
    for round_ in (1, 2):
        own = collect(env_kwargs, config.imitation_round_steps, DEMONSTRATION_SEED_BASE + DAGGER_SEED_STRIDE * round_,
                      learner=model)
        data = imitation.merge(data, own)
        imitation.clone(model.policy, data, epochs=config.imitation_epochs // 2, seed=config.seed + round_)
        print(f"DAgger round {round_} ({time.time() - start:.0f} s)", flush=True)
    path = "/tmp/episode_best" + ("_hybrid_falcon" if HYBRID_FALCON else "")
    export(model, 8, 4, 8, path, training={"imitated": "the episode's best rule"})
    score(path)
    print(f"done ({time.time() - start:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
