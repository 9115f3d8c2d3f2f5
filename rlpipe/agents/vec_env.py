"""ShardedVecEnv: training environments stepped in a few processes, several environments to each.

SB3's SubprocVecEnv gives every environment its own process. With 16 environments on a 2-core machine
those 16 processes spend their time passing messages and waiting for a core: measured, no faster than
stepping all 16 in turn in one process. Here each process holds a shard of the environments in an SB3
``DummyVecEnv`` and steps them in turn, so a step costs one message each way per process, not per
environment, and the shards step at the same time, one to a core. With ``step_here`` the first shard steps in
this process, which would otherwise only wait (``vec_env: split``). A step's answer carries the action masks
MaskablePPO asks for before the next step, as one array, and the environments' reset infos only where one of them
reset (pickling 8 masks and 8 unchanged reset infos every step cost the worker about as much as the rest of its
message). A process that waits (a worker for its next actions, this process for the workers' answers) works ahead
for its own environments meanwhile: it takes each one's next step as if the policy keeps the plan, as it does on
most steps (``RepartitionEnv.speculate``: the step is used where the action is keep, taken back otherwise), then
works out the reward's reference further ahead (``RepartitionEnv.prefetch``). A worker so takes most of its steps
while this process runs the policy, so the shard here holds one environment fewer than an even share. The
environments, their seeds and their order are those of ``DummyVecEnv(env_fns)``: the same observations, rewards
(float32), masks and episode ends.
"""

from __future__ import annotations

import multiprocessing as mp
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from stable_baselines3.common.vec_env import DummyVecEnv, VecEnv
from stable_baselines3.common.vec_env.base_vec_env import CloudpickleWrapper, VecEnvIndices, VecEnvObs, VecEnvStepReturn

__all__ = ["ShardedVecEnv"]

MASKS_METHOD = "action_masks"  # what sb3-contrib's MaskablePPO calls on every environment before each step


def _answer(envs: DummyVecEnv, command: str, data: Any) -> Any:
    """A shard's answer to one of the parent's commands (in a worker process, or in the parent for the shard
    it steps itself). A step's and a reset's answers carry the action masks after them (MaskablePPO asks for
    them before every step: one message fewer each way); a step's, the reset infos only where an environment
    reset (None: unchanged)."""
    if command == "step":
        envs.step_async(data)
        observations, rewards, dones, infos = envs.step_wait()
        return observations, rewards, dones, infos, envs.reset_infos if dones.any() else None, _masks(envs)
    _settle(envs)
    if command == "reset":
        # DummyVecEnv takes its seeds and options for the next reset from these (SB3 2.x); the parent's
        # VecEnv.seed() and set_options() set them for every environment, so each shard gets its own slice
        envs._seeds, envs._options = data
        return envs.reset(), envs.reset_infos, _masks(envs)
    if command == "get_spaces":
        return envs.observation_space, envs.action_space
    if command == "env_method":
        name, args, kwargs, indices = data
        return envs.env_method(name, *args, indices=indices, **kwargs)
    if command == "get_attr":
        return envs.get_attr(*data)
    if command == "has_attr":
        return envs.has_attr(data)  # asked here, where the attribute need not pickle
    if command == "set_attr":
        envs.set_attr(*data)
        return [None] * len(data[2])
    if command == "is_wrapped":
        return envs.env_is_wrapped(*data)
    raise NotImplementedError(f"ShardedVecEnv: unknown command {command!r}")


def _masks(envs: DummyVecEnv) -> np.ndarray | None:
    """The shard's environments' action masks now, a row each (None: environments without them)."""
    try:
        return np.stack(envs.env_method(MASKS_METHOD))
    except AttributeError:
        return None


def _work_ahead(envs: DummyVecEnv) -> bool:
    """Do one piece of the work the shard's environments' next steps will ask for, while this process would
    only wait: whether there was any. First each environment's next step as if the policy keeps the plan
    (``RepartitionEnv.speculate``: what most steps do, taken back where they do not), then the reward's
    reference under the rows of conditions further ahead (``RepartitionEnv.prefetch``: the same results,
    cached earlier)."""
    for method in ("speculate", "prefetch"):
        for env in envs.envs:
            work = getattr(env.unwrapped, method, None)
            if work is not None and work():
                return True
    return False


def _settle(envs: DummyVecEnv) -> None:
    """Take back the steps taken ahead (``RepartitionEnv.cancel_speculation``): any command but a step reads
    or changes the environments as they are."""
    for env in envs.envs:
        cancel = getattr(env.unwrapped, "cancel_speculation", None)
        if cancel is not None:
            cancel()


def _await(remote: Any, idle_envs: DummyVecEnv) -> None:
    """Return once ``remote`` has a message to read, working ahead for ``idle_envs`` meanwhile."""
    while not remote.poll() and _work_ahead(idle_envs):
        pass


def _serve_shard(remote: Any, parent_remote: Any, env_fns: CloudpickleWrapper) -> None:
    """A worker process: build its shard of environments, then answer the parent's commands until "close"
    (between them, while the parent chooses the next actions, working ahead for the next step)."""
    parent_remote.close()
    envs = DummyVecEnv(env_fns.var)
    while True:
        try:
            _await(remote, envs)
            command, data = remote.recv()
        except (EOFError, KeyboardInterrupt):  # the parent is gone
            break
        if command == "close":
            envs.close()
            remote.close()
            break
        remote.send(_answer(envs, command, data))


class _ShardHere:
    """The shard the parent steps itself, behind a worker's pipe's ``send`` / ``recv``: a command sent is
    carried out when its answer is asked for, so a step runs while the workers step their shards."""

    def __init__(self, env_fns: list[Callable[[], gym.Env]]):
        self.envs = DummyVecEnv(env_fns)
        self.pending: list[tuple[str, Any]] = []

    def send(self, message: tuple[str, Any]) -> None:
        if message[0] == "close":
            self.envs.close()
        else:
            self.pending.append(message)

    def recv(self) -> Any:
        return _answer(self.envs, *self.pending.pop(0))

    def close(self) -> None:
        pass


class ShardedVecEnv(VecEnv):
    """``len(env_fns)`` environments in ``workers`` processes (contiguous shards, as even as they divide).

    Args:
        env_fns: makers of the environments, in order.
        workers: shards; at most one per environment.
        start_method: multiprocessing start method ("fork": the workers start with everything imported).
        step_here: the first shard steps in this process, while the others step in ``workers - 1`` other
            processes, instead of every shard in a process of its own (this process waits for the environments
            anyway: on 2 cores, one shard here and one in another process use both).
        here: with ``step_here``, the environments stepped in this process (None: one fewer than an even share;
            the other shards as even as they divide).
    """

    def __init__(self, env_fns: list[Callable[[], gym.Env]], workers: int, start_method: str = "fork",
                 step_here: bool = False, here: int | None = None):
        if workers < 1:
            raise ValueError(f"ShardedVecEnv: workers must be >= 1, got {workers}")
        workers = min(workers, len(env_fns))
        edges = np.linspace(0, len(env_fns), workers + 1).round().astype(int)
        if step_here and workers > 1:
            # this process also runs the policy and records each step, while the workers take their next steps
            # ahead (speculate): one environment fewer than an even share, unless told
            here = max(int(edges[1]) - 1, 1) if here is None else here
            if not 1 <= here <= len(env_fns) - workers + 1:
                raise ValueError(f"ShardedVecEnv: here must be 1 to {len(env_fns) - workers + 1}, got {here}")
            edges = np.concatenate([[0], np.linspace(here, len(env_fns), workers).round().astype(int)])
        self.shards = [range(int(a), int(b)) for a, b in zip(edges[:-1], edges[1:])]
        self.shard_of = [w for w, shard in enumerate(self.shards) for _ in shard]
        ctx = mp.get_context(start_method)
        # the parent's ends of the pipes, a worker each (the shard stepped here behind the same calls)
        self.remotes: list[Any] = [_ShardHere([env_fns[i] for i in self.shards[0]])] if step_here else []
        self.processes: list[Any] = []
        for shard in self.shards[len(self.remotes):]:
            remote, work_remote = ctx.Pipe()
            # daemon: a crashed parent leaves no workers behind
            process = ctx.Process(target=_serve_shard, daemon=True,  # type: ignore[attr-defined]
                                  args=(work_remote, remote, CloudpickleWrapper([env_fns[i] for i in shard])))
            process.start()
            work_remote.close()
            self.remotes.append(remote)
            self.processes.append(process)
        self.waiting, self.closed = False, False
        self._masks: np.ndarray | None = None  # every environment's, a row each, as of the last step or reset
        self._reset_infos: list[list[dict[str, Any]]] = [[{} for _ in shard] for shard in self.shards]
        self.remotes[0].send(("get_spaces", None))
        observation_space, action_space = self.remotes[0].recv()
        super().__init__(len(env_fns), observation_space, action_space)

    def step_async(self, actions: np.ndarray) -> None:
        self._masks = None
        for remote, shard in zip(self.remotes, self.shards):
            remote.send(("step", actions[shard.start:shard.stop]))
        self.waiting = True

    def step_wait(self) -> VecEnvStepReturn:
        first = self.remotes[0]
        results = [first.recv()]  # the shard here steps first (if any), the others meanwhile
        for remote in self.remotes[1:]:
            if isinstance(first, _ShardHere):  # its environments' next step, worked ahead while waiting
                _await(remote, first.envs)
            results.append(remote.recv())
        self.waiting = False
        self._keep_reset_infos([result[4] for result in results])
        self._keep_masks([result[5] for result in results])
        return (np.concatenate([r[0] for r in results]), np.concatenate([r[1] for r in results]),
                np.concatenate([r[2] for r in results]), [info for r in results for info in r[3]])

    def reset(self) -> VecEnvObs:
        self._masks = None
        for remote, shard in zip(self.remotes, self.shards):
            remote.send(("reset", ([self._seeds[i] for i in shard], [self._options[i] for i in shard])))
        results = [remote.recv() for remote in self.remotes]
        self._keep_reset_infos([result[1] for result in results])
        self._keep_masks([result[2] for result in results])
        self._reset_seeds()  # seeds and options serve one reset only, as in SB3's own VecEnvs
        self._reset_options()
        return np.concatenate([observations for observations, _, _ in results])

    def _keep_reset_infos(self, by_shard: list[list[dict[str, Any]] | None]) -> None:
        """The environments' infos from their last reset (``reset_infos``, as SB3's VecEnvs keep them): each
        shard's as it sent them, or as before where it sent None (none of its environments reset)."""
        for shard, infos in enumerate(by_shard):
            if infos is not None:
                self._reset_infos[shard] = infos
        self.reset_infos = [info for infos in self._reset_infos for info in infos]

    def _keep_masks(self, by_shard: list[np.ndarray | None]) -> None:
        """The environments' action masks as of now, sent with a step's or reset's results."""
        self._masks = None if any(masks is None for masks in by_shard) else np.concatenate(by_shard)  # type: ignore[arg-type]

    def close(self) -> None:
        if self.closed:
            return
        if self.waiting:
            for remote in self.remotes:
                remote.recv()
        for remote in self.remotes:
            remote.send(("close", None))
        for process in self.processes:
            process.join()
        for remote in self.remotes:
            remote.close()
        self.closed = True

    def get_images(self) -> Sequence[np.ndarray | None]:
        return [None] * self.num_envs  # the environments do not render

    def has_attr(self, attr_name: str) -> bool:
        # asked of the workers: the base class would fetch the attribute, and a bound method does not pickle
        for remote in self.remotes:
            remote.send(("has_attr", attr_name))
        return all([remote.recv() for remote in self.remotes])

    def get_attr(self, attr_name: str, indices: VecEnvIndices = None) -> list[Any]:
        return self._ask("get_attr", lambda local: (attr_name, local), indices)

    def set_attr(self, attr_name: str, value: Any, indices: VecEnvIndices = None) -> None:
        self._masks = None
        self._ask("set_attr", lambda local: (attr_name, value, local), indices)

    def env_method(self, method_name: str, *method_args: Any, indices: VecEnvIndices = None,
                   **method_kwargs: Any) -> list[Any]:
        if method_name == MASKS_METHOD and self._masks is not None and not method_args and not method_kwargs:
            return [self._masks[i].copy() for i in self._get_indices(indices)]  # as of the last step or reset
        self._masks = None  # any other call may change an environment
        return self._ask("env_method", lambda local: (method_name, method_args, method_kwargs, local), indices)

    def env_is_wrapped(self, wrapper_class: type[gym.Wrapper], indices: VecEnvIndices = None) -> list[bool]:
        return self._ask("is_wrapped", lambda local: (wrapper_class, local), indices)

    def _ask(self, command: str, payload: Callable[[list[int]], tuple], indices: VecEnvIndices) -> list[Any]:
        """Send ``command`` to the workers holding ``indices`` (each with its own environments' local
        indices) and return the answers in the order of ``indices``."""
        wanted = list(self._get_indices(indices))
        local: dict[int, list[int]] = {}
        for i in wanted:
            local.setdefault(self.shard_of[i], []).append(i - self.shards[self.shard_of[i]].start)
        for worker, own in local.items():
            self.remotes[worker].send((command, payload(own)))
        answers = {worker: iter(self.remotes[worker].recv()) for worker in local}
        return [next(answers[self.shard_of[i]]) for i in wanted]
