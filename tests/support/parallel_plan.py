"""The order in which the suite's modules run: the long ones first.

`make test` runs the suite on three pytest-xdist workers with `--dist loadfile
--no-loadscope-reorder`: each module runs whole on one worker (so a cluster a module builds once
for its tests -- a module-scoped fixture -- is built once, as in a serial run), and modules are
handed out in collection order, each to the next worker that runs low on work. xdist has no work
stealing there, so a 100 s module handed out last keeps one worker busy long after the other has
run out of work. tests/conftest.py's collection hook therefore sorts the modules: the known long
ones first, longest first, then the rest of tests/cluster, then tests/unit; a module's tests keep
their order and stay together. Nothing here changes what a test does, only when it runs.

(xdist's `loadgroup` would let one module's independent tests run on both workers, but with
pytest 9 it no longer sees the groups: it writes them into a node id attribute pytest stopped
reading, and every test then runs on its own.)
"""
from __future__ import annotations

import pytest

# The modules that take longest on a busy 2-core machine running the suite on two or three workers
# (`--durations`; testbed tests, real training), longest first. A scheduling hint only: a module
# missing here still runs, just later.
LONG_MODULES = (
    "tests/cluster/test_queue_reclaim_cluster.py",
    "tests/cluster/test_host_suite.py",
    "tests/cluster/test_multihost_cluster.py",
    "tests/cluster/test_sim_calibrate_testbed.py",
    "tests/cluster/test_harmony_cluster.py",
    "tests/cluster/test_rm_ha_cluster.py",
    "tests/cluster/test_s3_cluster.py",
    "tests/cluster/test_log_aggregation_cluster.py",
    "tests/cluster/test_ps_cluster.py",
    "tests/unit/test_example_ctr.py",
    "tests/cluster/test_s3_multihost_cluster.py",
    "tests/cluster/test_eps_cluster.py",
    "tests/cluster/test_optimus_cluster.py",
    "tests/cluster/test_partition_policies_cluster.py",
    "tests/unit/test_model_files.py",
    "tests/cluster/test_cli_cluster.py",
    "tests/cluster/test_cruise_cluster.py",
    "tests/cluster/test_spill_cluster.py",
)


def module_of(item: pytest.Item) -> str:
    """The item's module as a root-relative path, e.g. tests/cluster/test_ps_cluster.py."""
    return item.nodeid.split("::", 1)[0]


def priority(module: str) -> int:
    if module in LONG_MODULES:
        return LONG_MODULES.index(module)
    return len(LONG_MODULES) + (0 if module.startswith("tests/cluster/") else 1)


def plan(items: list[pytest.Item]) -> None:
    """Sort the items, in place, by their module's priority; stable, so a module's tests keep
    their order and the modules of one priority their collection order."""
    first_seen: dict[str, int] = {}
    for n, item in enumerate(items):
        first_seen.setdefault(module_of(item), n)
    items.sort(key=lambda i: (priority(module_of(i)), first_seen[module_of(i)]))
