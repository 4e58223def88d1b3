"""The localizer's shared fetches (nodemanager.localizer): a container that stops waiting leaves the
fetch to the others, and a fetch given up never touches the entry a newer fetch of the same resource
made, whatever its thread does afterwards.

The fetch itself is stood in for by a function that blocks on a test's gate in a localizer thread
(as a slow source would), so each test decides when a fetch ends; no timeouts."""
from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path
from typing import Any, Callable, Optional

import pytest

from nodemanager import localizer as L
from nodemanager.localizer_cache import EntryState
from polling import async_wait_until
from protocol.config import NMConfig
from protocol.local_resources import LocalResource


class GatedFetch:
    """Stands in for `localizer.fetch`: call n writes the resource with `content(n)` and then waits
    for `gates[n]` (set by the test) -- ignoring its cancel meanwhile when `past_checks`, as a fetch
    past its last cancel check does (the last archive member written, a slow last read)."""

    def __init__(self, past_checks: bool) -> None:
        self.past_checks = past_checks
        self.started: list[int] = []
        self.gates: dict[int, threading.Event] = {}
        self._lock = threading.Lock()

    def gate(self, n: int) -> threading.Event:
        with self._lock:
            return self.gates.setdefault(n, threading.Event())

    def release_all(self) -> None:
        with self._lock:
            for g in self.gates.values():
                g.set()
            self.past_checks = False

    def __call__(self, res: LocalResource, target: str, cancel: Optional[threading.Event] = None) -> None:
        with self._lock:
            n = len(self.started) + 1
            self.started.append(n)
        Path(target).write_text(f"fetch {n}")
        gate = self.gate(n)
        while not gate.wait(0.01):
            if cancel is not None and cancel.is_set() and not self.past_checks:
                raise L._Cancelled()


@pytest.fixture
def gated(monkeypatch: pytest.MonkeyPatch) -> Any:
    def make(past_checks: bool) -> GatedFetch:
        g = GatedFetch(past_checks)
        monkeypatch.setattr(L, "fetch", g)
        made.append(g)
        return g
    made: list[GatedFetch] = []
    yield make
    for g in made:          # no localizer thread is left blocked
        g.release_all()


def localizer(tmp_path: Path) -> L.Localizer:
    return L.Localizer(NMConfig(local_dir=str(tmp_path / "local"), localizer_threads=2))


def a_resource(tmp_path: Path) -> dict[str, LocalResource]:
    src = tmp_path / "data.bin"
    src.write_text("source")
    return {"data": LocalResource(resource=str(src), visibility="PUBLIC")}


def counting_entry_threads(loc: L.Localizer) -> list[str]:
    """Wraps the localizer's fetch thread body: the list gets "ok" or the exception's name as each
    thread returns."""
    ended: list[str] = []
    real: Callable[..., int] = loc._fetch_entry

    def wrapped(*args: Any) -> int:
        try:
            size = real(*args)
        except BaseException as e:
            ended.append(type(e).__name__)
            raise
        ended.append("ok")
        return size
    loc._fetch_entry = wrapped      # type: ignore[method-assign]
    return ended


async def test_a_fetch_given_up_never_touches_the_entry_a_newer_fetch_made(tmp_path: Path, gated: Any) -> None:
    fake = gated(past_checks=True)
    loc = localizer(tmp_path)
    ended = counting_entry_threads(loc)
    res = a_resource(tmp_path)
    try:
        first = asyncio.get_running_loop().create_task(loc.localize("c1", "app1", "u", res))
        await async_wait_until(lambda: fake.started == [1], what="the first fetch under way")
        first.cancel()              # its only container stopped waiting: the fetch is given up
        with pytest.raises(asyncio.CancelledError):
            await first
        loc.release("c1")
        assert loc.book.entries == {}       # the next request fetches afresh

        fake.gate(2).set()
        links = await loc.localize("c2", "app1", "u", res)      # the newer fetch, while the first still runs
        path = links["data"]
        assert Path(path).read_text() == "fetch 2"
        [entry] = loc.book.entries.values()
        assert entry.state is EntryState.READY and entry.refs == 1

        fake.gate(1).set()          # the first fetch's thread runs on to its commit
        await async_wait_until(lambda: len(ended) == 2, what="both fetch threads returned")
        assert ended == ["ok", "_Cancelled"]
        # c2's entry is as the newer fetch made it; the first fetch left no temp dir behind.
        assert Path(path).read_text() == "fetch 2" and Path(loc.entry_dir(entry.key) + ".json").exists()
        assert [n for n in os.listdir(loc.scope_dir(entry.key)) if n.startswith(".tmp-")] == []

        links3 = await loc.localize("c3", "app1", "u", res)     # a cache hit, to a file that is there
        assert links3 == links and Path(links3["data"]).read_text() == "fetch 2" and fake.started == [1, 2]
        loc.release("c2")
        loc.release("c3")
        assert entry.refs == 0
    finally:
        fake.release_all()
        loc.close()


async def test_a_container_that_stops_waiting_leaves_the_shared_fetch_to_the_others(
        tmp_path: Path, gated: Any) -> None:
    fake = gated(past_checks=False)
    loc = localizer(tmp_path)
    res = a_resource(tmp_path)
    try:
        first = asyncio.get_running_loop().create_task(loc.localize("c1", "app1", "u", res))
        await async_wait_until(lambda: fake.started == [1], what="the fetch under way")
        second = asyncio.get_running_loop().create_task(loc.localize("c2", "app1", "u", res))
        [entry] = loc.book.entries.values()
        await async_wait_until(lambda: entry.refs == 2, what="the second container waits for the same fetch")
        first.cancel()      # the container that began the fetch is stopped
        with pytest.raises(asyncio.CancelledError):
            await first
        loc.release("c1")
        assert entry.refs == 1 and entry.state is EntryState.FETCHING
        fake.gate(1).set()
        links = await second
        assert Path(links["data"]).read_text() == "fetch 1" and fake.started == [1]
        assert entry.state is EntryState.READY and entry.refs == 1
        loc.release("c2")
        assert entry.refs == 0
    finally:
        fake.release_all()
        loc.close()
