"""bench/optimus_sim.py and bench/optimus_prior_effect.py: a seed's JCT gain covers only the jobs
both runs finished, never each run's own finished-jobs mean."""
from __future__ import annotations

from typing import Optional

from bench_module import load_bench

optimus_sim = load_bench("optimus_sim")
prior_effect = load_bench("optimus_prior_effect")


def jobs(*jcts: Optional[float]) -> list[tuple[str, Optional[float]]]:
    return [(f"j{i}", j) for i, j in enumerate(jcts)]


# The baseline finished every job; the new run lost its two long ones. Each run's own mean
# (550 s over 100 s) would claim a 5.5x gain.
BASE = jobs(100.0, 100.0, 1000.0, 1000.0)
LOST = jobs(100.0, 100.0, None, None)


def test_optimus_sims_gain_leaves_jobs_one_run_lost_out_of_both_means() -> None:
    seeds = [{"drf": BASE, "optimus": LOST}, {"drf": jobs(200.0, 400.0), "optimus": jobs(100.0, 200.0)},
             {"drf": jobs(None), "optimus": jobs(5.0)}]
    assert optimus_sim.jct_gains(seeds, "drf", "optimus") == [1.0, 2.0, None]
    assert optimus_sim.jobs_in_both(seeds, "drf", "optimus") == [2, 2, 0]


def test_optimus_prior_effects_ratios_cover_the_jobs_both_runs_finished() -> None:
    assert prior_effect.ratios([BASE, jobs(300.0)], [LOST, jobs(100.0)]) == [1.0, 3.0]
    assert prior_effect.ratios([jobs(None)], [jobs(1.0)]) == [None]
    sp = prior_effect.spread([1.0, None, 3.0])
    assert sp == {"median": 2.0, "min": 1.0, "max": 3.0, "n": 2}
    assert prior_effect.spread([None])["n"] == 0

