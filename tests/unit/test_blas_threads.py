"""psruntime.blas_threads holds the BLAS thread pools numpy and scipy loaded to the threads asked,
and sets the variables that libraries loaded later read (checked in a fresh interpreter, so this
test's process keeps its own pools); the count an executor takes follows its cgroup's CPU quota,
and a process without one is left alone."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROBE = r"""
import ctypes, json, os, sys
import numpy, scipy.linalg    # both OpenBLAS builds loaded
from psruntime.blas_threads import limit_blas_threads, loaded_blas_libraries

def counts():
    out = {}
    for path in loaded_blas_libraries():
        lib = ctypes.CDLL(path)
        for name in ("openblas_get_num_threads", "openblas_get_num_threads64_",
                     "scipy_openblas_get_num_threads", "scipy_openblas_get_num_threads64_"):
            fn = getattr(lib, name, None)
            if fn is not None:
                fn.restype = ctypes.c_int
                out[os.path.basename(path)] = fn()
                break
    return out

before = counts()
told = limit_blas_threads(1)
print(json.dumps({"before": before, "after": counts(), "told": told,
                  "env": os.environ.get("OPENBLAS_NUM_THREADS")}))
"""


def test_loaded_blas_pools_are_held_to_one_thread() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")}
    env["PYTHONPATH"] = str(ROOT)
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120,
                         check=True)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["told"] >= 1 and got["after"], got
    assert set(got["after"].values()) == {1}, got
    assert got["env"] == "1"
    if (os.cpu_count() or 1) > 1:
        assert max(got["before"].values()) > 1, got      # they started with a thread per core


def _root(tmp_path: Path, name: str, cpu_max: str | None = None,
          v1: tuple[int, int] | None = None) -> str:
    root = tmp_path / name
    root.mkdir()
    if cpu_max is not None:
        (root / "cpu.max").write_text(cpu_max + "\n")
    if v1 is not None:
        (root / "cpu").mkdir()
        (root / "cpu" / "cpu.cfs_quota_us").write_text(f"{v1[0]}\n")
        (root / "cpu" / "cpu.cfs_period_us").write_text(f"{v1[1]}\n")
    return str(root)


def test_the_thread_count_follows_the_cgroups_cpu_quota_and_leaves_an_unlimited_one_alone(tmp_path: Path) -> None:
    from psruntime.blas_threads import blas_threads_for_cgroup
    assert blas_threads_for_cgroup(_root(tmp_path, "testbed", "30000 100000"), cpus=2) == 1   # 0.3 core
    assert blas_threads_for_cgroup(_root(tmp_path, "v1", v1=(150000, 100000)), cpus=4) == 2   # 1.5 cores
    assert blas_threads_for_cgroup(_root(tmp_path, "three", "250000 100000"), cpus=4) == 3
    assert blas_threads_for_cgroup(_root(tmp_path, "all", "250000 100000"), cpus=2) is None   # no fewer than cores
    assert blas_threads_for_cgroup(_root(tmp_path, "max", "max 100000"), cpus=2) is None
    assert blas_threads_for_cgroup(_root(tmp_path, "v1max", v1=(-1, 100000)), cpus=2) is None
    assert blas_threads_for_cgroup(_root(tmp_path, "none"), cpus=2) is None


def test_a_process_under_a_fraction_of_a_core_runs_blas_on_one_thread(tmp_path: Path) -> None:
    root = _root(tmp_path, "host", "30000 100000")
    probe = PROBE.replace("told = limit_blas_threads(1)",
                          f"from psruntime.blas_threads import limit_blas_threads_to_cgroup\n"
                          f"told = limit_blas_threads_to_cgroup({root!r})")
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")}
    env["PYTHONPATH"] = str(ROOT)
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120,
                         check=True)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    if (os.cpu_count() or 1) > 1:
        assert got["told"] == 1 and set(got["after"].values()) == {1}, got
    else:
        assert got["told"] is None, got          # one core: nothing to hold back


def _proc_cgroup(tmp_path: Path, text: str) -> str:
    p = tmp_path / "proc-self-cgroup"
    p.write_text(text)
    return str(p)


def test_an_nm_containers_own_v2_quota_holds_its_blas_threads_though_the_root_has_none(tmp_path: Path) -> None:
    """The NM puts a container in <mount>/elastane/<node>/<container> (no cgroup namespace): its
    1-vcore cpu.max is there, the root has none (or says max), and the executor still takes 1."""
    from nodemanager.cgroup_v2 import CgroupV2
    from psruntime.blas_threads import blas_threads_for_cgroup
    mount = tmp_path / "cgfs"
    mount.mkdir()
    nm = CgroupV2(str(mount), "elastane", "node-1", hard_cpu=True)
    nm.setup()
    cg = nm.make("container_1_0001_01_000002")
    nm.configure(cg, memory_mb=2048, vcores=1)
    rel = "/" + os.path.relpath(cg.dirs[0], mount)
    proc = _proc_cgroup(tmp_path, f"0::{rel}\n")
    assert blas_threads_for_cgroup(str(mount), cpus=16, proc_cgroup=proc) == 1
    (mount / "cpu.max").write_text("max 100000\n")
    assert blas_threads_for_cgroup(str(mount), cpus=16, proc_cgroup=proc) == 1
    # a process elsewhere in the tree (the NM's own) sees no quota
    assert blas_threads_for_cgroup(str(mount), cpus=16, proc_cgroup=_proc_cgroup(tmp_path, "0::/system.slice\n")) is None


def test_the_smallest_quota_on_the_way_up_counts_v2_and_v1(tmp_path: Path) -> None:
    from psruntime.blas_threads import blas_threads_for_cgroup
    v2 = tmp_path / "v2"
    (v2 / "a" / "b" / "c").mkdir(parents=True)
    (v2 / "a" / "cpu.max").write_text("200000 100000\n")        # 2 cores for the parent
    (v2 / "a" / "b" / "c" / "cpu.max").write_text("max 100000\n")
    proc = _proc_cgroup(tmp_path, "0::/a/b/c\n")
    assert blas_threads_for_cgroup(str(v2), cpus=16, proc_cgroup=proc) == 2
    (v2 / "a" / "b" / "cpu.max").write_text("350000 100000\n")  # looser than the parent: the parent wins
    assert blas_threads_for_cgroup(str(v2), cpus=16, proc_cgroup=proc) == 2
    (v2 / "cpu.max").write_text("100000 100000\n")              # a testbed root of 1 core
    assert blas_threads_for_cgroup(str(v2), cpus=16, proc_cgroup=proc) == 1

    v1 = tmp_path / "v1"
    cid = v1 / "cpu,cpuacct" / "elastane" / "node-1" / "c2"
    cid.mkdir(parents=True)
    (v1 / "memory" / "elastane").mkdir(parents=True)
    (v1 / "cpu,cpuacct" / "cpu.cfs_quota_us").write_text("-1\n")
    (v1 / "cpu,cpuacct" / "cpu.cfs_period_us").write_text("100000\n")
    (cid / "cpu.cfs_quota_us").write_text("300000\n")
    (cid / "cpu.cfs_period_us").write_text("100000\n")
    proc = _proc_cgroup(tmp_path, "12:memory:/elastane/node-1/c2\n4:cpu,cpuacct:/elastane/node-1/c2\n"
                                  "0::/elastane/node-1/c2\n")
    assert blas_threads_for_cgroup(str(v1), cpus=16, proc_cgroup=proc) == 3
    (cid / "cpu.cfs_quota_us").write_text("-1\n")
    assert blas_threads_for_cgroup(str(v1), cpus=16, proc_cgroup=proc) is None
