"""The policy's state in the fenced etcd store (rm/ha/etcd_store.py) on a real etcd
(tests/support/etcd_server.py): the active RM's term stores it and the next term loads it back
as written; a deposed term's write of it is refused like any other."""
from __future__ import annotations

import asyncio
from typing import Any

import msgspec
import pytest

import etcd_server as etcdmod
from polling import async_wait_until
from protocol.ha_config import HAConfig
from protocol.records import Resource
from rm.ha.elector import Elector
from rm.ha.etcd_kv import AsyncEtcd, BlockingEtcd, EtcdKeys
from rm.ha.etcd_store import POLICY_PART_BYTES, EtcdStateStore, StoreFenced
from rm.ha.role import HAState
from rm.store import AppRecord, DecommissionEntry, DecommissionRecord, PolicyStateRecord

pytestmark = [pytest.mark.cluster,
              pytest.mark.skipif(etcdmod.unavailable_reason() is not None,
                                 reason=f"no etcd here: {etcdmod.unavailable_reason()}")]


def ha_config(etcd: Any) -> HAConfig:
    return HAConfig(enabled=True, rm_ids=["rm1", "rm2"],
                    rm_addresses={"rm1": "http://127.0.0.1:1", "rm2": "http://127.0.0.1:2"},
                    etcd_endpoints=[etcd.endpoint], lease_s=2.0, etcd_prefix="/test")


def elector(ha: HAConfig, rm_id: str) -> Elector:
    async def active(epoch: int, token: int) -> None:
        return None

    async def standby(reason: str) -> None:
        return None

    return Elector(ha, rm_id, active, standby)


def store_of(ha: HAConfig, e: Elector) -> EtcdStateStore:
    return EtcdStateStore(BlockingEtcd(ha.etcd_targets(), 2.0), EtcdKeys(ha.etcd_prefix), e.role.token, e.fenced)


class TwoTerms:
    """rm1's term and then rm2's on one etcd: `first()` makes rm1 active and gives its store,
    `fail_over()` ends rm1's lease (as if it were cut off) and gives active rm2's store, `close()`
    closes both and stops both electors."""

    def __init__(self, etcd: Any) -> None:
        self.ha = ha_config(etcd)
        self.a, self.b = elector(self.ha, "rm1"), elector(self.ha, "rm2")
        self.stores: list[EtcdStateStore] = []

    async def _active(self, e: Elector, what: str) -> EtcdStateStore:
        e.start()
        await async_wait_until(lambda: e.role.state == HAState.ACTIVE, 20, what)
        self.stores.append(store_of(self.ha, e))
        return self.stores[-1]

    async def first(self) -> EtcdStateStore:
        return await self._active(self.a, "rm1 active")

    async def fail_over(self) -> EtcdStateStore:
        admin = AsyncEtcd(self.ha.etcd_targets(), 2.0)
        await admin.call(lambda c: c.revoke_lease(self.a.lease_id))      # rm1's lease runs out
        return await self._active(self.b, "rm2 active")

    async def close(self) -> None:
        for s in self.stores:
            s.close()
        await self.a.stop()
        await self.b.stop()


async def test_the_next_term_loads_the_policy_state_and_a_deposed_term_cannot_write_it(etcd):
    terms = TwoTerms(etcd)
    a_store = await terms.first()
    assert a_store.load_policy_state() is None
    state = b'{"jobs":["application_1_0001"],"running":["application_1_0001"],"nodes":["n1:1","n2:1"]}'
    a_store.save_policy_state(PolicyStateRecord("dorm", 12.5, ["n1:1", "n2:1"], msgspec.Raw(state)))

    b_store = await terms.fail_over()
    got = b_store.load_policy_state()
    assert got is not None and (got.policy, got.saved_at, got.nodes) == ("dorm", 12.5, ["n1:1", "n2:1"])
    assert got.policy_state == state
    with pytest.raises(StoreFenced):
        a_store.save_policy_state(PolicyStateRecord("dorm", 13.0, [], msgspec.Raw(b"null")))
    assert b_store.load_policy_state() == got
    b_store.save_policy_state(PolicyStateRecord("dorm", 14.0, ["n1:1"]))
    after = b_store.load_policy_state()
    assert after is not None and after.policy_state is None and after.nodes == ["n1:1"]
    await terms.close()


async def test_a_policy_state_larger_than_an_etcd_request_is_stored_in_parts_and_loads_whole(etcd):
    """etcd refuses a request above 1.5 MiB; a state of thousands of jobs' fits is larger. It is
    written in parts and loads back byte for byte in the next term; a smaller one written after
    it replaces it and leaves no parts behind; a larger one again leaves only its own parts."""
    # The payloads are built before the term starts, and the multi-MiB writes run off the event
    # loop: the electors keep their 2 s leases alive on this loop, and a loop held for seconds on
    # a loaded machine let rm1's lease run out before its first part (CI, stop 56).
    jobs = {f"application_1_{i:05d}": {"samples": [[i, j, 0.5 + j / 7] for j in range(40)]} for i in range(6000)}
    big = msgspec.json.encode({"jobs": jobs})
    bigger = msgspec.json.encode({"jobs": jobs, "more": list(range(300_000))})
    assert len(big) > 3 * POLICY_PART_BYTES
    record = PolicyStateRecord("optimus", 20.0, ["n1:1"], msgspec.Raw(big))
    terms = TwoTerms(etcd)
    a_store = await terms.first()
    keys = EtcdKeys(terms.ha.etcd_prefix)
    await asyncio.to_thread(a_store.save_policy_state, record)
    first_parts = a_store.etcd.range_prefix(keys.policy_parts, keys_only=True)
    assert len(first_parts) == -(-len(msgspec.json.encode(record)) // POLICY_PART_BYTES)

    b_store = await terms.fail_over()
    got = await asyncio.to_thread(b_store.load_policy_state)
    assert got is not None and (got.policy, got.saved_at, got.nodes) == ("optimus", 20.0, ["n1:1"])
    assert got.policy_state == big
    with pytest.raises(StoreFenced):      # a deposed term writes no part
        a_store.save_policy_state(PolicyStateRecord("optimus", 21.0, [], msgspec.Raw(big)))
    assert b_store.etcd.range_prefix(keys.policy_parts, keys_only=True) == first_parts

    await asyncio.to_thread(b_store.save_policy_state,
                            PolicyStateRecord("optimus", 22.0, ["n2:1"], msgspec.Raw(bigger)))
    now = b_store.etcd.range_prefix(keys.policy_parts, keys_only=True)
    assert len(now) > len(first_parts) and not {bytes(kv.key) for kv in now} & {bytes(kv.key) for kv in first_parts}
    again = await asyncio.to_thread(b_store.load_policy_state)
    assert again is not None and again.policy_state == bigger and again.nodes == ["n2:1"]

    b_store.save_policy_state(PolicyStateRecord("optimus", 23.0, ["n2:1"], msgspec.Raw(b'{"jobs":{}}')))
    assert b_store.etcd.range_prefix(keys.policy_parts, keys_only=True) == []
    small = b_store.load_policy_state()
    assert small is not None and small.policy_state == b'{"jobs":{}}'
    await terms.close()


async def test_the_decommissioned_nodes_are_stored_fenced_and_load_in_the_next_term(etcd):
    terms = TwoTerms(etcd)
    a_store = await terms.first()
    assert a_store.load_decommissions() == DecommissionRecord()
    record = DecommissionRecord({"n1:1": DecommissionEntry("DECOMMISSIONED", None, "n1:2", "/r", Resource(1024, 2)),
                                 "n2:1": DecommissionEntry("DECOMMISSIONING", 1234.5)})
    a_store.save_decommissions(record)
    b_store = await terms.fail_over()
    assert b_store.load_decommissions() == record
    with pytest.raises(StoreFenced):
        a_store.save_decommissions(DecommissionRecord())
    assert b_store.load_decommissions() == record
    await terms.close()


async def test_app_records_beyond_grpcs_4_mib_answer_load_in_the_next_term(etcd):
    """A recovery reads all app records in one etcd range; gRPC refused an answer over 4 MiB by
    default, and then no RM could recover. Six records of 0.9 MiB each (each under etcd's 1.5 MiB
    request limit) load whole in the next term."""
    terms = TwoTerms(etcd)
    a_store = await terms.first()
    ids = [f"application_1_{i:04d}" for i in range(1, 7)]
    for app_id in ids:
        a_store.save_app(AppRecord(app_id=app_id, user="alice", name="n" * (900 << 10), queue="default",
                                   app_type="ELASTANE", am_commands=["true"], am_environment={},
                                   am_local_resources={}, am_resource=Resource(256, 1), max_attempts=1,
                                   submit_time=1.0, seq=int(app_id[-4:]), state="FINISHED",
                                   final_status="SUCCEEDED"), [])
    b_store = await terms.fail_over()
    loaded = b_store.load()
    assert sorted(r.app_id for r, _ in loaded) == ids and all(len(r.name) == 900 << 10 for r, _ in loaded)
    await terms.close()
