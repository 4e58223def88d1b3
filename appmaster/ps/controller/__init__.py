"""The PS-job controller: one pure state machine for a job's life and its elastic changes,
driven by the AM (appmaster.ps) and the simulator (sim/) alike (docs/internals.md, "The PS-job
controller"). Imports nothing of asyncio, sockets or the clock (tests/unit/test_controller_purity.py)."""
from __future__ import annotations

from .core import handle
from .phases import LIFECYCLE, Phase, Trigger
from .state import ChangeKind, JobState

__all__ = ["LIFECYCLE", "ChangeKind", "JobState", "Phase", "Trigger", "handle"]
