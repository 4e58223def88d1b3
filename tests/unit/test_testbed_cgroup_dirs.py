"""Testbed.cgroup_dirs: what is left under a host's cgroups, read while its NM may be removing them."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from elastane_cli.testbed_hosts import HOST_LEAF, CgroupBudget, Host, Testbed


def budgeted_testbed(tmp_path: Path) -> tuple[Testbed, Path]:
    tb = Testbed(tmp_path / "tb", 1)
    root = tmp_path / "cg" / "host0"
    for d in (HOST_LEAF, "elastane/node/c1/inner", "elastane/node/c2"):
        (root / d).mkdir(parents=True)
    tb.hosts.append(Host(0, "host0", "10.0.0.10", "ns", "veth", str(tmp_path / "h0"),
                         budget=CgroupBudget("v1", {"/sys/fs/cgroup/cpu": str(root)})))
    return tb, root


def test_every_dir_below_the_host_but_its_own_leaf_is_listed(tmp_path: Path) -> None:
    tb, root = budgeted_testbed(tmp_path)
    assert tb.cgroup_dirs(0) == sorted(str(root / d) for d in
                                       ("elastane", "elastane/node", "elastane/node/c1", "elastane/node/c1/inner",
                                        "elastane/node/c2"))


def test_a_dir_removed_during_the_walk_is_skipped_not_an_error(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    tb, root = budgeted_testbed(tmp_path)
    gone = str(root / "elastane/node/c1")
    real = os.scandir

    def scandir(path: object) -> object:     # c1 vanishes between its listing and its walk, as a
        if os.fspath(path) == gone:           # finished container's cgroup does under its NM
            raise FileNotFoundError(path)
        return real(path)
    monkeypatch.setattr(os, "scandir", scandir)
    listed = tb.cgroup_dirs("host0")
    assert gone in listed and str(root / "elastane/node/c2") in listed
    assert str(root / "elastane/node/c1/inner") not in listed
