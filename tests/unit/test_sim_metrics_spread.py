"""sim/metrics.py's figures over seeds carry how many seeds gave one (`_n`), so a median over one
of five seeds is visible as such; and a JCT gain covers the jobs both runs finished."""
from __future__ import annotations

import sys

from bench_module import BENCH, load_bench
from sim.metrics import Spread, jct_gain_in_both, spread_keys


def test_spread_keys_say_how_many_seeds_gave_a_value() -> None:
    sp = Spread.of([None, None, 2.0, None, None])
    assert sp is not None and sp.keys("g") == {"g": 2.0, "g_min": 2.0, "g_max": 2.0, "g_n": 1}
    assert spread_keys("g", [1.0, None, 3.0]) == {"g": 2.0, "g_min": 1.0, "g_max": 3.0, "g_n": 2}
    assert spread_keys("g", [None, None]) == {"g": None, "g_min": None, "g_max": None, "g_n": 0}


def test_policies_sims_aggregate_carries_the_count() -> None:
    # bench/policies_sim.py imports bench/support/ as a script does: from its own folder
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    policies_sim = load_bench("policies_sim")
    per_seed = [{"gains": {"g": 1.5}}] + [{"gains": {"g": None}}] * 4
    assert policies_sim.aggregate(per_seed, ["g"]) == {"g": 1.5, "g_min": 1.5, "g_max": 1.5, "g_n": 1}


def test_jct_gain_in_both_leaves_jobs_either_run_lost_out() -> None:
    base = [("a", 100.0), ("b", 100.0), ("c", 1000.0), ("d", 1000.0)]
    new = [("a", 100.0), ("b", 100.0), ("c", None), ("d", None)]
    assert jct_gain_in_both(base, new) == 1.0                 # not 550 / 100 = 5.5
    assert jct_gain_in_both([("a", None)], [("a", 1.0)]) is None
