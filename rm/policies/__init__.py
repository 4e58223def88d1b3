"""Elastic scheduling policies: pure `decide(ClusterSnapshot) -> Decision` (per job a `JobDecision`).

`eps` is EPS's H-scheduler (rm/policies/eps.py); `dorm` Dorm's utilization-fairness optimizer
(rm/policies/dorm.py); `drf` and `tetris` the baselines of Optimus §6.1 (rm/policies/drf.py,
tetris.py). Later policies (optimus, harmony) register
themselves here with `register(name, factory)`.
"""
from .base import Policy, create, known, register
from .decision import Decision, DecisionError, JobDecision
from .snapshot import AppView, ClusterSnapshot, NodeView
from .eps import EpsPolicy
from .static import StaticPolicy
from .dorm import DormPolicy
from .drf import DrfPolicy
from .tetris import TetrisPolicy

register("static", StaticPolicy)
register("eps", EpsPolicy)
register("dorm", DormPolicy.from_settings, takes_settings=True)
register("drf", DrfPolicy)
register("tetris", TetrisPolicy)

__all__ = ["DormPolicy", "DrfPolicy", "TetrisPolicy", "EpsPolicy", "Policy", "create", "known", "register", "AppView", "ClusterSnapshot", "NodeView",
           "StaticPolicy", "Decision", "DecisionError", "JobDecision"]
