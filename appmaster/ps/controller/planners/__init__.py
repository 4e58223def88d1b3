"""The mechanisms as planners: each turns the job's state into step instructions (base.Planner)."""
from __future__ import annotations

from ..state import ChangeKind
from .base import Planner
from .checkpoint import CheckpointPlanner
from .cruise_plan import CruisePlanPlanner
from .eps import EpsPlanner
from .finish import FinishPlanner
from .recovery import RecoveryPlanner
from .restart import RestartPlanner
from .start import StartPlanner
from .straggler import StragglerPlanner
from .suspension import MigratePlanner, PausePlanner, ResumePlanner

PLANNERS: dict[ChangeKind, Planner] = {p.kind: p for p in (
    StartPlanner(), EpsPlanner(), CheckpointPlanner(), RecoveryPlanner(), FinishPlanner(), CruisePlanPlanner(),
    StragglerPlanner(), RestartPlanner(), PausePlanner(), ResumePlanner(), MigratePlanner())}
