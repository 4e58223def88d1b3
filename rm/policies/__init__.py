"""Elastic scheduling policies: pure `decide(ClusterSnapshot) -> Decision` (per job a `JobDecision`).

`eps` is EPS's H-scheduler (rm/policies/eps.py). Later policies (optimus, dorm, harmony) register
themselves here with `register(name, factory)`.
"""
from .base import Policy, create, describe, known, register
from .decision import Decision, DecisionError, JobDecision
from .snapshot import AppView, ClusterSnapshot, NodeView
from .eps import EpsPolicy
from .static import StaticPolicy
from .harmony import HarmonyPolicy

register("static", StaticPolicy)
register("eps", EpsPolicy)
register("harmony", HarmonyPolicy)

__all__ = ["EpsPolicy", "HarmonyPolicy", "Policy", "create", "describe", "known", "register", "AppView", "ClusterSnapshot", "NodeView",
           "StaticPolicy", "Decision", "DecisionError", "JobDecision"]
