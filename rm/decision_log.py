"""A small bounded log of the directives the policy runner changed, for operators (web UI, REST).

`apply_decision` appends one record per directive it renumbers: when, which app, the shape,
placement, group, run state and the policy's reason. Only the most recent `MAX_DECISIONS` are
kept (in memory: the log explains recent behaviour, it is not an audit trail).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, Iterator, Optional

from protocol.internal_api import ShapeDirective

MAX_DECISIONS = 200


@dataclass(frozen=True)
class DecisionRecord:
    """One changed directive: app `app_id` was told `directive` at RM time `t` (epoch seconds)."""

    t: float
    app_id: str
    directive: ShapeDirective

    def to_json(self) -> dict[str, Any]:
        """The record in the REST API's style (time in ms since the epoch, camelCase names)."""
        d = self.directive
        return {"time": int(self.t * 1000), "appId": self.app_id, "version": d.version,
                "workers": d.workers, "servers": d.servers, "nodes": list(d.nodes),
                "placement": [{"node": p.node, "workers": p.workers, "servers": p.servers} for p in d.placement],
                "group": d.group, "runState": d.run_state.value, "reason": d.reason}


class DecisionLog:
    """The most recent directive changes, oldest first; bounded."""

    def __init__(self, max_records: int = MAX_DECISIONS):
        if max_records < 1:
            raise ValueError("max_records must be >= 1")
        self._records: deque[DecisionRecord] = deque(maxlen=max_records)

    def record(self, t: float, app_id: str, directive: ShapeDirective) -> None:
        """Add one changed directive."""
        self._records.append(DecisionRecord(t, app_id, directive))

    def for_app(self, app_id: str) -> list[DecisionRecord]:
        """The kept records of one app, oldest first."""
        return [r for r in self._records if r.app_id == app_id]

    def recent(self, limit: Optional[int] = None) -> list[DecisionRecord]:
        """The newest `limit` records (all when None), newest first."""
        out = list(reversed(self._records))
        return out if limit is None else out[:limit]

    def __iter__(self) -> Iterator[DecisionRecord]:
        return iter(list(self._records))

    def __len__(self) -> int:
        return len(self._records)


__all__ = ["DecisionLog", "DecisionRecord", "MAX_DECISIONS"]
