"""bench/rm_failover.py's pure parts: container ids launched twice across NM logs, the timings'
spread, and the count of new terms from the etcd epoch (the testbed run itself is the bench's)."""
from __future__ import annotations

import pytest

from bench_module import load_bench

bench = load_bench("rm_failover")

NM1 = """\
2026-11-29 00:01:02 INFO nodemanager.container_manager: launched container_e1_1_0001_01_000001 pid 101 (mem)
2026-11-29 00:01:03 INFO nodemanager.container_manager: launched container_e1_1_0001_01_000002 pid 102 (mem)
"""
NM2 = """\
2026-11-29 00:01:04 INFO nodemanager.container_manager: launched container_e1_1_0001_01_000003 pid 201 (mem)
2026-11-29 00:02:00 INFO nodemanager.container_manager: launched container_e2_1_0001_02_000001 pid 202 (mem)
"""


def test_distinct_ids_across_terms_are_no_duplicates() -> None:
    assert bench.duplicate_container_ids([NM1, NM2]) == (0, [], 4)


def test_an_id_launched_on_two_nodes_or_refused_as_already_started_is_counted_once() -> None:
    again = NM2 + "x INFO launched container_e1_1_0001_01_000002 pid 203 (mem)\n"
    refused = "x WARNING container container_e1_1_0001_01_000003 was already started on this node\n"
    count, ids, launched = bench.duplicate_container_ids([NM1, again, refused])
    assert launched == 4
    assert count == 2
    assert ids == ["container_e1_1_0001_01_000002", "container_e1_1_0001_01_000003"]


def test_spread_gives_median_min_max_and_values() -> None:
    s = bench.spread([3.0, 1.0, 2.5])
    assert s == {"median": 2.5, "min": 1.0, "max": 3.0, "values": [3.0, 1.0, 2.5]}


def test_new_terms_counts_epoch_increments_and_refuses_a_counter_that_went_back() -> None:
    assert bench.new_terms(4, 4) == 0
    assert bench.new_terms(4, 6) == 2
    with pytest.raises(ValueError, match="went back"):
        bench.new_terms(5, 3)
