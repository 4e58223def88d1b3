"""An HA RM's start (rm/ha/ha_server.py `HaResourceManager.start`) with some etcd members silent:
one of three down for maintenance is a warning naming it, and the RM serves as standby and joins
the election; with most of them silent it stops, naming them (exit code 2 as any bad setting)."""
from __future__ import annotations

import logging
from typing import Sequence

import pytest

from protocol.config import ClusterConfig, ConfigError, RMConfig
from protocol.ha_config import HAConfig
from rm.ha import ha_server
from rm.ha.ha_server import HaResourceManager, etcd_can_serve
from rm_testing import SECRET

ENDPOINTS = ["http://e1:2379", "http://e2:2379", "http://e3:2379"]


def rm_with_silent_members(monkeypatch: pytest.MonkeyPatch, silent: set[str]) -> tuple[HaResourceManager, list[str]]:
    async def check_members(targets: Sequence[tuple[str, int]], timeout_s: float) -> list[str]:
        return [f"{h}:{p}: ConnectionFailedError" for h, p in targets if h in silent]
    monkeypatch.setattr(ha_server, "check_members", check_members)
    ha = HAConfig(enabled=True, rm_ids=["rm1", "rm2"],
                  rm_addresses={"rm1": "http://127.0.0.1:18088", "rm2": "http://127.0.0.1:18089"},
                  etcd_endpoints=ENDPOINTS)
    rm = HaResourceManager(RMConfig(port=0), ClusterConfig(secret=SECRET), ha, "rm1")
    started: list[str] = []

    async def serve_standby() -> None:
        started.append("standby")
    monkeypatch.setattr(rm, "_serve_standby", serve_standby)
    monkeypatch.setattr(rm.elector, "start", lambda: started.append("election"))
    return rm, started


async def test_one_silent_member_of_three_is_named_in_a_warning_and_the_rm_starts(monkeypatch, caplog):
    rm, started = rm_with_silent_members(monkeypatch, {"e2"})
    with caplog.at_level(logging.WARNING, logger="rm.ha.ha_server"):
        assert await rm.start() == "http://127.0.0.1:18088"
    assert started == ["standby", "election"]
    assert "e2:2379" in caplog.text and "2 of 3" in caplog.text


async def test_most_members_silent_stops_the_rm_naming_them(monkeypatch):
    rm, started = rm_with_silent_members(monkeypatch, {"e1", "e3"})
    with pytest.raises(ConfigError, match=r"etcd_endpoints: no answer from e1:2379.*e3:2379"):
        await rm.start()
    assert started == []


def test_an_rm_starts_while_a_majority_of_the_listed_members_answers():
    assert [etcd_can_serve(1, k) for k in (0, 1)] == [True, False]
    assert [etcd_can_serve(2, k) for k in (0, 1)] == [True, False]     # a 2-member etcd needs both
    assert [etcd_can_serve(3, k) for k in (0, 1, 2)] == [True, True, False]
    assert [etcd_can_serve(5, k) for k in (2, 3)] == [True, False]
