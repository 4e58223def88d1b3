"""Elastic scheduling policies: pure `decide(ClusterSnapshot) -> Decision` (per job a `JobDecision`).

`static` is what YARN does; `eps` EPS's H-scheduler (rm/policies/eps.py); `optimus` Optimus's
marginal-gain allocation on fitted loss and speed curves (rm/policies/optimus.py); `dorm` Dorm's
utilization-fairness optimizer (rm/policies/dorm.py); `drf` and `tetris` the baselines of Optimus
§6.1 (rm/policies/drf.py, tetris.py); `harmony` Harmony's grouping of complementary jobs
(rm/policies/harmony.py). Each registers itself here with `register(name, factory)`.
"""
from .base import Policy, create, describe, export_state, known, places_new_jobs, register, restore_state
from .decision import Decision, DecisionError, JobDecision
from .snapshot import AppView, ClusterSnapshot, NodeView, PSJobView, ps_job_view
from .dorm import DormPolicy
from .drf import DrfPolicy
from .eps import EpsPolicy
from .optimus import OptimusPolicy
from .static import StaticPolicy
from .tetris import TetrisPolicy
from .harmony import HarmonyPolicy

register("static", StaticPolicy)
register("eps", EpsPolicy)
register("optimus", OptimusPolicy)
register("dorm", DormPolicy.from_settings, takes_settings=True)
register("drf", DrfPolicy)
register("tetris", TetrisPolicy)
register("harmony", HarmonyPolicy.from_settings, takes_settings=True)

__all__ = ["AppView", "ClusterSnapshot", "Decision", "DecisionError", "DormPolicy", "DrfPolicy", "EpsPolicy",
           "HarmonyPolicy", "JobDecision", "NodeView", "OptimusPolicy", "PSJobView", "Policy", "StaticPolicy",
           "TetrisPolicy", "create", "describe", "export_state", "known", "places_new_jobs", "ps_job_view", "register",
           "restore_state"]
