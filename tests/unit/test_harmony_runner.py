"""The Harmony runner in the training pipeline: a slot around every subtask, the (de)serialization
of pulls and pushes outside the network slot, a yielding secondary holding its transfer back, the
same trajectory as the default runner, and two jobs' COMP never overlapping through a real arbiter."""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest

from nodemanager.arbiter import overlapping_cpu_grants
from nodemanager.arbiter_server import ArbiterServer, socket_path
from protocol import container_env as cenv
from protocol.arbiter_wire import Role, SlotKind, name_hash
from psruntime.apps.base import StepContext
from psruntime.apps.registry import create_app
from psruntime.arbiter_client import ArbiterClient, Grant
from psruntime.harmony_runner import HarmonyRunner, from_environment
from psruntime.store.store_client import StoreClient
from psruntime.training_pipeline import (Subtask, TrainingPipeline, init_blocks, init_model, pull_key_values,
                                         pull_through)
from polling import async_wait_until
from store_cluster import executor_cluster

NUM_BLOCKS = 8


class FakeArbiter:
    """Stands in for ArbiterClient: grants at once (network grants as `comm_role`), and notes
    every acquire / release / busy change in `events`."""

    connected = True

    def __init__(self, comm_role: Role = Role.PRIMARY, yielding: bool = False) -> None:
        self.comm_role = comm_role
        self.yielding = yielding
        self.events: list[tuple[str, Any]] = []
        self.held: dict[int, Grant] = {}
        self.threads: list[tuple[SlotKind, int]] = []
        self.next_id = 0

    async def acquire(self, kind: SlotKind, threads: int = 1) -> Grant:
        self.next_id += 1
        self.threads.append((kind, threads))
        role = Role.CPU if kind is SlotKind.CPU else self.comm_role
        g = Grant(self.next_id, kind, role, self.yielding and role is Role.SECONDARY)
        self.held[g.request_id] = g
        self.events.append(("acquire", kind))
        return g

    def release(self, grant: Grant) -> None:
        del self.held[grant.request_id]
        self.events.append(("release", grant.kind))

    def set_busy(self, grant: Grant, busy: bool) -> None:
        self.events.append(("busy" if busy else "idle", grant.kind))

    def holds(self, kind: SlotKind) -> bool:
        return any(g.kind is kind for g in self.held.values())

    async def close(self) -> None:
        pass


class WatchedStore(StoreClient):
    """A StoreClient that notes, for each encode / decode step, whether a network slot was held."""

    arbiter: FakeArbiter

    def _note(self, step: str) -> None:
        self.steps.append((step, self.arbiter.holds(SlotKind.COMM)))

    def prepare_pull(self, *a: Any, **k: Any) -> Any:
        self._note("prepare_pull")
        return super().prepare_pull(*a, **k)

    async def finish_pull(self, *a: Any, **k: Any) -> Any:
        self._note("finish_pull")
        return await super().finish_pull(*a, **k)

    def prepare_push(self, *a: Any, **k: Any) -> Any:
        self._note("prepare_push")
        return super().prepare_push(*a, **k)


@pytest.fixture
async def cluster() -> AsyncIterator[Any]:
    async with executor_cluster(2, NUM_BLOCKS) as c:
        yield c


async def train(store: StoreClient, pipeline: TrainingPipeline, epochs: int = 2) -> np.ndarray:
    app = create_app("mlr", preset="tiny")
    await init_model(store, app)
    blocks = app.generate_partition(0, 1).blocks
    await init_blocks(store, app, blocks)
    for epoch in range(epochs):
        await pipeline.run_batches(app, store, blocks, StepContext(epoch, 1, threads=pipeline.comp_threads))
    await pipeline.objective(app, store, blocks)
    return (await pull_key_values(store, app.model_keys(), app.key_length)).values


async def test_every_subtask_holds_its_slot_and_serialization_stays_outside_the_network_slot(cluster) -> None:
    _, ctl, dp = cluster
    fake = FakeArbiter()
    store = WatchedStore(ctl.table, dp)
    store.arbiter, store.steps = fake, []
    runner = HarmonyRunner(fake)  # type: ignore[arg-type]
    pipeline = TrainingPipeline(runner)
    assert pipeline.gate is runner
    pipeline.set_comp_threads(3)        # each COMP asks for 3 cores of the pool, and uses 3 threads
    trained = await train(store, pipeline)
    assert {t for k, t in fake.threads if k is SlotKind.CPU} == {3}
    assert {t for k, t in fake.threads if k is SlotKind.COMM} == {1}
    # Slots are taken and given back in pairs, never two at once (the pipeline is sequential).
    ev = fake.events
    pairs = [e for e in ev if e[0] in ("acquire", "release")]
    assert [e[0] for e in pairs] == ["acquire", "release"] * (len(pairs) // 2)
    assert all(pairs[i][1] is pairs[i + 1][1] for i in range(0, len(pairs), 2))
    assert fake.held == {}
    # One COMP per mini-batch and one per block for the objective.
    batches = pipeline.counters["batches"]
    blocks = len(create_app("mlr", preset="tiny").generate_partition(0, 1).blocks)
    assert sum(1 for e in ev if e == ("acquire", SlotKind.CPU)) == batches + blocks
    # Every transfer told the arbiter once its requests were out.
    assert sum(1 for e in ev if e[0] == "idle") >= 2 * batches
    # Decoding pulled values and encoding pushes ran with no network slot held; only a pull's key
    # routing runs under the grant its batch's PUSH left for it (one grant per COMM phase).
    assert store.steps and not any(held for step, held in store.steps if step != "prepare_pull")
    assert {s for s, _ in store.steps} == {"prepare_pull", "finish_pull", "prepare_push"}
    # Round trips: one CPU grant per COMP; one network grant per PUSH + next PULL (a step's first
    # PULL and the objective's pulls ask anew), so about one per mini-batch, not two.
    comm_asks = sum(1 for e in ev if e == ("acquire", SlotKind.COMM))
    assert runner.comm_reused >= batches - 2 and comm_asks <= batches + blocks + 4
    assert runner.grants[Subtask.PULL.resource] == comm_asks
    assert runner.held_s[Subtask.COMP.resource] > 0.0 and runner.held_s[Subtask.PULL.resource] > 0.0

    # The same seed trains the same model with the default runner and one thread (fresh executors).
    async with executor_cluster(2, NUM_BLOCKS) as (_, ctl2, dp2):
        plain = await train(StoreClient(ctl2.table, dp2), TrainingPipeline())
    np.testing.assert_array_equal(trained, plain)


async def test_a_yielding_secondary_sends_nothing_until_told_to_go_on(cluster) -> None:
    _, ctl, dp = cluster
    fake = FakeArbiter(Role.SECONDARY, yielding=True)
    runner = HarmonyRunner(fake)  # type: ignore[arg-type]
    store = StoreClient(ctl.table, dp)
    app = create_app("mlr", preset="tiny")
    await init_model(store, app)
    sent_before = sum(e.data_requests for e in cluster[0])
    pipeline = TrainingPipeline(runner)
    keys = app.model_keys()[:10]
    pull = asyncio.ensure_future(pull_through(runner, pipeline.gate, store, keys, app.key_length))
    for _ in range(20):
        await asyncio.sleep(0)
    assert not pull.done() and sum(e.data_requests for e in cluster[0]) == sent_before
    (grant,) = fake.held.values()
    grant.set_yielding(False)       # the primary went idle
    kv = await asyncio.wait_for(pull, 5)
    assert kv.values.shape == (10, app.key_length)
    assert ("idle", SlotKind.COMM) in fake.events and fake.held == {}


async def test_runner_comes_only_from_a_harmony_environment(tmp_path) -> None:
    assert await from_environment({}) is None
    assert await from_environment({cenv.ARBITER_SOCKET: "/nowhere"}) is None      # not a Harmony job
    assert await from_environment({cenv.HARMONY: "1"}) is None                     # no arbiter on the node
    server = ArbiterServer(socket_path(str(tmp_path)))
    await server.start()
    try:
        runner = await from_environment({cenv.HARMONY: "1", cenv.ARBITER_SOCKET: server.path,
                                         cenv.APP_ID: "application_1_0001", cenv.CONTAINER_ID: "c1"})
        assert runner is not None
        assert await runner.run(Subtask.COMP, _answer) == 42
        rec = server.arbiter.records()[0]
        assert (rec.role, rec.job, rec.executor) == ("cpu", name_hash("application_1_0001"), name_hash("c1"))
        await runner.close()
    finally:
        await server.stop()


async def _answer() -> int:
    return 42


async def test_two_jobs_through_one_real_arbiter_never_overlap_their_comp(tmp_path) -> None:
    server = ArbiterServer(socket_path(str(tmp_path)))
    await server.start()
    clients = [ArbiterClient(server.path, f"application_1_000{i}", f"c{i}") for i in (1, 2)]
    try:
        for c in clients:
            await c.connect()
        async with executor_cluster(2, NUM_BLOCKS) as (_, ctl1, dp1), \
                executor_cluster(2, NUM_BLOCKS) as (_, ctl2, dp2):
            stores = [StoreClient(ctl1.table, dp1), StoreClient(ctl2.table, dp2)]
            await asyncio.gather(*(train(s, TrainingPipeline(HarmonyRunner(c)), epochs=1)
                                   for s, c in zip(stores, clients)))
        records = server.arbiter.records()
        cpu_jobs = {r.job for r in records if r.role == "cpu"}
        assert cpu_jobs == {name_hash("application_1_0001"), name_hash("application_1_0002")}
        assert all(r.released_at is not None for r in records)
        assert overlapping_cpu_grants(records) == []
    finally:
        for c in clients:
            await c.close()
        await server.stop()


async def test_runner_reconnects_once_its_arbiter_is_back(tmp_path) -> None:
    """An NM restart (containers re-adopted) closes the socket; the next subtask reconnects."""
    path = socket_path(str(tmp_path))
    server = ArbiterServer(path)
    await server.start()
    client = ArbiterClient(path, "application_1_0001", "c1")
    await client.connect()
    runner = HarmonyRunner(client)
    try:
        assert await runner.run(Subtask.COMP, _answer) == 42
        await server.stop()
        for _ in range(100):
            if not client.connected:
                break
            await asyncio.sleep(0)
        assert not client.connected
        server = ArbiterServer(path)
        await server.start()
        assert await runner.run(Subtask.PULL, _answer) == 42
        assert [r.role for r in server.arbiter.records()] == ["primary"]
    finally:
        await runner.close()
        await server.stop()


async def test_a_comp_whose_caller_is_cancelled_keeps_its_cores_until_it_ends() -> None:
    """The clock running a COMP is cancelled (its AM's connection dropped) while the COMP goes on
    in its thread: the CPU grant is held until the COMP ends, then given back -- released at the
    cancel, the arbiter handed the cores to another job's COMP while this one still used them."""
    import threading  # noqa: PLC0415
    from concurrent.futures import ThreadPoolExecutor  # noqa: PLC0415

    arbiter = FakeArbiter()
    runner = HarmonyRunner(arbiter)  # type: ignore[arg-type]
    started, finish = threading.Event(), threading.Event()
    pool = ThreadPoolExecutor(max_workers=1)

    def comp() -> int:
        started.set()
        assert finish.wait(10)
        return 7

    async def work() -> int:
        return await asyncio.get_running_loop().run_in_executor(pool, comp)
    run = asyncio.ensure_future(runner.run(Subtask.COMP, work))
    await async_wait_until(started.is_set, what="the COMP running in its thread")
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    assert arbiter.holds(SlotKind.CPU)      # the COMP still runs on its cores
    finish.set()
    await async_wait_until(lambda: not arbiter.holds(SlotKind.CPU), what="the cores given back")
    assert arbiter.events[-1] == ("release", SlotKind.CPU)
    pool.shutdown()
