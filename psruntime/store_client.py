"""StoreClient: what workers and the AM use to reach the elastic store over the data plane.

Routes every key by the local ownership table (one batched frame per owner), follows redirects
(learning the new owner, and the whole table when the server's is newer) and re-sends only the
redirected keys, so a request that meets a migration completes transparently and exactly once.

`push` is asynchronous: it writes the frames at once (so a later pull on the same connection is
served after it) and returns; its replies, redirects and errors are handled in the background and
an error is raised by the next call or by `flush()`.
"""
from __future__ import annotations

import asyncio
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from psruntime.dataplane import DataPlaneClient, DataPlaneConnection
from psruntime.frame_codec import Frame
from psruntime.ownership_table import Key, OwnershipTable

MAX_ROUNDS = 200          # a key redirected this often means ownership never converged
FAST_ROUNDS = 3           # redirects re-sent at once; later rounds back off


class StoreClientError(RuntimeError):
    """A store request that could not be completed (no route, too many redirects, remote error)."""


@dataclass
class _Outcome:
    values: dict[Key, np.ndarray] = field(default_factory=dict)
    missing: list[Key] = field(default_factory=list)


class StoreClient:
    """Client of the elastic store; holds a local copy of the ownership table."""

    def __init__(self, table: OwnershipTable, client: DataPlaneClient | None = None) -> None:
        self.table = table.copy()
        self._client = client or DataPlaneClient()
        self._own_client = client is None
        self._pending: set[asyncio.Task[None]] = set()
        self._errors: list[BaseException] = []
        self.redirects_followed = 0

    async def close(self) -> None:
        await self.flush()
        if self._own_client:
            await self._client.close()

    def set_table(self, table: OwnershipTable) -> bool:
        """Adopt a newer table (e.g. from the AM's broadcast); returns whether it was newer."""
        return self.table.replace_if_newer(table)

    # -- public API (Table 3.2 + PS pull/push) ----------------------------------------------
    async def pull(self, keys: Sequence[Key]) -> dict[Key, np.ndarray]:
        """Values of `keys` (one round trip per owner); keys never written are left out."""
        self._raise_pending_error()
        return (await self._run("get", None, list(keys), [])).values

    async def get(self, key: Key) -> np.ndarray | None:
        return (await self.pull([key])).get(key)

    async def put(self, keys: Sequence[Key], values: Sequence[np.ndarray]) -> None:
        self._raise_pending_error()
        await self._run("put", None, list(keys), list(values))

    async def update(self, keys: Sequence[Key], func: str, deltas: Sequence[np.ndarray]) -> None:
        """Apply func(value, delta) at the owners and wait until applied."""
        self._raise_pending_error()
        await self._run("update", func, list(keys), list(deltas))

    async def push(self, keys: Sequence[Key], deltas: Sequence[np.ndarray], func: str = "add") -> None:
        """Send updates without waiting for them to be applied (awaits only socket backpressure).

        Large deltas are sent from the caller's memory, not copied: do not modify them in place
        before flush() (computing fresh arrays, as the apps do, is always safe).
        """
        self._raise_pending_error()
        keys, deltas = list(keys), list(deltas)
        self._check_lengths(keys, deltas)
        first = await self._submit("update", func, keys, deltas, list(range(len(keys))))
        task = asyncio.ensure_future(self._complete("update", func, keys, deltas, first, _Outcome()))
        self._pending.add(task)
        task.add_done_callback(self._push_done)
        for conn in {c for c, _, _ in first}:
            await conn.drain()  # returns at once unless the socket's write buffer is over its mark

    async def flush(self) -> None:
        """Wait for every push to be applied; raise the first error any of them met."""
        while self._pending:
            await asyncio.gather(*list(self._pending), return_exceptions=True)
        self._raise_pending_error()

    # -- internals ---------------------------------------------------------------------------
    def _push_done(self, task: asyncio.Task[None]) -> None:
        self._pending.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self._errors.append(task.exception())  # type: ignore[arg-type]

    def _raise_pending_error(self) -> None:
        if self._errors:
            err, self._errors = self._errors[0], []
            raise StoreClientError(f"an earlier push failed: {err}") from err

    @staticmethod
    def _check_lengths(keys: list[Key], values: list[np.ndarray]) -> None:
        if len(keys) != len(values):
            raise ValueError(f"{len(keys)} keys but {len(values)} values")

    def _route(self, keys: list[Key], idx: list[int]) -> dict[str, list[int]]:
        groups: dict[str, list[int]] = defaultdict(list)
        for i in idx:
            owner = self.table.owner_of(keys[i])
            if not owner:
                raise StoreClientError(f"no owner known for key {keys[i]!r} (block {self.table.block_of(keys[i])})")
            groups[self.table.address_of(owner)].append(i)
        return groups

    async def _submit(self, op: str, func: str | None, keys: list[Key], values: list[np.ndarray],
                      idx: list[int]) -> list[tuple[DataPlaneConnection, list[int], asyncio.Future[Frame]]]:
        sent = []
        for address, group in self._route(keys, idx).items():
            conn = self._client.cached(address) or await self._client.connection(address)
            header: dict[str, Any] = {"op": op, "keys": [keys[i] for i in group], "v": self.table.version}
            if func is not None:
                header["func"] = func
            fut = conn.submit(header, [values[i] for i in group] if values else [])
            sent.append((conn, group, fut))
        return sent

    async def _run(self, op: str, func: str | None, keys: list[Key], values: list[np.ndarray]) -> _Outcome:
        if values:
            self._check_lengths(keys, values)
        if not keys:
            return _Outcome()
        first = await self._submit(op, func, keys, values, list(range(len(keys))))
        out = _Outcome()
        await self._complete(op, func, keys, values, first, out)
        return out

    async def _complete(self, op: str, func: str | None, keys: list[Key], values: list[np.ndarray],
                        sent: list[tuple[DataPlaneConnection, list[int], asyncio.Future[Frame]]],
                        out: _Outcome) -> None:
        for rnd in range(MAX_ROUNDS):
            retry: list[int] = []
            for conn, group, fut in sent:
                try:
                    reply = await fut
                except Exception as e:
                    raise StoreClientError(f"{op} of {len(group)} keys at {conn.address} failed: {e}") from e
                retry += self._absorb(reply, keys, group, out)
            if not retry:
                return
            self.redirects_followed += 1
            if rnd >= FAST_ROUNDS:
                # Ownership is converging through a chain of moves: give the broadcast a moment.
                await asyncio.sleep(min(0.001 * 2 ** (rnd - FAST_ROUNDS), 0.05))
            sent = await self._submit(op, func, keys, values, retry)
        raise StoreClientError(f"{op}: keys still redirected after {MAX_ROUNDS} rounds")

    def _absorb(self, reply: Frame, keys: list[Key], group: list[int], out: _Outcome) -> list[int]:
        """Record a reply; return the indices (from `group`) to re-send after a redirect."""
        h = reply.header
        for k, a in zip(h.get("keys", []), reply.arrays):
            out.values[k] = a
        out.missing += h.get("missing", [])
        if "redirect" not in h:
            return []
        if "table" in h:
            self.table.replace_if_newer(OwnershipTable.from_wire(h["table"]))
        for block, owner, address in h["redirect"]:
            self.table.note_owner(block, owner, address or None)
        redirected = set()
        for k in h.get("redirect_keys", []):
            redirected.add(k)
        return [i for i in group if keys[i] in redirected]
