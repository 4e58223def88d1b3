"""A pipeline subtask runner for tests: runs each subtask at once and notes its kind."""
from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from psruntime.training_pipeline import Subtask


class RecordingRunner:
    """Runs each subtask at once, noting its kind; `after` (if set) is called after each one."""

    def __init__(self, after: Callable[[Subtask], None] | None = None) -> None:
        self.kinds: list[Subtask] = []
        self.after = after

    async def run(self, kind: Subtask, work: Callable[[], Awaitable[Any]]) -> Any:
        self.kinds.append(kind)
        result = await work()
        if self.after is not None:
            self.after(kind)
        return result
