"""Elastic scheduling policies: pure `decide(ClusterSnapshot) -> {app_id: ShapeDirective}`.

Later policies (eps, optimus, dorm, harmony) register themselves here with `register(name, factory)`.
"""
from .base import Policy, create, known, register
from .snapshot import AppView, ClusterSnapshot, NodeView
from .static import StaticPolicy

register("static", StaticPolicy)

__all__ = ["Policy", "create", "known", "register", "AppView", "ClusterSnapshot", "NodeView", "StaticPolicy"]
