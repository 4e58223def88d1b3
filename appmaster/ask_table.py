"""The AM's YARN-style ask table: outstanding container requests per ask_id (pure, no I/O).

Each row says "I still want `count` containers of this shape" (protocol.internal_api.ResourceAsk).
The count is absolute, not a delta, so the whole table can be sent on every heartbeat and a lost
reply is harmless. Containers that arrive decrement their row; a row that reaches zero is sent once
more (so the RM forgets it) and then dropped.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from protocol.internal_api import AllocatedContainer, ResourceAsk
from protocol.records import Resource
from protocol.errors import ProtocolError


class AskError(ProtocolError, ValueError):
    """An ask that makes no sense (negative count or resource, unknown ask_id)."""


@dataclass
class _Row:
    ask: ResourceAsk
    dirty: bool = True          # changed since the RM last acknowledged it


@dataclass
class AskTable:
    """Outstanding asks of one attempt; ask ids are allocated by the table."""

    _rows: dict[int, _Row] = field(default_factory=dict)
    _next_id: int = 1

    def add(self, count: int, resource: Resource, *, priority: int = 0, nodes: list[str] | None = None,
            relax_locality: bool = True, tag: str = "") -> int:
        """Ask for `count` more containers of `resource`; returns the new row's ask_id."""
        if count <= 0:
            raise AskError(f"count must be positive, got {count}")
        if resource.memory <= 0 or resource.vcores <= 0:
            raise AskError(f"resource must have positive memory and vCores, got {resource.to_json()}")
        ask_id = self._next_id
        self._next_id += 1
        self._rows[ask_id] = _Row(ResourceAsk(ask_id=ask_id, count=count, resource=resource,
                                              priority=priority, nodes=list(nodes or []),
                                              relax_locality=relax_locality, tag=tag))
        return ask_id

    def set_count(self, ask_id: int, count: int) -> None:
        """Replace the outstanding count of a row (0 cancels it)."""
        if count < 0:
            raise AskError(f"count must be >= 0, got {count}")
        row = self._rows.get(ask_id)
        if row is None:
            raise AskError(f"unknown ask_id {ask_id}")
        row.ask = _with_count(row.ask, count)
        row.dirty = True

    def cancel(self, ask_id: int) -> None:
        self.set_count(ask_id, 0)

    def outstanding(self, ask_id: int | None = None) -> int:
        """Containers still wanted for one row, or for all rows."""
        if ask_id is not None:
            row = self._rows.get(ask_id)
            return row.ask.count if row else 0
        return sum(r.ask.count for r in self._rows.values())

    @property
    def pending(self) -> bool:
        return self.outstanding() > 0

    def on_allocated(self, container: AllocatedContainer) -> bool:
        """Account for a container the RM granted. False if no row wanted it (a surplus container)."""
        row = self._rows.get(container.ask_id)
        if row is None or row.ask.count <= 0:
            return False
        row.ask = _with_count(row.ask, row.ask.count - 1)
        # No need to mark dirty: the RM decremented its copy when it granted the container.
        return True

    def to_send(self) -> list[ResourceAsk]:
        """The rows for the next allocate request: every live row and every not yet acknowledged zero."""
        return [r.ask for r in self._rows.values() if r.ask.count > 0 or r.dirty]

    def acknowledge(self, sent: list[ResourceAsk]) -> None:
        """The RM answered a request carrying `sent`: drop zero rows it has now seen."""
        for ask in sent:
            row = self._rows.get(ask.ask_id)
            if row is None:
                continue
            if row.ask == ask:
                row.dirty = False
            if row.ask.count == 0 and not row.dirty:
                del self._rows[ask.ask_id]

    def mark_all_dirty(self) -> None:
        """After an RM resync every row must be sent again."""
        for r in self._rows.values():
            r.dirty = True

    def rows(self) -> list[ResourceAsk]:
        return [r.ask for r in self._rows.values()]


def _with_count(ask: ResourceAsk, count: int) -> ResourceAsk:
    return ResourceAsk(ask_id=ask.ask_id, count=count, resource=ask.resource, priority=ask.priority,
                       nodes=list(ask.nodes), relax_locality=ask.relax_locality, tag=ask.tag)
