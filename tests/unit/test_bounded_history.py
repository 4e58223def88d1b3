"""The PS AM's histories keep their newest entries and count all of them: a reader asking for what
came since uses the count, which keeps growing where the list's length stops at the limit."""
from __future__ import annotations

import msgspec
import pytest

from appmaster.ps.runtime.bounded_history import BoundedHistory
from elastane_cli.ps_scale_command import changes_made
from protocol.ps_status import PsStatus
from protocol.shape_history import SuspendChange


def test_the_newest_are_kept_every_one_is_counted_and_since_finds_the_new_ones() -> None:
    h: BoundedHistory[int] = BoundedHistory(3)
    for i in range(5):
        h.append(i)
    assert list(h) == [2, 3, 4] and h.total == 5
    before = h.total
    h.append(5)
    h.append(6)
    assert h.since(before) == [5, 6] and list(h) == [4, 5, 6]      # len stayed 3: a length cursor saw nothing
    assert h.since(h.total) == [] and h.since(0) == [4, 5, 6]
    restored = BoundedHistory(3, range(10))                           # from a checkpoint's record
    assert list(restored) == [7, 8, 9] and restored.total == 10
    assert msgspec.json.encode(list(h)) == b"[4,5,6]"
    with pytest.raises(ValueError, match="limit"):
        BoundedHistory(0)


def test_ps_scale_counts_changes_by_the_ams_count_or_an_older_ams_history() -> None:
    change = SuspendChange(op="pause", time=1.0, seconds=0.5, ok=True, epoch=3, clock=0, objective_before=0.5)
    assert changes_made(PsStatus(shape_history=[change] * 100, shape_changes=250)) == 250
    assert changes_made(PsStatus(shape_history=[change] * 2)) == 2      # an AM from before the count
