"""The Harmony subtask runner: every COMP / COMM subtask holds a slot of its node's arbiter.

`HarmonyRunner` implements `training_pipeline.SubtaskRunner`: before `await work()` it takes a slot
of the subtask's resource (CPU for COMP: `comp_threads` cores of the node's pool; the network for
PULL / PUSH) from the arbiter and gives it back after, whatever way the work ends. It counts the
seconds waited for each grant apart from the seconds held (`WaitCounter`): the profile the RM's
Harmony policy reads is the held time. It is also the pipeline's `TransferGate`: a pull or push
sends its per-owner pieces only when `wait_turn()` lets it (a secondary network grant waits while
the arbiter says yield), and `sent()` tells the arbiter that this transfer's requests are all out
(it only waits on servers now, so a secondary may go on).

Executors use it only when their launch environment says Harmony runs the job
(`protocol.container_env.HARMONY` = "1" and `ARBITER_SOCKET`: `from_environment`); any other job
keeps the pipeline's ImmediateRunner and never touches the arbiter.
"""
from __future__ import annotations

import asyncio
import functools
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Optional, TypeVar

from protocol import container_env as cenv
from protocol.arbiter_wire import SlotKind

from .arbiter_client import ArbiterClient, Grant
from .training_pipeline import Resource, Subtask

T = TypeVar("T")
_SLOT_OF = {Resource.CPU: SlotKind.CPU, Resource.COMM: SlotKind.COMM}


class HarmonyRunner:
    """Runs each subtask while holding the arbiter's slot for it; counts the time spent waiting.

    One network grant per COMM phase: a PUSH's grant is not given back at once but at the end of
    the event-loop turn, and a PULL (or the step's flush) that starts in the same turn -- the
    pipeline goes from a batch's PUSH to the next batch's PULL without waiting on anything --
    takes it over (told BUSY again) instead of asking anew. So a mini-batch costs two arbiter
    round trips (its COMP's grant, and its PUSH + the next PULL's), not three, and the paper's
    iteration of one COMP and one COMM is what the arbiter sees. The price: the next pull's key
    routing (`prepare_pull`: keys only, no values) runs under that grant; decoding a pull's
    values and encoding a push's still never hold a network slot (a PULL's grant is given back at
    once: the decode and the COMP follow it). Anything else first gives a lingering grant back.
    """

    def __init__(self, client: ArbiterClient) -> None:
        self.client = client
        self.comp_threads = 1      # cores a COMP asks of the node's CPU pool (the pipeline sets it)
        self._comm: Optional[Grant] = None
        self._linger: Optional[Grant] = None                 # a network grant kept to the end of this turn
        self._linger_release: Optional[asyncio.Handle] = None
        self.wait_s = {Resource.CPU: 0.0, Resource.COMM: 0.0}   # seconds spent waiting for slots
        self.held_s = {Resource.CPU: 0.0, Resource.COMM: 0.0}   # seconds the subtasks ran, holding them
        self.grants = {Resource.CPU: 0, Resource.COMM: 0}     # round trips to the arbiter
        self.comm_reused = 0                                  # COMM subtasks that took over a lingering grant

    async def run(self, kind: Subtask, work: Callable[[], Awaitable[T]]) -> T:
        resource = kind.resource
        t0 = time.perf_counter()
        grant = self._take_linger() if resource is Resource.COMM else None
        if grant is not None:
            self.client.set_busy(grant, True)        # transferring again: a secondary yields
            self.comm_reused += 1
        else:
            self._release_linger()
            if not self.client.connected:
                # The arbiter went away (its NM restarted and re-adopted this container): reconnect
                # once; if it is still gone, the subtask fails with ArbiterUnavailable.
                await self.client.connect()
            slot = _SLOT_OF[resource]
            grant = await self.client.acquire(slot, self.comp_threads if slot is SlotKind.CPU else 1)
            self.grants[resource] += 1
        t1 = time.perf_counter()
        self.wait_s[resource] += t1 - t0
        if resource is Resource.COMM:
            self._comm = grant
        ok = handed_on = False
        try:
            if resource is Resource.CPU:
                # A COMP runs on in its thread when its caller is cancelled (a thread cannot be
                # interrupted; the data plane cancels a clock whose AM connection drops): its cores
                # stay held until it ends -- given back at once, the arbiter handed them to another
                # job's COMP while this one still ran on them.
                task = asyncio.ensure_future(work())
                try:
                    out = await asyncio.shield(task)
                except asyncio.CancelledError:
                    if not task.done():
                        handed_on = True
                        task.add_done_callback(functools.partial(self._comp_ended, grant))
                    raise
            else:
                out = await work()
            ok = True
            return out
        finally:
            if self._comm is grant:
                self._comm = None
            self.held_s[resource] += time.perf_counter() - t1
            if ok and kind is Subtask.PUSH and self.client.connected:
                self._linger = grant
                self._linger_release = asyncio.get_running_loop().call_soon(self._release_linger)
            elif not handed_on:
                self.client.release(grant)

    def _comp_ended(self, grant: Grant, task: "asyncio.Future[object]") -> None:
        """A COMP whose caller was cancelled has ended: its cores go back now."""
        if not task.cancelled():
            task.exception()        # retrieved: what it raised went with its cancelled caller
        self.client.release(grant)

    def _take_linger(self) -> Optional[Grant]:
        g, self._linger = self._linger, None
        if self._linger_release is not None:
            self._linger_release.cancel()
            self._linger_release = None
        return g if g is not None and self.client.connected else None

    def _release_linger(self) -> None:
        g = self._take_linger()
        if g is not None:
            self.client.release(g)

    # -- TransferGate ------------------------------------------------------------------------
    async def wait_turn(self) -> None:
        g = self._comm
        if g is not None:
            await g.wait_turn()

    def sent(self) -> None:
        g = self._comm
        if g is not None:
            self.client.set_busy(g, False)

    async def close(self) -> None:
        self._release_linger()
        await self.client.close()


def harmony_enabled(env: Mapping[str, str]) -> bool:
    """Whether the launch environment says Harmony runs this job (and names the arbiter)."""
    return env.get(cenv.HARMONY) == "1" and bool(env.get(cenv.ARBITER_SOCKET))


async def from_environment(env: Mapping[str, str] = os.environ) -> Optional[HarmonyRunner]:
    """A connected HarmonyRunner for a Harmony job's executor; None for any other job."""
    if not harmony_enabled(env):
        return None
    client = ArbiterClient(env[cenv.ARBITER_SOCKET], env.get(cenv.APP_ID, ""), env.get(cenv.CONTAINER_ID, ""))
    await client.connect()
    return HarmonyRunner(client)
