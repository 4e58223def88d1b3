"""The localizer's cache bookkeeping, pure: which resources a node holds, who uses them, what goes.

No I/O and no clock: the localizer (nodemanager.localizer) asks `acquire` before it fetches a
resource and tells `fetched` / `fetch_failed` / `release` / `drop_app` what happened; each answer
says what to do -- use the entry, wait for the fetch already running, fetch it, or delete these
entries. That keeps "download once", reference counts and eviction testable without files.

Scopes are YARN's visibilities: PUBLIC entries are shared by the whole node, PRIVATE ones by one
user's containers, APPLICATION ones by one app's containers (and dropped when the app finishes on
the node). PUBLIC and PRIVATE together are bounded (`bound_bytes`, YARN's
`yarn.nodemanager.localizer.cache.target-size-mb`): over it, the least recently released entries
that no container uses are evicted. Entries in use are never evicted, so the cache can sit over its
bound while they run.
"""
from __future__ import annotations

import enum
import hashlib
from dataclasses import dataclass, field
from typing import Optional

from protocol.local_resources import LocalResource, ResourceType, Visibility


@dataclass(frozen=True)
class CacheKey:
    """One cached resource: the same URL at the same size and mtime, unpacked the same way, in one
    scope (`owner` is "" for PUBLIC, the user for PRIVATE, the app id for APPLICATION)."""

    scope: Visibility
    owner: str
    resource: str
    type: ResourceType
    pattern: str
    size: int
    timestamp: int

    @classmethod
    def of(cls, res: LocalResource, user: str, app_id: str) -> "CacheKey":
        owner = {"PUBLIC": "", "PRIVATE": user, "APPLICATION": app_id}[res.visibility]
        return cls(res.visibility, owner, res.resource, res.type, res.pattern, res.size, res.timestamp)

    def digest(self) -> str:
        """The entry's directory name in its scope's cache (stable across NM restarts)."""
        text = "\0".join((self.resource, self.type, self.pattern, str(self.size), str(self.timestamp)))
        return hashlib.sha256(text.encode()).hexdigest()[:24]

    @property
    def bounded(self) -> bool:
        return self.scope != "APPLICATION"


class EntryState(str, enum.Enum):
    FETCHING = "FETCHING"
    READY = "READY"


class Acquired(str, enum.Enum):
    """What the caller of `acquire` does next."""

    HIT = "HIT"          # the entry is on the node: link it
    WAIT = "WAIT"        # another request is fetching it: wait for that fetch
    FETCH = "FETCH"      # nobody has it: fetch it, then call `fetched` or `fetch_failed`


@dataclass
class Entry:
    key: CacheKey
    state: EntryState
    refs: int = 0
    size_bytes: int = 0
    last_used: int = 0       # a sequence number: higher = used more recently


@dataclass
class CacheBook:
    """The bookkeeping itself (see the module doc)."""

    bound_bytes: int
    entries: dict[CacheKey, Entry] = field(default_factory=dict)
    _tick: int = 0

    def _next_tick(self) -> int:
        self._tick += 1
        return self._tick

    def acquire(self, key: CacheKey) -> Acquired:
        """One more user of `key`. A failed fetch drops every user with the entry, so a caller that
        got WAIT or FETCH and then saw the fetch fail holds nothing and must not `release`."""
        e = self.entries.get(key)
        if e is None:
            self.entries[key] = Entry(key, EntryState.FETCHING, refs=1, last_used=self._next_tick())
            return Acquired.FETCH
        e.refs += 1
        e.last_used = self._next_tick()
        return Acquired.HIT if e.state is EntryState.READY else Acquired.WAIT

    def fetched(self, key: CacheKey, size_bytes: int) -> list[CacheKey]:
        """The fetch of `key` finished; returns the entries to delete to get back under the bound."""
        e = self.entries[key]
        e.state, e.size_bytes = EntryState.READY, size_bytes
        return self._evict()

    def fetch_failed(self, key: CacheKey) -> None:
        """The fetch of `key` failed: the entry goes, with every waiter's reference."""
        self.entries.pop(key, None)

    def restore(self, key: CacheKey, size_bytes: int) -> None:
        """An entry found complete on disk at start-up (nobody uses it yet)."""
        self.entries[key] = Entry(key, EntryState.READY, 0, size_bytes, self._next_tick())

    def pin(self, key: CacheKey) -> bool:
        """A container found running at start-up uses `key` (a restored entry); False if unknown."""
        e = self.entries.get(key)
        if e is None:
            return False
        e.refs += 1
        return True

    def release(self, key: CacheKey) -> list[CacheKey]:
        """A container that used `key` is done; returns the entries to delete (see `fetched`)."""
        e = self.entries.get(key)
        if e is not None and e.refs > 0:
            e.refs -= 1
            e.last_used = self._next_tick()
        return self._evict()

    def drop_app(self, app_id: str) -> list[CacheKey]:
        """The app finished on this node: its APPLICATION entries go, used or not (its containers
        were stopped first)."""
        gone = [k for k in self.entries if k.scope == "APPLICATION" and k.owner == app_id]
        for k in gone:
            del self.entries[k]
        return gone

    def bounded_bytes(self) -> int:
        """What the PUBLIC and PRIVATE entries hold (what the bound applies to)."""
        return sum(e.size_bytes for e in self.entries.values() if e.key.bounded)

    def _evict(self) -> list[CacheKey]:
        used = self.bounded_bytes()
        if used <= self.bound_bytes:
            return []
        idle = sorted((e for e in self.entries.values()
                       if e.key.bounded and e.refs == 0 and e.state is EntryState.READY),
                      key=lambda e: e.last_used)
        gone: list[CacheKey] = []
        for e in idle:
            if used <= self.bound_bytes:
                break
            del self.entries[e.key]
            used -= e.size_bytes
            gone.append(e.key)
        return gone

    def get(self, key: CacheKey) -> Optional[Entry]:
        return self.entries.get(key)


__all__ = ["Acquired", "CacheBook", "CacheKey", "Entry", "EntryState"]
