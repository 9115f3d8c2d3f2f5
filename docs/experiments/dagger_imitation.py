"""DAgger experiment (issue #19, 2026-11-30; not part of the package, not tested): does aggregating
falcon's labels on the clone's own states close the clone's gap to falcon on replicated jobs?

Run from the repository root: `.venv/bin/python docs/experiments/dagger_imitation.py` (about 18 minutes
on 2 cores). It writes /tmp/dagger{0,1,2,3} (deployable artifacts: `rlpipe evaluate --policies
falcon,ppo:/tmp/dagger3 --data-parallel 2 --stages 4 ...`). Results (4 x 2, 3 held-out episodes per preset,
seed 4242): rounds 2-3 reach falcon on periodic, drift, bursty and heavy, not on mixed (-0.009); at 4 x 4
persistent and mixed stay 0.012 and 0.009 below. See the closing note of #19.

Since then (observation v4, which carries FALCON's own counts): DAgger is part of `rlpipe train`
(`imitation_rounds` in configs/ppo.yml), and the rules' counts follow the job that runs, so that a label
on the learner's state is what the rule would do there. This script records the v3 experiment; with
v4 its artifacts would need the v3 encoder (git 3cabc18).
"""
import time

import numpy as np
import torch
from sb3_contrib import MaskablePPO
from rlpipe.agents.ppo import TrainConfig, _env_kwargs, export
from rlpipe.agents import imitation, make_policy
from rlpipe.decision import DecisionContext
from rlpipe.envs import RepartitionEnv
from rlpipe.seeds import DEMONSTRATION_SEED_BASE

cfg = TrainConfig.from_yaml("configs/ppo.yml")
kw = _env_kwargs(cfg)

def collect_on_learner(model, steps, seed_base):
    env, teacher = RepartitionEnv(**kw), make_policy("falcon")
    obs_l, masks, acts = [], [], []
    ep = 0
    while len(acts) < steps:
        obs, _ = env.reset(seed=seed_base + ep); teacher.reset(); ep += 1; done = False
        while not done and len(acts) < steps:
            mask = env.action_masks()
            ctx = DecisionContext(env.encoder, env.boundaries, split=env.split)
            label = int(teacher.act(obs, mask, ctx))
            with torch.no_grad():
                mine, _ = model.predict(obs, action_masks=mask, deterministic=True)
            obs_l.append(obs); masks.append(mask); acts.append(label)
            obs, _, t, tr, _ = env.step(int(mine)); done = t or tr
    return imitation.Demonstrations(np.array(obs_l, dtype=np.float32), np.array(masks), np.array(acts))

def merge(a, b):
    return imitation.Demonstrations(np.concatenate([a.observations, b.observations]),
                                    np.concatenate([a.masks, b.masks]), np.concatenate([a.actions, b.actions]))

t = time.time()
data = imitation.collect(kw, "falcon", 300_000)
print("teacher data", len(data), f"{time.time()-t:.0f}s", flush=True)
model = MaskablePPO("MlpPolicy", RepartitionEnv(**kw), seed=1, policy_kwargs={"net_arch": [256, 256]})
acc = imitation.clone(model.policy, data, epochs=8, seed=1)
print("round 0 acc", acc, f"{time.time()-t:.0f}s", flush=True)
export(model, 8, 4, 8, "/tmp/dagger0", training={"note": "dagger round 0"})
for k in range(1, 4):
    extra = collect_on_learner(model, 100_000, DEMONSTRATION_SEED_BASE + 50_000 * k)
    data = merge(data, extra)
    acc = imitation.clone(model.policy, data, epochs=4, seed=k)
    print(f"round {k} data {len(data)} acc {acc:.3f} {time.time()-t:.0f}s", flush=True)
    export(model, 8, 4, 8, f"/tmp/dagger{k}", training={"note": f"dagger round {k}"})
