"""Harmony's performance model (eq. 4.1-4.4) on hand-worked groups."""
from __future__ import annotations

import numpy as np
import pytest

from models.harmony import (GroupStats, ModelError, best_machines, cluster_utilization, cpu_share, cpu_time,
                            group_iteration_time, group_stats, group_utilization, link_time, net_time, normalise_cpu,
                            score, utilization)


def test_cpu_time_scales_inversely_with_the_groups_machines():
    # Eq. 4.2: 8 s of COMP on one machine is 2 s on four; COMM does not scale.
    assert cpu_time(8.0, 4) == pytest.approx(2.0)
    assert normalise_cpu(2.0, 4) == pytest.approx(8.0)
    with pytest.raises(ModelError):
        normalise_cpu(1.0, 0)


def test_a_resource_bound_group_iterates_in_the_sum_of_its_busier_resource():
    # A: COMP 4, COMM 1; B: COMP 1, COMM 3 (at the group's m). COMP sums to 5, COMM to 4, the
    # longest job takes 5: the group is CPU-bound, T = 5 (eq. 4.1), U = [5/5, 4/5] (eq. 4.3).
    cpu, net = np.array([4.0, 1.0]), np.array([1.0, 3.0])
    assert group_iteration_time(cpu, net) == pytest.approx(5.0)
    assert group_utilization(cpu, net) == pytest.approx([1.0, 0.8])


def test_a_job_bound_group_iterates_in_its_longest_job():
    # C: 1 + 1, D: 8 + 6. Sums 9 and 7, but D alone takes 14: T = 14, both resources part idle.
    cpu, net = np.array([1.0, 8.0]), np.array([1.0, 6.0])
    assert group_iteration_time(cpu, net) == pytest.approx(14.0)
    assert group_utilization(cpu, net) == pytest.approx([9 / 14, 7 / 14])


def test_cluster_utilization_weights_the_groups_by_their_machines():
    # Eq. 4.4: group 1 on 2 machines at [1, .8], group 2 on 6 at [.5, .5].
    u = cluster_utilization(np.array([2, 6]), np.array([[1.0, 0.8], [0.5, 0.5]]))
    assert u == pytest.approx([(2 * 1.0 + 6 * 0.5) / 8, (2 * 0.8 + 6 * 0.5) / 8])
    assert score(np.array([1.0, 0.4]), cpu_weight=0.75) == pytest.approx(0.85)


def test_group_stats_evaluates_a_whole_grouping_at_each_groups_machines():
    # Profiles on ONE machine: A (8, 1), B (2, 3) in group 0 on 2 machines -> the first case above;
    # C (2, 1), D (16, 6) in group 1 on 2 machines -> the job-bound case; E not running.
    t_cpu1 = np.array([8.0, 2.0, 2.0, 16.0, 5.0])
    t_net = np.array([1.0, 3.0, 1.0, 6.0, 5.0])
    stats = group_stats(t_cpu1, t_net, np.array([0, 0, 1, 1, -1]), np.array([2, 2]))
    assert isinstance(stats, GroupStats)
    assert stats.iteration_time == pytest.approx([5.0, 14.0])
    assert list(stats.job_bound) == [False, True]
    assert stats.utilization == pytest.approx(np.array([[1.0, 0.8], [9 / 14, 0.5]]))
    assert utilization(t_cpu1, t_net, np.array([0, 0, 1, 1, -1]), np.array([2, 2])) == pytest.approx(
        [(1.0 + 9 / 14) / 2, (0.8 + 0.5) / 2])


def test_group_stats_refuses_a_group_without_machines_and_negative_times():
    with pytest.raises(ModelError, match="machine"):
        group_stats(np.array([1.0]), np.array([1.0]), np.array([0]), np.array([0]))
    with pytest.raises(ModelError, match="non-negative"):
        group_stats(np.array([-1.0]), np.array([1.0]), np.array([0]), np.array([1]))


def test_comps_that_hold_part_of_the_pool_add_up_by_their_share() -> None:
    # Two COMP-heavy jobs of 2 threads each on a 4-core pool run side by side: their CPU term
    # is half their summed COMP time, so the group is job-bound, not CPU-bound.
    share = cpu_share(np.array([2, 2]), 4)
    assert list(share) == [0.5, 0.5]
    t_cpu, t_net = np.array([0.8, 0.7]), np.array([0.2, 0.3])
    assert group_iteration_time(t_cpu, t_net) == pytest.approx(1.5)             # the paper's case
    assert group_iteration_time(t_cpu, t_net, share) == pytest.approx(1.0)       # max_j T_itr_j
    assert list(group_utilization(t_cpu, t_net, share)) == pytest.approx([0.75, 0.5])
    # threads == cores (or more: granted the whole pool) is the paper's model exactly
    assert group_iteration_time(t_cpu, t_net, cpu_share(np.array([4, 8]), 4)) == pytest.approx(1.5)
    stats = group_stats(np.array([0.8, 0.7, 0.4]), np.array([0.2, 0.3, 0.1]), np.array([0, 0, 1]),
                        np.array([1, 1]), share=np.array([0.5, 0.5, 1.0]))
    assert list(stats.iteration_time) == pytest.approx([1.0, 0.5])
    with pytest.raises(ModelError, match=">= 1"):
        cpu_share(0, 4)


def test_comm_grows_with_the_share_of_the_exchange_that_crosses_the_link():
    # 0.1 s of COMM on loopback, 0.8 s for the whole exchange on the link: on m machines (m-1)/m
    # of it crosses the link.
    assert net_time(0.1, 0.8, 1) == pytest.approx(0.1)
    assert net_time(0.1, 0.8, 2) == pytest.approx(0.5)
    assert net_time(0.1, 0.8, 4) == pytest.approx(0.7)
    assert list(net_time(np.array([0.1, 0.2]), np.array([0.8, 0.0]), np.array([2, 3]))) == pytest.approx([0.5, 0.2])
    with pytest.raises(ModelError):
        net_time(0.1, 0.8, 0)
    # 1 MB pulled + pushed per mini-batch on 100 Mbit/s: 80 ms; an unknown bandwidth is no link term
    assert link_time(1e6, 100e6) == pytest.approx(0.08)
    assert link_time(1e6, 0) == 0.0 and link_time(0, 100e6) == 0.0


def test_a_job_alone_spans_machines_only_when_its_comp_outweighs_its_link_time():
    # t_cpu1 2 s, link 0.8 s: 4 machines take 0.5 + 0.1 + 0.6 = 1.2 s against 2.1 s on one
    assert best_machines(2.0, 0.1, 0.8, 4) == 4
    # t_cpu1 0.5 s: one machine 0.6 s, two 0.25 + 0.1 + 0.4 = 0.75 s
    assert best_machines(0.5, 0.1, 0.8, 4) == 1
    assert best_machines(0.8, 0.1, 0.8, 4) == 1            # a tie: fewer machines
    assert best_machines(5.0, 0.1, 0.0, 3) == 3            # the paper's model: all of them
    with pytest.raises(ModelError):
        best_machines(1.0, 0.1, 0.1, 0)


def test_group_stats_reads_each_jobs_comm_at_its_groups_machines():
    # A (t_cpu1 2, local COMM 1, link 6) and B (1, 2, 6) on 2 machines: COMM 1 + 3 and 2 + 3;
    # C (4, 1, 6) alone on 1 machine pays no link.
    t_cpu1, t_net, link = np.array([2.0, 1.0, 4.0]), np.array([1.0, 2.0, 1.0]), np.array([6.0, 6.0, 6.0])
    stats = group_stats(t_cpu1, t_net, np.array([0, 0, 1]), np.array([2, 1]), t_link=link)
    assert list(stats.cpu) == pytest.approx([1.5, 4.0])
    assert list(stats.net) == pytest.approx([9.0, 1.0])
    assert list(stats.max_job) == pytest.approx([5.5, 5.0])
    # t_link 0 (the default) is the paper's model
    paper = group_stats(t_cpu1, t_net, np.array([0, 0, 1]), np.array([2, 1]))
    assert list(paper.net) == pytest.approx([3.0, 1.0])
    assert utilization(t_cpu1, t_net, np.array([0, 0, 1]), np.array([2, 1]), t_link=0.0) == pytest.approx(
        paper.cluster())
    with pytest.raises(ModelError, match="non-negative"):
        group_stats(t_cpu1, t_net, np.array([0, 0, 1]), np.array([2, 1]), t_link=-link)
