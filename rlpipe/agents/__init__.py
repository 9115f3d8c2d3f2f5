"""Decision-makers: the Policy protocol, heuristic policies, and (in ppo.py) the learned one."""

from __future__ import annotations

from rlpipe.agents.base import DecisionContext, Policy
from rlpipe.agents.heuristics import DynPipePolicy, GreedyPolicy, OraclePolicy, StaticPolicy
from rlpipe.errors import InputError

HEURISTICS = {"static": StaticPolicy, "greedy": GreedyPolicy, "dynpipe": DynPipePolicy, "oracle": OraclePolicy}


def make_policy(spec: str, strict: bool = True) -> Policy:
    """A policy from its name: ``static``, ``greedy``, ``dynpipe``, ``oracle``, ``ppo`` or ``ppo:PATH``.

    ``strict=False`` lets a PPO artifact that does not load fall back to dynpipe instead of raising.
    """
    name, _, path = spec.partition(":")
    if name in HEURISTICS and not path:
        return HEURISTICS[name]()
    if name == "ppo":
        from rlpipe.agents.ppo import load_deployed_policy

        return load_deployed_policy(path or None, strict=strict)
    raise InputError(f"policy '{spec}': unknown (choose from {', '.join(HEURISTICS)}, ppo, ppo:PATH)")


__all__ = ["DecisionContext", "Policy", "StaticPolicy", "GreedyPolicy", "DynPipePolicy", "OraclePolicy",
           "make_policy", "HEURISTICS"]
