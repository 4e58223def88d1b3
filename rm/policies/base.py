"""The policy slot: a pure function of a cluster snapshot to a typed Decision, and a registry."""
from __future__ import annotations

from typing import Callable, Optional, Protocol

from protocol.config import RMConfig

from .decision import Decision
from .snapshot import ClusterSnapshot


class Policy(Protocol):
    """An elastic-scheduling policy. `decide` must be pure: same snapshot (sequence), same Decision."""

    name: str

    def decide(self, snapshot: ClusterSnapshot) -> Decision:
        ...


# name -> (factory, whether the factory takes the RM's settings)
_REGISTRY: dict[str, tuple[Callable[..., Policy], bool]] = {}


def register(name: str, factory: Callable[..., Policy], *, takes_settings: bool = False) -> None:
    """Make a policy available under `name` (RMConfig.policy / --policy). With `takes_settings` the
    factory is called with the RM's settings (protocol.config.RMConfig: thresholds such as Dorm's
    θ1 / θ2 live there), otherwise with no arguments."""
    _REGISTRY[name] = (factory, takes_settings)


def describe(policy: Policy) -> dict[str, dict[str, object]]:
    """The policy's own per-app state for the RM's pages (e.g. Harmony's lifecycle state and group),
    from its optional `describe()` method; {} for a policy without one."""
    method = getattr(policy, "describe", None)
    if not callable(method):
        return {}
    out: dict[str, dict[str, object]] = method()
    return out


def export_state(policy: Policy) -> Optional[bytes]:
    """The policy's state between rounds as a JSON document (its optional `export_state()`), for
    the RM to store so a new active RM goes on from it after a restart or failover (rm/server.py);
    None for a stateless policy or one that keeps nothing yet. What a policy can rebuild from the
    snapshots (the AMs' job reports, the directives the RM stores itself) it need not export."""
    method = getattr(policy, "export_state", None)
    if not callable(method):
        return None
    doc: Optional[bytes] = method()
    return doc


def restore_state(policy: Policy, doc: bytes) -> bool:
    """Give a freshly created policy the state an earlier RM exported (its optional
    `restore_state(doc)`, which decodes and checks it, raising ValueError when it cannot); False
    for a policy that keeps none."""
    method = getattr(policy, "restore_state", None)
    if not callable(method):
        return False
    method(doc)
    return True


def places_new_jobs(policy: Policy) -> bool:
    """Whether `policy` places a new PS job before it starts (its optional `places_new_jobs`
    attribute, e.g. Harmony's profiling node): the job's AM then waits for its first directive
    before asking for executors, instead of starting the submitted shape wherever it fits and
    moving it. False for a policy without the attribute."""
    return bool(getattr(policy, "places_new_jobs", False))


def known() -> list[str]:
    return sorted(_REGISTRY)


def create(name: str, settings: Optional[RMConfig] = None) -> Policy:
    """Instantiate the policy called `name` (with `settings`, the defaults when None, for a factory
    that takes them); KeyError listing the known ones otherwise."""
    try:
        factory, takes_settings = _REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown policy {name!r}; known policies: {', '.join(known())}") from None
    if takes_settings:
        return factory(settings if settings is not None else RMConfig())
    return factory()
