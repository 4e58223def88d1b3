"""The active RM's etcd compaction schedule (rm/ha/compaction.py): what it compacts to, and when."""
from __future__ import annotations

import pytest

from rm.ha.compaction import CompactionSchedule


def test_it_compacts_to_the_revision_seen_an_interval_before_and_never_backwards() -> None:
    s = CompactionSchedule(300.0)
    assert s.observe(0.0, 10) is None          # the first sight only marks
    assert s.observe(120.0, 50) is None        # within the interval
    assert s.observe(300.0, 90) == 10          # an interval on: up to what it saw then, not 90
    assert s.observe(450.0, 95) is None
    assert s.observe(600.0, 140) == 90         # the last interval's history (90..140) stays
    assert s.observe(900.0, 140) == 140        # nothing written since: up to it
    assert s.observe(1200.0, 140) is None      # already compacted to it: not again
    assert s.compacted == 140


def test_a_new_term_starts_its_interval_afresh_and_zero_is_off() -> None:
    s = CompactionSchedule(60.0)
    s.observe(0.0, 5)
    s.reset()
    assert s.observe(61.0, 30) is None         # marked anew at 61: the old mark is not used
    assert s.observe(121.0, 40) == 30
    off = CompactionSchedule(0.0)
    assert all(off.observe(t, 100 + int(t)) is None for t in (0.0, 1e3, 1e6))
    with pytest.raises(ValueError, match="interval_s"):
        CompactionSchedule(-1.0)
