"""Apps written to the fenced etcd store several to a transaction (rm/ha/etcd_store.py
`save_apps`), on a real etcd: a new term writes back every unfinished app it recovered, one round
trip and commit each before, while its lease's renewals wait on the same event loop."""
from __future__ import annotations

import asyncio

import msgspec
import pytest

import etcd_server as etcdmod
from protocol.records import Resource
from rm.ha.etcd_store import MAX_TXN_OPS, EtcdStateStore, StoreFenced
from rm.store import AppRecord, AttemptRecord
from test_policy_state_etcd import TwoTerms

pytestmark = [pytest.mark.cluster,
              pytest.mark.skipif(etcdmod.unavailable_reason() is not None,
                                 reason=f"no etcd here: {etcdmod.unavailable_reason()}")]


def app(seq: int, name: str = "j") -> AppRecord:
    return msgspec.convert({"app_id": f"application_1_{seq:04d}", "user": "alice", "name": name, "queue": "default",
                            "app_type": "YARN", "am_commands": ["true"], "am_environment": {},
                            "am_local_resources": {}, "am_resource": msgspec.to_builtins(Resource(128, 1)),
                            "max_attempts": 2, "submit_time": 1.0, "seq": seq, "submission": {},
                            "state": "RUNNING", "final_status": "UNDEFINED"}, AppRecord)


def attempts(a: AppRecord, n: int = 1) -> list[AttemptRecord]:
    return [AttemptRecord(attempt_id=f"appattempt_1_{a.seq:04d}_{i:06d}", app_id=a.app_id, number=i,
                          state="RUNNING", start_time=1.0) for i in range(1, n + 1)]


def count_transactions(store: EtcdStateStore) -> list[int]:
    """The operations of each transaction `store` sends to etcd from now on, in order."""
    calls: list[int] = []
    real = store.etcd.txn

    def counted(compare, ops):
        calls.append(len(ops))
        return real(compare, ops)
    store.etcd.txn = counted        # type: ignore[method-assign]
    return calls


async def test_apps_go_several_to_a_transaction_and_one_that_etcd_refuses_stays_out_alone(etcd):
    terms = TwoTerms(etcd)
    store = await terms.first()
    calls = count_transactions(store)

    apps = [(a, attempts(a)) for a in (app(i) for i in range(1, 301))]
    too_big = app(301, name="x" * (2 << 20))        # over etcd's 1.5 MiB request limit
    # More attempts than a transaction's operations: written alone, in fenced parts (its attempts
    # first, its record last), not refused (docs/operating.md, "How fencing protects the store").
    too_many = app(302)
    batch = apps[:150] + [(too_big, attempts(too_big)), (too_many, attempts(too_many, MAX_TXN_OPS))] + apps[150:]
    failed = await asyncio.to_thread(store.save_apps, batch)
    assert set(failed) == {too_big.app_id}
    assert not isinstance(failed[too_big.app_id], StoreFenced)
    # 300 apps of 2 operations each: 5 full transactions' worth, the refused app alone, and the
    # app of many attempts in two parts.
    assert len(calls) <= 10 and max(calls) <= MAX_TXN_OPS, calls
    stored = await asyncio.to_thread(store.load)
    expected = apps + [(too_many, attempts(too_many, MAX_TXN_OPS))]
    assert sorted(((r, ats) for r, ats in stored), key=lambda x: x[0].seq) == expected
    assert not store.fenced_reason

    b_store = await terms.fail_over()
    failed = await asyncio.to_thread(store.save_apps, apps[:5])     # the deposed term writes none
    assert set(failed) == {a.app_id for a, _ in apps[:5]} and all(isinstance(e, StoreFenced) for e in failed.values())
    assert await asyncio.to_thread(b_store.load) == stored
    await terms.close()


async def test_with_etcd_down_a_flush_waits_out_one_timeout_not_one_per_app(etcd):
    terms = TwoTerms(etcd)
    store = await terms.first()
    calls = count_transactions(store)
    apps = [(a, attempts(a)) for a in (app(i) for i in range(1, 201))]
    etcd.stop()
    try:
        failed = await asyncio.to_thread(store.save_apps, apps)
    finally:
        etcd.start()
    assert set(failed) == {a.app_id for a, _ in apps} and len(calls) == 1, calls
    assert all("no etcd member answered" in str(e) for e in failed.values())
    await terms.close()
