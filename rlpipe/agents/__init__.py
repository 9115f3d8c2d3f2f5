"""Decision-makers: heuristic policies, the learned one (deployed.py; trained in ppo.py), and
:func:`make_policy`, which builds any of them from its name."""

from __future__ import annotations

from rlpipe.agents.heuristics import (
    DynPipePolicy,
    EarlyFalconPolicy,
    FalconPolicy,
    GreedyPolicy,
    HindsightPolicy,
    OnsetBlindOraclePolicy,
    OraclePolicy,
    StaticPolicy,
    ThresholdPolicy,
)
from rlpipe.decision import DecisionContext, Policy
from rlpipe.errors import InputError

HEURISTICS = {"static": StaticPolicy, "greedy": GreedyPolicy, "dynpipe": DynPipePolicy, "threshold": ThresholdPolicy,
              "falcon": FalconPolicy, "falcon-early": EarlyFalconPolicy, "oracle": OraclePolicy,
              "hindsight": HindsightPolicy, "onset-blind": OnsetBlindOraclePolicy}


# what decides when the learned policy cannot
FALLBACKS = ("static", "greedy", "dynpipe", "threshold", "falcon", "falcon-early")


def make_policy(spec: str, live: bool = False, fallback: str = "dynpipe") -> Policy:
    """A policy from its name: ``static``, ``greedy``, ``dynpipe``, ``threshold``, ``falcon``, ``falcon-early``,
    ``oracle``, ``hindsight``, ``onset-blind``, ``ppo`` or ``ppo:PATH``.

    Args:
        spec: the name, as ``--policy`` takes it.
        live: the policy will drive a live pipeline: a simulation-only policy is refused.
        fallback: the heuristic (one of :data:`FALLBACKS`) that decides for ``ppo`` when its actor
            cannot (more stages than it knows, unusable statistics).
    """
    if fallback not in FALLBACKS:
        raise InputError(f"fallback '{fallback}': choose from {', '.join(FALLBACKS)}")
    name, _, path = spec.partition(":")
    policy: Policy
    if name in HEURISTICS and not path:
        policy = HEURISTICS[name]()
    elif name == "ppo":
        from rlpipe.agents.deployed import load_deployed_policy

        # a named artifact must load: InputError if not
        policy = load_deployed_policy(path or None, fallback=HEURISTICS[fallback]())
    else:
        raise InputError(f"policy '{spec}': unknown (choose from {', '.join(HEURISTICS)}, ppo, ppo:PATH)")
    if live and not policy.live:
        raise InputError(f"--policy {spec}: the {name} needs the simulator's future and runs in simulation only")
    return policy


__all__ = ["DecisionContext", "Policy", "StaticPolicy", "GreedyPolicy", "DynPipePolicy", "ThresholdPolicy",
           "FalconPolicy", "EarlyFalconPolicy", "OraclePolicy", "HindsightPolicy",
           "OnsetBlindOraclePolicy", "make_policy", "HEURISTICS",
           "FALLBACKS"]
