"""End to end: NMs enforce container limits — memory past the limit is killed with -104, and a
busy container with 1 vcore on a 2-core node is held to about one core (cgroups)."""
import os
import time
from pathlib import Path

import pytest

from appmaster.distributed_shell import build_submission
from cpu_accounting import check_held_to_one_core, idle_cores, machine_cpu_ticks
from conftest import cpu_seconds, pid_alive, pids_with_env, rest, submit_app, wait_app
from polling import wait_until
from protocol import container_env

pytestmark = pytest.mark.cluster


def cgroups_unusable_reason() -> str | None:
    """Why the NMs cannot use cgroups here (None when they can)."""
    from nodemanager.cgroup_detect import CgroupVersion, detect_from_file  # noqa: PLC0415
    if os.geteuid() != 0:
        return "not root: cgroups cannot be written"
    layout = detect_from_file()
    if layout.version is CgroupVersion.NONE:
        return f"no usable cgroup hierarchy: {layout.reason}"
    mount = layout.v2_mount if layout.version is CgroupVersion.V2 else layout.v1_mounts.get("cpu")
    if not mount or not os.access(mount, os.W_OK):
        return f"cgroup mount {mount} is not writable"
    return None


def cpu_limit_in_cores(pid: int) -> float | None:
    """The CPU quota (in cores) of the cgroup holding `pid`, from cpu.max (v2) or cfs quota/period (v1)."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        ctrls = controllers.split(",")
        if controllers == "" and (Path("/sys/fs/cgroup") / path.lstrip("/") / "cpu.max").exists():
            quota, period = (Path("/sys/fs/cgroup") / path.lstrip("/") / "cpu.max").read_text().split()
            return None if quota == "max" else int(quota) / int(period)
        if "cpu" in ctrls:
            base = Path("/sys/fs/cgroup") / controllers / path.lstrip("/")
            if not base.exists():
                base = Path("/sys/fs/cgroup/cpu") / path.lstrip("/")
            quota = int((base / "cpu.cfs_quota_us").read_text())
            return None if quota < 0 else quota / int((base / "cpu.cfs_period_us").read_text())
    return None


def test_container_over_its_memory_limit_is_killed_with_104(cluster):
    # Grows to ~480 MB in 16 MB steps (pages touched), far past the 128 MB container limit.
    hog = ("import time\nb = []\nfor _ in range(30):\n    b.append(b'x' * (16 << 20))\n    time.sleep(0.05)\n"
           "time.sleep(120)\n")
    sub = build_submission("memhog", ["python", "-c", hog], 1, 128, 1)
    app_id = submit_app(cluster.rm_url, sub)
    try:
        app = wait_app(cluster.rm_url, app_id, ("FINISHED",), 90)
    finally:
        _kill_quietly(cluster, app_id)
    assert app["finalStatus"] == "FAILED"
    assert "exited with -104 (KILLED_EXCEEDED_PMEM)" in app["diagnostics"], app["diagnostics"]


def test_busy_container_with_one_vcore_is_held_to_one_core(cluster, tmp_path):
    reason = cgroups_unusable_reason()
    if reason:
        pytest.skip(reason)
    # Two busy processes: unconstrained they would use both cores of the node.
    cmd = ["sh", "-c", f"yes > /dev/null & yes > /dev/null & echo $CONTAINER_ID > {tmp_path}/cid; wait"]
    app_id = submit_app(cluster.rm_url, build_submission("busy", cmd, 1, 128, 1))
    try:
        wait_app(cluster.rm_url, app_id, ("RUNNING",), 60)
        cid_file = tmp_path / "cid"
        wait_until(lambda: cid_file.exists() and cid_file.read_text().strip(), 60, "container started")
        cid = cid_file.read_text().strip()
        pids = wait_until(lambda: (p := pids_with_env(container_env.CONTAINER_ID, cid)) and len(p) >= 3 and p,
                          30, "the container's processes")
        cgroup = Path(f"/proc/{pids[0]}/cgroup").read_text()
        assert cpu_limit_in_cores(pids[0]) == 1.0, f"no 1-core quota on the container's cgroup:\n{cgroup}"
        t0, c0, m0 = time.monotonic(), sum(cpu_seconds(p) for p in pids), machine_cpu_ticks()
        # A measurement window, not a readiness wait: CPU time is compared against wall time.
        time.sleep(3.0)
        t1, c1, m1 = time.monotonic(), sum(cpu_seconds(p) for p in pids if pid_alive(p)), machine_cpu_ticks()
        cores = (c1 - c0) / (t1 - t0)
        problem = check_held_to_one_core(cores, idle_cores(m0, m1, t1 - t0))
        assert problem is None, f"{problem}; its cgroups:\n{cgroup}"
    finally:
        _kill_quietly(cluster, app_id)


def _kill_quietly(cluster, app_id: str) -> None:
    try:
        rest(cluster.rm_url, "PUT", f"/ws/v1/cluster/apps/{app_id}/state", {"state": "KILLED"}, user="alice")
        wait_app(cluster.rm_url, app_id, ("KILLED", "FINISHED", "FAILED"), 30)
    except Exception:
        pass
