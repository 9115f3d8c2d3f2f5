"""ShardedVecEnv: training environments stepped in a few processes, several environments to each.

SB3's SubprocVecEnv gives every environment its own process. With 16 environments on a 2-core machine
those 16 processes spend their time passing messages and waiting for a core: measured, no faster than
stepping all 16 in turn in one process. Here each process holds a shard of the environments in an SB3
``DummyVecEnv`` and steps them in turn, so a step costs one message each way per process, not per
environment, and the shards step at the same time, one to a core. The environments, their seeds and their
order are those of ``DummyVecEnv(env_fns)``: the same observations, rewards (float32) and episode ends.
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


def _serve_shard(remote: Any, parent_remote: Any, env_fns: CloudpickleWrapper) -> None:
    """A worker process: build its shard of environments, then answer the parent's commands until "close"."""
    parent_remote.close()
    envs = DummyVecEnv(env_fns.var)
    while True:
        try:
            command, data = remote.recv()
        except (EOFError, KeyboardInterrupt):  # the parent is gone
            break
        if command == "step":
            envs.step_async(data)
            remote.send((*envs.step_wait(), envs.reset_infos))
        elif command == "reset":
            # DummyVecEnv takes its seeds and options for the next reset from these (SB3 2.x); the parent's
            # VecEnv.seed() and set_options() set them for every environment, so each shard gets its own slice
            envs._seeds, envs._options = data
            remote.send((envs.reset(), envs.reset_infos))
        elif command == "get_spaces":
            remote.send((envs.observation_space, envs.action_space))
        elif command == "env_method":
            name, args, kwargs, indices = data
            remote.send(envs.env_method(name, *args, indices=indices, **kwargs))
        elif command == "get_attr":
            remote.send(envs.get_attr(*data))
        elif command == "has_attr":
            remote.send(envs.has_attr(data))  # asked here, where the attribute need not pickle
        elif command == "set_attr":
            envs.set_attr(*data)
            remote.send([None] * len(data[2]))
        elif command == "is_wrapped":
            remote.send(envs.env_is_wrapped(*data))
        elif command == "close":
            envs.close()
            remote.close()
            break
        else:
            raise NotImplementedError(f"ShardedVecEnv worker: unknown command {command!r}")


class ShardedVecEnv(VecEnv):
    """``len(env_fns)`` environments in ``workers`` processes (contiguous shards, as even as they divide).

    Args:
        env_fns: makers of the environments, in order.
        workers: processes; at most one per environment.
        start_method: multiprocessing start method ("fork": the workers start with everything imported).
    """

    def __init__(self, env_fns: list[Callable[[], gym.Env]], workers: int, start_method: str = "fork"):
        if workers < 1:
            raise ValueError(f"ShardedVecEnv: workers must be >= 1, got {workers}")
        workers = min(workers, len(env_fns))
        edges = np.linspace(0, len(env_fns), workers + 1).round().astype(int)
        self.shards = [range(int(a), int(b)) for a, b in zip(edges[:-1], edges[1:])]
        self.shard_of = [w for w, shard in enumerate(self.shards) for _ in shard]
        ctx = mp.get_context(start_method)
        self.remotes: list[Any] = []  # the parent's ends of the pipes, a worker each
        self.processes: list[Any] = []
        for shard in self.shards:
            remote, work_remote = ctx.Pipe()
            # daemon: a crashed parent leaves no workers behind
            process = ctx.Process(target=_serve_shard, daemon=True,  # type: ignore[attr-defined]
                                  args=(work_remote, remote, CloudpickleWrapper([env_fns[i] for i in shard])))
            process.start()
            work_remote.close()
            self.remotes.append(remote)
            self.processes.append(process)
        self.waiting, self.closed = False, False
        self.remotes[0].send(("get_spaces", None))
        observation_space, action_space = self.remotes[0].recv()
        super().__init__(len(env_fns), observation_space, action_space)

    def step_async(self, actions: np.ndarray) -> None:
        for remote, shard in zip(self.remotes, self.shards):
            remote.send(("step", actions[shard.start:shard.stop]))
        self.waiting = True

    def step_wait(self) -> VecEnvStepReturn:
        results = [remote.recv() for remote in self.remotes]
        self.waiting = False
        self.reset_infos = [info for result in results for info in result[4]]
        return (np.concatenate([r[0] for r in results]), np.concatenate([r[1] for r in results]),
                np.concatenate([r[2] for r in results]), [info for r in results for info in r[3]])

    def reset(self) -> VecEnvObs:
        for remote, shard in zip(self.remotes, self.shards):
            remote.send(("reset", ([self._seeds[i] for i in shard], [self._options[i] for i in shard])))
        results = [remote.recv() for remote in self.remotes]
        self.reset_infos = [info for result in results for info in result[1]]
        self._reset_seeds()  # seeds and options serve one reset only, as in SB3's own VecEnvs
        self._reset_options()
        return np.concatenate([observations for observations, _ in results])

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
        self._ask("set_attr", lambda local: (attr_name, value, local), indices)

    def env_method(self, method_name: str, *method_args: Any, indices: VecEnvIndices = None,
                   **method_kwargs: Any) -> list[Any]:
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
