"""TestbedCluster writes rm.toml's capacity-scheduler queues as the RM reads them (no hosts started)."""
from __future__ import annotations

from pathlib import Path

from elastane_cli.testbed_cluster import TestbedCluster
from protocol.config import QueueConfig, load_rm


def test_queues_reach_rm_toml(tmp_path: Path) -> None:
    c = TestbedCluster(tmp_path, workers=2, rm_conf={"preemption": "kill"},
                       queues=[{"name": "a", "capacity": 50.0},
                               {"name": "b", "capacity": 50.0, "max_capacity": 80.0, "disable_preemption": True}])
    c.write_conf()
    cfg = load_rm(str(c.conf_dir / "rm.toml"))
    assert cfg.preemption == "kill" and cfg.policy == "static"
    assert cfg.queues == [QueueConfig("a", 50.0), QueueConfig("b", 50.0, 80.0, disable_preemption=True)]


def test_no_queues_leaves_the_default_one(tmp_path: Path) -> None:
    c = TestbedCluster(tmp_path, workers=1)
    c.write_conf()
    assert [q.name for q in load_rm(str(c.conf_dir / "rm.toml")).queues] == ["default"]
