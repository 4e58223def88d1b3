"""The policy slot: a pure function of a cluster snapshot to shape directives, and a registry."""
from __future__ import annotations

from typing import Callable, Protocol

from protocol.internal_api import ShapeDirective

from .snapshot import ClusterSnapshot


class Policy(Protocol):
    """An elastic-scheduling policy. `decide` must be pure: same snapshot, same directives."""

    name: str

    def decide(self, snapshot: ClusterSnapshot) -> dict[str, ShapeDirective]:
        ...


_REGISTRY: dict[str, Callable[[], Policy]] = {}


def register(name: str, factory: Callable[[], Policy]) -> None:
    """Make a policy available under `name` (RMConfig.policy / --policy)."""
    _REGISTRY[name] = factory


def known() -> list[str]:
    return sorted(_REGISTRY)


def create(name: str) -> Policy:
    """Instantiate the policy called `name`; KeyError listing the known ones otherwise."""
    try:
        factory = _REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown policy {name!r}; known policies: {', '.join(known())}") from None
    return factory()
