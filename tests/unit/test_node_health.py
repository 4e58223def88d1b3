"""Node health (nodemanager/node_health.py, YARN's NodeHealthCheckerService): the disks' and the
health script's verdicts, the monitor that runs them, the heartbeat that carries them, the settings."""
from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from nm_harness import SECRET, FakeNodeRM
from nodemanager import node_settings
from nodemanager.container_manager import ContainerManager
from nodemanager.enforcement import Enforcement
from nodemanager.node_health import DiskUsage, NodeHealthMonitor, disk_problems, health, measure, script_problem
from nodemanager.recovery_store import RecoveryStore
from nodemanager.rm_link import RMLink
from polling import async_wait_until
from protocol.config import ConfigError, NMConfig
from protocol.records import Resource

MB = 2**20


def test_a_disk_too_full_or_short_of_free_space_is_named_with_its_dirs() -> None:
    disks = [DiskUsage(("/data/local", "/data/logs"), 1000 * MB, 50 * MB), DiskUsage(("/var/rec",), 1000 * MB, 500 * MB)]
    assert disk_problems(disks, 90.0, 0) == ["/data/local, /data/logs: 95.0% full (max_disk_utilization_percent 90)"]
    assert disk_problems(disks, 96.0, 100) == ["/data/local, /data/logs: 50 MB free (min_free_disk_mb 100)"]
    assert disk_problems(disks, 96.0, 0) == []
    assert disk_problems([DiskUsage(("/x",), 0, 0)], 90.0, 0) == ["/x: the filesystem reports no size"]


def test_only_an_error_line_makes_the_script_say_unhealthy_and_both_verdicts_reach_the_report() -> None:
    assert script_problem("all fine\n") is None
    assert script_problem("checking\nERROR: the NIC drops packets\n") == "checking\nERROR: the NIC drops packets"
    assert script_problem("an ERROR later in the line is not one\n") is None
    assert health([], None).healthy
    h = health(["/d: 95.0% full"], "ERROR: x")
    assert not h.healthy and h.report == "local dirs are bad: /d: 95.0% full\nhealth script: ERROR: x"


def test_dirs_on_one_filesystem_are_measured_once_and_a_missing_dir_at_its_parent(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    [d] = measure([str(tmp_path / "a"), str(tmp_path / "not-yet" / "b")])
    assert d.paths == (str(tmp_path / "a"), str(tmp_path / "not-yet" / "b")) and 0 < d.free <= d.total


def _script(tmp_path: Path, body: str) -> str:
    p = tmp_path / "health.sh"
    p.write_text("#!/bin/sh\n" + body)
    p.chmod(0o755)
    return str(p)


async def test_the_monitor_runs_the_script_and_checks_the_disks(tmp_path: Path) -> None:
    dirs = [str(tmp_path)]
    bad = NodeHealthMonitor(dirs, 100.0, 0, _script(tmp_path, "echo 'ERROR: fan failed'\n"))
    h = await bad.check()
    assert not h.healthy and h.report == "health script: ERROR: fan failed" and bad.current == h
    full = NodeHealthMonitor(dirs, 100.0, 2**40)           # a terabyte free asked of a test's tmp dir
    h = await full.check()
    assert not h.healthy and h.report.startswith(f"local dirs are bad: {tmp_path}:") and "min_free_disk_mb" in h.report
    failing = NodeHealthMonitor(dirs, 100.0, 0, _script(tmp_path, "echo ERROR; exit 3\n"))
    assert (await failing.check()).healthy                  # a script that fails does not take the node out


async def test_a_script_past_its_timeout_is_killed_with_what_it_started(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    script = _script(tmp_path, f"sleep 60 & echo $! > {pids}\necho $$ >> {pids}\nwait\n")
    m = NodeHealthMonitor([str(tmp_path)], 100.0, 0, script, script_timeout_s=0.5)
    assert (await m.check()).healthy
    for pid in map(int, pids.read_text().split()):
        assert not Path(f"/proc/{pid}").exists() or Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"


async def test_the_heartbeat_carries_the_latest_verdict(tmp_path: Path) -> None:
    flag = tmp_path / "broken"
    monitor = NodeHealthMonitor([str(tmp_path)], 100.0, 0,
                                _script(tmp_path, f"[ -e {flag} ] && echo 'ERROR: disk controller resets'\nexit 0\n"),
                                interval_s=0.1)
    cfg = NMConfig(local_dir=str(tmp_path / "local"), log_dir=str(tmp_path / "logs"), recovery_dir=str(tmp_path / "rec"))
    manager = ContainerManager(cfg, "n1:1", "127.0.0.1", 1, Resource(1024, 2), Enforcement(None),
                               RecoveryStore(cfg.recovery_dir))
    rm = await FakeNodeRM().start()
    link = RMLink(rm.url, SECRET, "n1:1", "n1:1", Resource(1024, 2), "/default-rack", manager, 50, 3600.0,
                  health=lambda: monitor.current)
    monitor.start()
    task = asyncio.get_running_loop().create_task(link.run())
    try:
        await async_wait_until(lambda: rm.heartbeats and rm.heartbeats[-1].health.healthy, 15, "a healthy heartbeat")
        flag.write_text("")
        await async_wait_until(lambda: not rm.heartbeats[-1].health.healthy, 15, "an unhealthy heartbeat")
        assert rm.heartbeats[-1].health.report == "health script: ERROR: disk controller resets"
        os.unlink(flag)
        await async_wait_until(lambda: rm.heartbeats[-1].health.healthy, 15, "healthy again")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await monitor.stop()
        await link.close()
        await rm.stop()
        manager.store.close()


@pytest.mark.parametrize("change, setting", [
    ({"max_disk_utilization_percent": 0}, "max_disk_utilization_percent"),
    ({"max_disk_utilization_percent": 101}, "max_disk_utilization_percent"),
    ({"min_free_disk_mb": -1}, "min_free_disk_mb"),
    ({"health_check_interval_s": 0}, "health_check_interval_s"),
    ({"health_script_timeout_s": float("nan")}, "health_script_timeout_s"),
    ({"health_script": "relative/health.sh"}, "health_script"),
    ({"health_script": "/nonexistent/health.sh"}, "health_script"),
])
def test_bad_health_settings_stop_the_nm_naming_them(change: dict[str, object], setting: str) -> None:
    with pytest.raises(ConfigError, match=setting):
        node_settings.check_health(NMConfig(**change))  # type: ignore[arg-type]
