"""How the suite is spread over pytest-xdist workers (`make test` runs `-n 2 --dist loadgroup`).

Two rules, both applied by tests/conftest.py's collection hook, with or without xdist:

- Tests that share a fixture built once per module, class or package (a cluster started for the
  module's tests) stay together: each gets an `xdist_group` named after its module (and the
  fixture's parameter, where it has one), so one worker runs them in order and builds that
  fixture once. Every other test is scheduled on its own, also a test of the same module that
  does not use the shared fixture.
  Session-scoped fixtures (the shared `cluster`, `s3_server`) are per worker: a worker builds its
  own the first time one of its tests asks.
- The long tests go out first. xdist hands out work in collection order (`--no-loadscope-reorder`)
  and has no work stealing under loadgroup, so a 90 s test scheduled last keeps one worker busy
  after the other has run out of work. Modules are sorted by a priority (the known long ones,
  then the rest of tests/cluster, then tests/unit); a module's tests keep their order and stay
  contiguous, so a serial run builds each module fixture once as before.

Nothing here changes what a test does: only where and in which order it runs.
"""
from __future__ import annotations

from typing import Any

import pytest

# Modules whose tests each run for tens of seconds on the multi-host testbed or train real jobs
# (a 2-core machine's slowest, longest first as measured): a scheduling hint only, a module
# missing from here still runs.
LONG_MODULES = (
    "tests/cluster/test_host_suite.py",
    "tests/cluster/test_harmony_cluster.py",
    "tests/cluster/test_sim_calibrate_testbed.py",
    "tests/cluster/test_s3_multihost_cluster.py",
    "tests/cluster/test_multihost_cluster.py",
    "tests/cluster/test_optimus_cluster.py",
    "tests/cluster/test_queue_reclaim_cluster.py",
    "tests/cluster/test_eps_cluster.py",
    "tests/cluster/test_cruise_cluster.py",
)
SHARED_SCOPES = ("module", "class", "package")


def module_of(item: pytest.Item) -> str:
    """The item's module as a root-relative path, e.g. tests/cluster/test_ps_cluster.py."""
    return item.nodeid.split("::", 1)[0]


def shared_fixtures(item: pytest.Item) -> list[str]:
    """The module-, class- or package-scoped fixtures of the project's own that the item uses
    (third-party plugins' fixtures have an empty baseid and are left out)."""
    info: Any = getattr(item, "_fixtureinfo", None)
    if info is None:
        return []
    return sorted(name for name, defs in info.name2fixturedefs.items()
                  if any(d.scope in SHARED_SCOPES and d.baseid for d in defs))


def group_of(item: pytest.Item) -> str | None:
    """The xdist group of an item that shares a fixture: its module, and the parameter of each
    parametrized shared fixture (a module cluster built once per policy is one group per policy,
    so those run in parallel too). No "@" or "]": xdist splits the group off a node id by them."""
    names = shared_fixtures(item)
    if not names:
        return None
    callspec: Any = getattr(item, "callspec", None)
    indices: dict[str, int] = callspec.indices if callspec is not None else {}
    return ":".join([module_of(item), *(f"{n}={indices[n]}" for n in names if n in indices)])


def priority(module: str) -> int:
    if module in LONG_MODULES:
        return LONG_MODULES.index(module)
    return len(LONG_MODULES) + (0 if module.startswith("tests/cluster/") else 1)


def plan(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Group the items that share a fixture (where xdist is installed: it defines the marker) and
    put the long modules first (in place)."""
    if config.pluginmanager.hasplugin("xdist"):
        for item in items:
            group = group_of(item)
            if group is not None and item.get_closest_marker("xdist_group") is None:
                item.add_marker(pytest.mark.xdist_group(name=group))
    first_seen: dict[str, int] = {}
    for n, item in enumerate(items):
        first_seen.setdefault(module_of(item), n)
    items.sort(key=lambda i: (priority(module_of(i)), first_seen[module_of(i)]))
