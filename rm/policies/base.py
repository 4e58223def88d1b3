"""The policy slot: a pure function of a cluster snapshot to a typed Decision, and a registry."""
from __future__ import annotations

from typing import Callable, Protocol

from .decision import Decision
from .snapshot import ClusterSnapshot


class Policy(Protocol):
    """An elastic-scheduling policy. `decide` must be pure: same snapshot (sequence), same Decision."""

    name: str

    def decide(self, snapshot: ClusterSnapshot) -> Decision:
        ...


_REGISTRY: dict[str, Callable[[], Policy]] = {}


def register(name: str, factory: Callable[[], Policy]) -> None:
    """Make a policy available under `name` (RMConfig.policy / --policy)."""
    _REGISTRY[name] = factory


def describe(policy: Policy) -> dict[str, dict[str, object]]:
    """The policy's own per-app state for the RM's pages (e.g. Harmony's lifecycle state and group),
    from its optional `describe()` method; {} for a policy without one."""
    method = getattr(policy, "describe", None)
    if not callable(method):
        return {}
    out: dict[str, dict[str, object]] = method()
    return out


def known() -> list[str]:
    return sorted(_REGISTRY)


def create(name: str) -> Policy:
    """Instantiate the policy called `name`; KeyError listing the known ones otherwise."""
    try:
        factory = _REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown policy {name!r}; known policies: {', '.join(known())}") from None
    return factory()
