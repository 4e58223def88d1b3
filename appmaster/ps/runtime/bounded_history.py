"""A history the PS AM serves (shape changes, EPS ops, directives, pauses) that keeps its newest
entries only, and counts every one ever appended.

A job trains for days under a reshaping policy: its status (served on every poll) and its
checkpoints' job record carried every change it ever made. Readers that want "what came since"
use the running count (`total`, `since`), not the list's length, which stops growing at the limit.
"""
from __future__ import annotations

from typing import Iterable, TypeVar

T = TypeVar("T")


class BoundedHistory(list[T]):
    """A list of at most `limit` items, the newest; `total` counts every item ever appended (a
    history restored from a record counts the items it holds)."""

    def __init__(self, limit: int, items: Iterable[T] = ()) -> None:
        super().__init__(items)
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        self.limit = limit
        self.total = len(self)
        self._trim()

    def append(self, item: T) -> None:
        super().append(item)
        self.total += 1
        self._trim()

    def since(self, total_before: int) -> list[T]:
        """The items appended after the history had `total_before` (those still kept)."""
        n = self.total - total_before
        return list(self[-n:]) if n > 0 else []

    def _trim(self) -> None:
        if len(self) > self.limit:
            del self[:len(self) - self.limit]
