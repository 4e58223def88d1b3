"""remove_cgroup_tree: a host's cgroups go even while the last of its processes is still exiting.

A SIGKILLed process leaves its network namespace (where Testbed.kill_host looks for processes)
before it leaves its cgroup, so the first rmdir after a kill can meet EBUSY on a loaded machine; a
CI run left `<tag>/node2/system` behind that way. Here a real cgroup (root, cgroups mounted) holds
a process that is still running when the removal starts and ends by itself a moment later.
"""
from __future__ import annotations

import os
import subprocess
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from elastane_cli.testbed_hosts import CgroupBudget, create_budget, remove_cgroup_tree

# How long after the removal starts the process in the cgroup ends (its stdin closed by a timer):
# what keeps the dir busy meanwhile, not a wait for anything.
ENDS_AFTER_S = 1.0


@pytest.fixture
def budget() -> Iterator[CgroupBudget]:
    if os.geteuid() != 0:
        pytest.skip("creating cgroups needs root")
    tag = f"test-{uuid.uuid4().hex[:6]}"
    b = create_budget(tag, "host0", None)
    if b is None:
        pytest.skip("no usable cgroups on this machine")
    yield b
    for d in b.dirs.values():
        remove_cgroup_tree(Path(d))
        for top in (Path(d).parent, Path(d).parent.parent):     # the tag's dir, then the testbed's
            try:
                top.rmdir()
            except OSError:
                pass        # another testbed's hosts are there


def process_inside(b: CgroupBudget) -> subprocess.Popen[str]:
    """A process that joins the host's cgroups, says "in" once it has, then runs until its stdin
    is closed."""
    joins = "; ".join(f"echo $$ > {f}" for f in b.procs_files())
    p = subprocess.Popen(["sh", "-c", f"{joins} && echo in && exec cat > /dev/null"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "in"
    return p


def end(p: subprocess.Popen[str]) -> None:
    assert p.stdin is not None
    p.stdin.close()
    p.wait(10)


def test_a_dir_busy_with_an_exiting_process_is_removed_once_the_process_is_out(budget: CgroupBudget) -> None:
    p = process_inside(budget)
    timer = threading.Timer(ENDS_AFTER_S, end, [p])
    timer.start()
    try:
        assert p.poll() is None                 # still in the cgroup as the removal starts
        left = [e for d in budget.dirs.values() for e in remove_cgroup_tree(Path(d))]
        assert left == [] and p.poll() is not None
        assert not any(Path(d).exists() for d in budget.dirs.values())
    finally:
        timer.join()


def test_without_time_to_wait_the_busy_dir_is_reported_and_left(budget: CgroupBudget) -> None:
    p = process_inside(budget)
    try:
        left = [e for d in budget.dirs.values() for e in remove_cgroup_tree(Path(d), busy_timeout_s=0.0)]
        assert left and all("busy" in e for e in left), left
        assert all(Path(d).exists() for d in budget.dirs.values())
    finally:
        end(p)
