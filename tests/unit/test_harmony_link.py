"""Harmony's link term (models/harmony.py `net_time`): profiles split COMM into local and link
parts from the reports' bytes per mini-batch, the policy groups by COMM at each group's nodes, and
the link bandwidth comes from rm.toml."""
from __future__ import annotations

from pathlib import Path

import pytest

from harmony_world import World
from protocol.config import ConfigError, RMConfig, load_rm
from protocol.job_report import JobReport, WorkerTiming
from rm.policies import HarmonyPolicy, create
from rm.policies.harmony import HarmonyConfig
from rm.policies.harmony_profiles import ProfileBook, update

BW = 100e6      # 100 Mbit/s: 12.5 MB/s


def report(iterations: int, workers: int, t_cpu: float, t_net: float, nbytes: float) -> JobReport:
    return JobReport(workers=workers, servers=workers, started=True, iterations=iterations, directive_version=1,
                     worker_times=WorkerTiming(compute_s=t_cpu, comm_s=t_net, workers=workers, compute_held_s=t_cpu,
                                               comm_held_s=t_net, bytes_per_batch=nbytes))


def test_a_sample_on_two_machines_splits_its_comm_into_local_and_link_parts():
    # 1 MB per mini-batch on 100 Mbit/s: t_link 0.08 s; on 2 machines half of it crossed the link,
    # so of the 0.5 s COMM 0.46 s is local.
    p = update(None, report(10, 2, 1.0, 0.5, 1e6), link_bandwidth_bps=BW)
    assert p is not None
    assert (p.t_cpu1, p.t_net_local, p.t_link) == (pytest.approx(2.0), pytest.approx(0.46), pytest.approx(0.08))
    assert p.at(1) == (pytest.approx(2.0), pytest.approx(0.46))
    assert p.at(4) == (pytest.approx(0.5), pytest.approx(0.46 + 0.06))
    # The next sample, on one machine, pays no link: EMA (weight 0.3) of both parts.
    q = update(p, report(20, 1, 2.0, 0.3, 2e6), ema_weight=0.3, link_bandwidth_bps=BW)
    assert q is not None and q.samples == 2
    assert q.t_net_local == pytest.approx(0.7 * 0.46 + 0.3 * 0.3)
    assert q.t_link == pytest.approx(0.7 * 0.08 + 0.3 * 0.16)
    # A report without bytes keeps the link time; a local COMM below the link's share is 0, not negative.
    r = update(q, report(30, 2, 2.0, 0.01, 0.0), ema_weight=0.3, link_bandwidth_bps=BW)
    assert r is not None and r.t_link == pytest.approx(q.t_link)
    assert r.t_net_local == pytest.approx(0.7 * q.t_net_local)


def test_without_a_bandwidth_the_profile_is_the_papers():
    book = ProfileBook()
    p = book.observe("a", report(10, 2, 1.0, 0.5, 1e6))
    assert p is not None and (p.t_net_local, p.t_link) == (0.5, 0.0) and p.at(3)[1] == 0.5


def _two_link_heavy_jobs(bandwidth: float) -> tuple[World, HarmonyPolicy]:
    # a (COMP 2 s on one node, COMM 1 s) and b (1 s, 2 s) complement each other, but each moves 75 MB
    # per mini-batch: 6 s on the 100 Mbit/s link for the whole exchange, 3 s on two nodes.
    w, p = World(2), HarmonyPolicy(HarmonyConfig(link_bandwidth_bps=bandwidth))
    for app_id, cpu, net in (("a", 2.0, 1.0), ("b", 1.0, 2.0)):
        app = w.submit(app_id, cpu, net)
        app.link_s, app.bytes_per_batch = 6.0, 6.0 * BW / 8
    for _ in range(3):
        w.step(p)
    return w, p


def test_link_heavy_jobs_keep_a_node_each_instead_of_sharing_both():
    # The paper's model (no bandwidth) groups them on both nodes: U = [0.5, 1.0] against [0.5, 0.5].
    _, paper = _two_link_heavy_jobs(0.0)
    d = paper.describe()
    assert d["a"]["state"] == d["b"]["state"] == "running"
    assert d["a"]["group"] == d["b"]["group"] and d["a"]["groupNodes"] == 2
    # With the link, their COMM on two nodes is 4 s and 5 s: U_cpu drops to 1/6 and a node each wins.
    _, linked = _two_link_heavy_jobs(BW)
    d = linked.describe()
    assert d["a"]["state"] == d["b"]["state"] == "running"
    assert d["a"]["group"] != d["b"]["group"] and d["a"]["groupNodes"] == d["b"]["groupNodes"] == 1
    assert (d["a"]["tNetLocal"], d["a"]["tLink"], d["a"]["tNet"]) == (1.0, 6.0, 1.0)   # tNet at its 1 node


def test_the_link_bandwidth_comes_from_rm_toml_and_a_negative_one_is_refused(tmp_path: Path):
    conf = tmp_path / "rm.toml"
    conf.write_text('[rm]\npolicy = "harmony"\nharmony_link_bandwidth_bps = 100e6\n')
    policy = create("harmony", load_rm(str(conf)))
    assert isinstance(policy, HarmonyPolicy) and policy.cfg.link_bandwidth_bps == BW
    default = create("harmony")
    assert isinstance(default, HarmonyPolicy) and default.cfg.link_bandwidth_bps == 0.0     # unknown
    conf.write_text("[rm]\nharmony_link_bandwidth_bps = -1\n")
    with pytest.raises(ConfigError, match="harmony_link_bandwidth_bps must be >= 0"):
        load_rm(str(conf))
    with pytest.raises(ValueError, match="link_bandwidth_bps"):
        HarmonyConfig(link_bandwidth_bps=-5.0)
    assert RMConfig().harmony_link_bandwidth_bps == 0.0
