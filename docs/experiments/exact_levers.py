"""How much of the oracle's lead at 4 x 2 is the encoder's model of a replicated job? (issue #19, 2026-12-08; not
part of the package, not tested.)

On one pipeline the encoder times its re-plan with the simulator's own kernel; on a replicated job it predicts
each lever with a model (each replica's pipeline as its fill plus one bottleneck per further micro-batch, the
slowest replica, then the gradient sync), cheap enough for every training step.

The variant `exact` is `falcon-early` whose encoder, on a replicated job, times the plan running and each
lever's plan with the simulator's kernel at the encoder's own estimates (each device's steady load on a 1% grid,
links at full bandwidth, equal micro-batches, no host overheads: what the planner knows) and adds one candidate,
the plan best for those estimates as the reward's reference finds it; the stalls are the planner's. Nothing here
knows the truth. It bounds what a better model of a replicated job can take, in the
processes running `exact` only.

Run from the repository root (the table of `onset_blind.py`):

    .venv/bin/python docs/experiments/exact_levers.py 4x2 "falcon-early,exact" 10 4242 heavy,drift,persistent,mixed
    .venv/bin/python docs/experiments/exact_levers.py heldout "falcon-early,exact" 132
    .venv/bin/python docs/experiments/exact_levers.py 4x2 "falcon-early,launch" 10 4242 heavy,drift,persistent,mixed

(`exact:nobest`: the encoder's own candidates only, timed exactly; `exact:reuse=R`: the last exact timing kept
while no device's estimate has moved by R in log since and the plan running is the same. `heldout NAMES N`: the
first N held-out episodes of the shipped training distribution, as `keen_resplit.py`'s, by replicas.)

Measured 2026-12-08 01:58-02:12 (the table's episodes, 10 a preset), minus `falcon-early`:

    preset      4 x 2: falcon-early  exact     4 x 4: falcon-early  exact
    none        1.0000               +0.0000   1.0000               +0.0000
    light       0.9929               +0.0008   0.9854               +0.0030
    heavy       0.9711               +0.0053   0.9388               +0.0126
    bursty      0.9776               -0.0000   0.9625               +0.0006
    drift       0.9928               +0.0028   0.9882               +0.0045
    periodic    0.9657               +0.0023   0.9494               +0.0040
    jitter      1.0000               +0.0000   1.0000               +0.0000
    persistent  0.9946               +0.0022   0.9890               +0.0035
    seqlen      0.9373               +0.0000   0.8777               +0.0002
    network     0.9958               -0.0000   0.9925               +0.0004
    mixed       0.9128               +0.0035   0.8367               +0.0137

On `seqlen` no repartition at either layout (148.9 and 274.6 rebalances an hour against 150.8 and 272.6). Held
out (132 episodes, realistic timers): `falcon-early` 0.93818, `exact` 0.94031 (72 differ, 47 up; one pipeline
+0.0000 (36 episodes), 2 replicas +0.0021 (35), 4 +0.0006 (27), 8 +0.0056 (34)). At 4 x 2 on heavy, drift,
persistent and mixed: `exact:nobest` +0.0014, +0.0020, +0.0019, -0.0016; `exact:reuse=0.02` +0.0056, +0.0015,
+0.0020, +0.0031; `exact:reuse=0.05` +0.0050, +0.0015, +0.0010, +0.0032.

Where it gains, traced (heavy at 4 x 2, 10 episodes one by one): +0.0421 on the episode of index 5 (mlp16,
GPipe, 8 micro-batches a replica), +0.0093 on index 7, -0.0048 on index 8 (cnn16, 32 micro-batches), -0.0019 on
index 0, the other six within +-0.0036. In episode 5, at 372 s replica 0 ran two stragglers (3.43x on its first
stage, estimated 2.28x an interval after the onset, and 3.59x on its last): the model's best lever, the running
partition with a split of 5 and 11 micro-batches, simulates at 32.5 ms an iteration under the truth; the
reference's search at the estimates found the launch partition with 3 and 13 (22.8 predicted, 22.9 simulated),
and the rules moved there, where `falcon-early` held a plan a third slower for minutes (again at 756 s: 25.8
against 23.3 simulated).

Its cost, one process, random actions (97% keep), 40 episodes of 10 minutes of the training distribution
(seeds 1000-1039), twice, interleaved: 3,729 and 3,453 steps/s as shipped, 2,043 and 1,747 with `exact`, 2,362
and 2,617 with `reuse=0.01` (53% of the replicated decisions reuse), 2,013 and 2,422 with `reuse=0.02` (59%).
Caching by the estimates does not help either: in 44 held-out episodes 69% of the replicated decisions met an
estimate vector (1% grid) not seen before in their episode. Profiled (20 of those episodes, `exact`): of 4.7 s,
the variant took 2.5 s: the reference's search (`SimulatedJob.best`) 1.1 s, of which 0.45 s growing the shared
graph bank (a skewed split needs graphs of more micro-batches than the job had run: paid once per shape), and
timing plans 0.8 s, about 9 a decision with repeats. A version for the package would time each distinct plan once
and run the search only where a lever could gain; not built. (Each distinct plan is now timed once a decision,
which changes no figure; with the search rerun only once an
estimate has moved by 2% or 5% since the last, `exact:search=0.02` and `=0.05` ran at 2,006 / 2,247 and 2,354 /
2,205 steps/s against 3,168 / 4,612 as shipped and 1,783 / 2,439 with `exact`, on a noisy hour: no clear saving.)

What the search adds, traced: in episode 5 at 372 s and 756 s the model's prediction for its own best lever was
right (24.5 against 24.4 timed exactly at the same estimates; 26.1 against 26.7); what it lacked is the candidate,
the launch partition with a split that starves the slow replica. The variant `launch` adds only that candidate to
the encoder's both-levers choice (the launch partition, the planner's balanced split for it at the estimates,
timed by the planner's `predict_job_ms`), nothing else exact. At 4 x 2 (the table's episodes, 02:15): heavy
+0.0051, drift +0.0010, persistent -0.0001, mixed +0.0028 (moves an hour 49.2, 13.1, 10.1, 196.7 against 45.9,
10.4, 8.7, 191.8). Held out (132 episodes, 02:17): 0.93924 against 0.93818 (50 differ, 38 up), but 2 replicas
-0.0024 (4: +0.0014, 8: +0.0055). Its cost is no less: 1,845 and 2,164 steps/s against 3,726 and 3,374 as shipped
(`exact` 2,477 and 2,278 beside them): the planner's balanced split and `predict_job_ms` simulate in Python. So
the launch candidate carries most of heavy's and mixed's gain, exact timing of the encoder's own candidates
drift's and persistent's (`exact:nobest`), and the cost of either is the simulation a step adds.

On mixed at 4 x 2 (episodes one by one, 02:56) the oracle's lead over `falcon-early` is spread over every
episode (+0.0123 to +0.0725; on the large models it re-splits 16-37 times an hour where `falcon-early` does 11-27,
and on mlp16 20-26 where `falcon-early` does 371-406), and `exact:nobest;launch` takes little of it (+0.0089 to
-0.0031, six episodes up): there the rules' gates hold the moves (`hybrid_gap.py`), not the levers' model.

What exact timing adds on drift, traced (4 x 2, `exact:nobest`, episodes one by one: +0.0082 on the episode of
index 8, cnn16 under GPipe with 32 micro-batches, +0.0066 on index 1, the other eight +0.0024 to +0.0000): there
the model's error is in the plan running. At 1,655 s, the 1.22x co-location it was fitted to having ended and a 1.6x
one on replica 1's last stage going on, the model put the plan running at 1,467.6 ms an iteration where the
kernel, at the same estimates, puts it at 1,537.4 (the truth 1,537.7), and the re-plan at 1,424.6 (1,424.5): a gain
of 3.0%, at the rules' bar, where it is 7.9%. The same at 1,040 s (the rebalance: 1,556.9 -> 1,421.1 predicted,
1,560.3 -> 1,467.3 exact) and 3,114 s. So on drift and persistent the fill-plus-bottleneck model misprices plans
fitted to other conditions; a compiled exact timing of the plan running and the one or two candidates a count
would act on is what those cells need.

The same candidate in the encoder's own compiled model costs nothing: `launch-model` appends the launch partition
to `_replicated_levers`' candidates, timed by `_lever_kernel` with its balanced split like the others (a second
call of the kernel here; a row more in the package). Measured 02:20-02:26, minus `falcon-early`:

    preset      4 x 2      4 x 4
    none        +0.0000    +0.0000
    light       +0.0000    +0.0015
    heavy       +0.0053    +0.0134
    bursty      +0.0003    -0.0003
    drift       +0.0007    +0.0008
    periodic    -0.0004    +0.0027
    jitter      +0.0000    +0.0000
    persistent  -0.0001    +0.0018
    seqlen      +0.0000    +0.0000   (no repartition; the same 150.8 and 272.6 rebalances an hour)
    network     +0.0000    -0.0000
    mixed       +0.0036    +0.0109
    mean of 11  +0.0009    +0.0028

Held out (132 episodes): 0.93909 against 0.93818 (30 differ, 19 up; 2 replicas -0.0004, 4 -0.0001, 8 +0.0041).
Its cost, the same 40 episodes three times interleaved (a fast hour): 5,602, 5,992 and 6,275 steps/s against
5,455, 5,909 and 6,731 as shipped. As a teacher it would take half of the oracle's lead on heavy at 2 replicas
((0.9764 - 0.9605) / (0.9900 - 0.9605) = 0.54 with +0.0053) and leave drift, persistent and mixed short (0.38,
0.44, 0.17). The next step for issue #19: this candidate in `_replicated_levers` (observation v13, the retrain and
the README's table), then a cheap exact timing of the levers for drift and persistent.

    .venv/bin/python docs/experiments/exact_levers.py 4x2 "falcon-early,launch-model" 10 4242
    .venv/bin/python docs/experiments/exact_levers.py heldout "falcon-early,launch-model" 132

Both together, without the reference's search: `exact:nobest;launch` puts the launch candidate in the model and then
times the encoder's candidates exactly at the estimates. Measured 02:27-02:36, minus `falcon-early`:

    preset      4 x 2      4 x 4
    none        +0.0000    +0.0000
    light       +0.0007    +0.0026
    heavy       +0.0057    +0.0128
    bursty      -0.0002    +0.0003
    drift       +0.0029    +0.0035
    periodic    +0.0002    +0.0026
    jitter      +0.0000    +0.0000
    persistent  +0.0022    +0.0033
    seqlen      +0.0000    +0.0002   (no repartition)
    network     -0.0001    +0.0008
    mixed       +0.0028    +0.0126
    mean of 11  +0.0013    +0.0035

Held out (132 episodes): 0.93998 (66 differ, 42 up; 2 replicas +0.0010, 4 -0.0009, 8 +0.0067). As `exact` does,
without its search: as a teacher it would take half of the oracle's lead at 2 replicas on heavy (0.55), drift
(0.66) and persistent (0.73), mixed 0.14. Its cost (02:52, the same 40 episodes three times interleaved, a
noisy hour): 1,906, 1,934 and 2,098 steps/s against 2,970, 4,930 and 4,949 as shipped, `exact` 1,750, 2,161 and
1,597 beside them: without the search it is as slow, so the cost here is the timing itself as this experiment does
it (a trace built, the job's row caches cleared and its Python layers passed for each decision and plan), not the
search. A package version would call the compiled `job_timing_kernel` directly for the plan running and the few
candidates: through `SimulatedJob._run` (the kernel and little else) a plan is timed in 10.3, 11.5, 14.6 and 14.8 us
at 4 x 2, 4 x 4, 7 x 8 and 8 x 8 (cnn16, 8 micro-batches a replica, heavy; 2,000 calls each), so the plan running and
3-5 candidates would add some 40-90 us to a step of about 300 as shipped: an estimate, not a measurement of training.
"""
import sys
from multiprocessing import Pool

import keen_resplit
import numpy as np
import onset_blind

import rlpipe.observation as observation_module
from rlpipe.envs.job import SimulatedJob
from rlpipe.envs.repartition import RepartitionEnv
from rlpipe.interference import InterferenceTrace
from rlpipe.observation import ObservationEncoder, Targets
from rlpipe.simulator import NO_OVERHEADS

_plain_job = onset_blind.job
_plain_levers = ObservationEncoder._levers
_plain_reset = RepartitionEnv.reset
_plain_replicated = observation_module._replicated_levers
_episode: dict = {}
# exact:nobest times the encoder's own candidates only; exact:reuse=R keeps the last exact timing while no
# device's estimate has moved by R (log) since and the plan running is the same; exact:search=R runs the reference's
# search again only once some estimate has moved by R (log) since its last search (its plan is timed afresh)
_options = {"with_best": True, "reuse": 0.0, "search_every": 0.0}
GRID = 0.01  # the estimates are rounded to 1% in log


def exact_levers(self, current, replan, figures, by_device, observation):
    """``ObservationEncoder._levers``, its replicated plans timed by the simulator at the estimates."""
    targets = _plain_levers(self, current, replan, figures, by_device, observation)
    job = _episode.get("job")
    if self.planner.replicas == 1 or job is None or _episode.get("planner") is not self.planner:
        return targets
    logs, running = np.log(by_device.reshape(-1)), (tuple(current), self.split)
    last = _episode.get("last")
    if (_options["reuse"] > 0 and last is not None and last[1] == running
            and float(np.max(np.abs(logs - last[0]))) < _options["reuse"]):
        _episode["reused"] = _episode.get("reused", 0) + 1
        return last[2]
    timed = _episode.get("timed")
    if timed is None:  # the episode's job, its trace replaced by the estimates at each decision
        timed = _episode["timed"] = SimulatedJob(job.costs, job.trace, job.replicas, job.num_stages,
                                                 job.microbatches, job.schedule, job.bandwidth_gbps, NO_OVERHEADS,
                                                 job.ideal_boundaries, np.random.default_rng(0))
        timed.patterns = job.patterns
    trace = job.trace
    estimates = np.exp(np.round(logs / GRID) * GRID)
    timed.trace = InterferenceTrace(np.zeros(1), estimates[None], np.ones_like(trace.link_factor[:1]),
                                    trace.duration_s, trace.name, None)
    for cache in (timed._timing_cache, timed._best_cache, timed._conditions_cache, timed._same_row,
                  timed._row_by_conditions):
        cache.clear()
    row = 0
    timings: dict = {}

    def ms(plan):
        key = (tuple(plan[0]), tuple(plan[1]))
        if key not in timings:
            timings[key] = timed.mean_ms(*key, row)
        return timings[key]

    split, current = self.split, tuple(current)
    searched = _episode.get("searched")  # (log estimates, plan) of the reference's last search
    if not _options["with_best"]:
        best_partition, best_split = targets.both
    elif (_options["search_every"] > 0 and searched is not None
          and float(np.max(np.abs(logs - searched[0]))) < _options["search_every"]):
        best_partition, best_split = searched[1]
    else:
        best_partition, best_split, _ = timed.best(row)
        _episode["searched"] = (logs, (best_partition, best_split))
    now_ms = ms((current, split))
    replan_plan = min([(targets.replan, split), (best_partition, split)], key=ms)
    rebalance_plan = (current, targets.rebalance)
    both_plan = min([targets.both, (best_partition, best_split), replan_plan, rebalance_plan], key=ms)
    iteration_ms = self.latest.iteration_ms if self.latest is not None else now_ms
    planner = self.planner
    exact = Targets(replan_plan[0], targets.rebalance, both_plan, np.array([
        now_ms, ms(replan_plan), ms(rebalance_plan), ms(both_plan), planner.stall_s(current, replan_plan[0]),
        planner.rebalance_stall_s(split, targets.rebalance, iteration_ms),
        planner.change_stall_s((current, split), both_plan, iteration_ms)]))
    _episode["last"] = (logs, running, exact)
    _episode["timed_count"] = _episode.get("timed_count", 0) + 1
    return exact


def launch_levers(self, current, replan, figures, by_device, observation):
    """``ObservationEncoder._levers`` with one more candidate for both levers on a replicated job: the launch
    partition with the split that fits it (the planner's own balanced split and timing, at the estimates)."""
    targets = _plain_levers(self, current, replan, figures, by_device, observation)
    planner = self.planner
    if planner.replicas == 1:
        return targets
    launch = planner.ideal_boundaries
    fitted = planner.balanced_split(launch, by_device)
    launch_ms = planner.predict_job_ms(launch, fitted, by_device)
    if launch_ms >= targets.figures[3] or (launch, fitted) == (tuple(current), self.split):
        return targets
    figures = targets.figures.copy()
    iteration_ms = self.latest.iteration_ms if self.latest is not None else figures[0]
    figures[3], figures[6] = launch_ms, planner.change_stall_s((tuple(current), self.split), (launch, fitted),
                                                               iteration_ms)
    return Targets(targets.replan, targets.rebalance, (launch, fitted), figures)


_ideal: list = [None]  # the launch partition of the job whose levers are being found


def replicated_with_launch(current, replan, by_device, slowdown, link_factor, split, compute, prefix, roundtrip,
                           by_stage, state_bytes, activation_bytes, memory_cap, inflight, prefix_param_bytes,
                           bandwidth_gbps, num_layers, microbatches, minimum):
    """``observation._replicated_levers`` with the launch partition among its candidates, timed by the same
    compiled model (``_lever_kernel``) as the others."""
    found = _plain_replicated(current, replan, by_device, slowdown, link_factor, split, compute, prefix, roundtrip,
                              by_stage, state_bytes, activation_bytes, memory_cap, inflight, prefix_param_bytes,
                              bandwidth_gbps, num_layers, microbatches, minimum)
    candidates, replica_worst = found[0], found[5]
    ideal = np.asarray(_ideal[0], dtype=np.int64)
    if candidates[0, 0] < 0 or any((row == ideal).all() for row in candidates):
        return found
    candidates = np.vstack([candidates, ideal[None]])
    replicas, num_stages = by_device.shape
    ends = np.concatenate([candidates[:, 1:], np.full((len(candidates), 1), num_layers)], axis=1)
    param_bytes = prefix_param_bytes[ends] - prefix_param_bytes[candidates]
    sync = (param_bytes * 2 * (replicas - 1) / replicas * 8e-6 / bandwidth_gbps).max(axis=1)
    with_split, balanced, with_balanced, replica_ms = observation_module._lever_kernel(
        prefix, roundtrip, candidates, sync, by_device, link_factor, split, num_layers, replicas * microbatches,
        minimum)
    return candidates, with_split, balanced, with_balanced, replica_ms, replica_worst


def launch_model_levers(self, current, replan, figures, by_device, observation):
    """``ObservationEncoder._levers`` with :func:`replicated_with_launch` in place of the compiled call."""
    _ideal[0] = self.planner.ideal_boundaries
    return _plain_levers(self, current, replan, figures, by_device, observation)


def exact_with_launch(self, current, replan, figures, by_device, observation):
    """:func:`exact_levers` over the candidates of :func:`replicated_with_launch`."""
    _ideal[0] = self.planner.ideal_boundaries
    return exact_levers(self, current, replan, figures, by_device, observation)


def variant_patches(name: str) -> list | None:
    """What the variant ``name`` replaces ((object, attribute, value) each; its options set), None for other names."""
    levers, replicated = {"launch": (launch_levers, _plain_replicated),
                          "launch-model": (launch_model_levers, replicated_with_launch),
                          "exact:nobest;launch": (exact_with_launch, replicated_with_launch)}.get(name, (None, None))
    if name == "exact" or name.startswith("exact:"):
        options = name[len("exact:"):].split(";") if ":" in name else []
        _options["with_best"] = "nobest" not in options
        _options["reuse"] = next((float(o.split("=")[1]) for o in options if o.startswith("reuse=")), 0.0)
        _options["search_every"] = next((float(o.split("=")[1]) for o in options if o.startswith("search=")), 0.0)
        levers, replicated = levers or exact_levers, replicated or _plain_replicated
    if levers is None:
        return None
    return [(ObservationEncoder, "_levers", levers), (observation_module, "_replicated_levers", replicated),
            (RepartitionEnv, "reset", remembering_reset)]


def remembering_reset(self, *args, **kwargs):
    """``RepartitionEnv.reset``, remembering the episode's job for :func:`exact_levers`."""
    _episode.clear()
    result = _plain_reset(self, *args, **kwargs)
    _episode.update(env=self, job=self.job, planner=self.planner)
    return result


def job(args):
    patches = variant_patches(args[2])
    return _plain_job(args) if patches is None else onset_blind.falcon_early_job(args, patches)


def held_out_job(task):
    """keen_resplit's held-out episode, a variant's patches in force for that episode only."""
    patches = variant_patches(task[0])
    if patches is None:
        return keen_resplit.held_out_job(task)
    with onset_blind.patched(patches):
        return keen_resplit.held_out_job(("falcon-early", *task[1:]))


def held_out(names, episodes):
    """Each name's mean over the held-out episodes of the training distribution (keen_resplit's), and the
    difference from the first by the job's replicas."""
    env_kwargs, held = keen_resplit.held_out_episodes(episodes)
    with Pool(2) as pool:
        scores = np.array(pool.map(held_out_job, [(name, episode, env_kwargs) for name in names
                                                  for episode in held])).reshape(len(names), episodes)
    env, replicas = keen_resplit.held_out_env(env_kwargs), []
    for scenario, seed in held:
        env.reset(seed=seed, options={"scenario": scenario})
        replicas.append(env.situation.replicas)
    replicas = np.array(replicas)
    for k, name in enumerate(names):
        change = scores[k] - scores[0]
        print(f"{name}: {scores[k].mean():.5f}, {int(np.sum(np.abs(change) > 1e-9))} differ, "
              f"{int(np.sum(change > 1e-9))} up; by replicas: " + ", ".join(
                  f"{d}: {change[replicas == d].mean():+.4f} ({int(np.sum(replicas == d))})"
                  for d in sorted(set(replicas.tolist()))))


if __name__ == "__main__":
    if sys.argv[1] == "heldout":
        held_out(sys.argv[2].split(","), int(sys.argv[3]))
    else:
        onset_blind.job = job
        onset_blind.main(sys.argv)
