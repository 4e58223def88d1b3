"""RM high availability's election, fencing and lease on a real etcd (tests/support/etcd_server.py):
two electors (rm/ha/elector.py) campaign for the leader key, the fenced state store
(rm/ha/etcd_store.py) writes only under the current term's token, and an active whose etcd stops
steps down once its lease has run out, saying why."""
from __future__ import annotations

import asyncio
from typing import Any

import grpc
import msgspec
import pytest

import etcd_server as etcdmod
from polling import async_wait_until
from protocol.ha_config import HAConfig
from protocol.records import Resource
from rm.ha.elector import Elector
from rm.ha.etcd_kv import AsyncEtcd, BlockingEtcd, EtcdKeys, check_members, put_op
from rm.ha.etcd_store import EtcdStateStore, StoreFenced
from rm.ha.role import HAEvent, HAState
from rm.store import AppRecord, AttemptRecord

pytestmark = [pytest.mark.cluster,
              pytest.mark.skipif(etcdmod.unavailable_reason() is not None,
                                 reason=f"no etcd here: {etcdmod.unavailable_reason()}")]


def ha_config(etcd: Any, lease_s: float = 2.0) -> HAConfig:
    return HAConfig(enabled=True, rm_ids=["rm1", "rm2"],
                    rm_addresses={"rm1": "http://127.0.0.1:1", "rm2": "http://127.0.0.1:2"},
                    etcd_endpoints=[etcd.endpoint], lease_s=lease_s, etcd_prefix="/test")


class Rm:
    """One elector and what its callbacks saw: the terms it became active for, the step-downs."""

    def __init__(self, ha: HAConfig, rm_id: str):
        self.terms: list[tuple[int, int]] = []
        self.standbys: list[str] = []
        self.elector = Elector(ha, rm_id, self.on_active, self.on_standby)

    async def on_active(self, epoch: int, token: int) -> None:
        self.terms.append((epoch, token))

    async def on_standby(self, reason: str) -> None:
        self.standbys.append(reason)

    @property
    def state(self) -> HAState:
        return self.elector.role.state


def app_record(app_id: str, seq: int) -> AppRecord:
    return msgspec.convert({"app_id": app_id, "user": "alice", "name": "j", "queue": "default", "app_type": "YARN",
                            "am_commands": ["true"], "am_environment": {}, "am_local_resources": {},
                            "am_resource": msgspec.to_builtins(Resource(128, 1)), "max_attempts": 2,
                            "submit_time": 1.0, "seq": seq, "submission": {}, "state": "ACCEPTED",
                            "final_status": "UNDEFINED"}, AppRecord)


def attempt_record(app_id: str, n: int) -> AttemptRecord:
    return AttemptRecord(attempt_id=f"appattempt_{app_id.split('_', 1)[1]}_{n:06d}", app_id=app_id, number=n,
                         state="RUNNING", start_time=1.0)


def store_for(ha: HAConfig, rm: Rm) -> EtcdStateStore:
    return EtcdStateStore(BlockingEtcd(ha.etcd_targets(), 2.0), EtcdKeys(ha.etcd_prefix), rm.elector.role.token,
                          rm.elector.fenced)


async def test_one_rm_is_elected_the_other_waits_and_takes_over_with_the_next_epoch(etcd):
    ha = ha_config(etcd)
    a, b = Rm(ha, "rm1"), Rm(ha, "rm2")
    a.elector.start()
    await async_wait_until(lambda: a.state == HAState.ACTIVE, 20, "rm1 active")
    b.elector.start()
    await async_wait_until(lambda: b.elector.active_id == "rm1", 20, "rm2 sees rm1 as the active")
    assert b.state == HAState.STANDBY and b.terms == []
    assert a.terms == [(1, a.elector.role.token)] and a.elector.role.epoch == 1
    await a.elector.stop()        # gives the leader key up: rm2 need not wait for the lease
    await async_wait_until(lambda: b.state == HAState.ACTIVE, 20, "rm2 active after rm1 stopped")
    assert b.terms[0][0] == 2 and b.terms[0][1] > a.terms[0][1]     # next epoch, later token
    await b.elector.stop()


async def test_a_deposed_actives_write_is_refused_and_it_steps_down_at_once(etcd):
    # rm1 renews every 20 s (a 60 s lease): the test plays etcd expiring its lease while rm1 was
    # cut off (a revoke deletes the leader key just as the expiry does), well before rm1 would
    # notice by renewing -- so it is the write that finds out.
    a = Rm(ha_config(etcd, lease_s=60), "rm1")
    ha = ha_config(etcd)
    b = Rm(ha, "rm2")
    a.elector.start()
    await async_wait_until(lambda: a.state == HAState.ACTIVE, 20, "rm1 active")
    a_store = store_for(ha, a)
    a_store.save_app(app_record("application_1_0001", 1), [attempt_record("application_1_0001", 1)])
    admin = AsyncEtcd(ha.etcd_targets(), 2.0)
    await admin.call(lambda c: c.revoke_lease(a.elector.lease_id))
    b.elector.start()
    await async_wait_until(lambda: b.state == HAState.ACTIVE, 20, "rm2 active")
    assert a.state == HAState.ACTIVE          # rm1 has not noticed yet

    with pytest.raises(StoreFenced, match="another ResourceManager"):
        a_store.save_app(app_record("application_1_0002", 2), [])
    assert a.state == HAState.STANDBY         # at once, not at its next renewal
    assert a.elector.role.history[-1].event == HAEvent.FENCED and "fenced" in a.elector.role.reason
    with pytest.raises(StoreFenced):          # and nothing more from it, without asking etcd
        a_store.remove_app("application_1_0001")
    await async_wait_until(lambda: a.standbys, 10, "rm1's active side torn down")

    b_store = store_for(ha, b)
    stored = b_store.load()
    assert [(r.app_id, [at.number for at in ats]) for r, ats in stored] == [("application_1_0001", [1])]
    b_store.save_app(app_record("application_1_0003", 3), [])     # the new active writes
    b_store.remove_app("application_1_0001")
    assert [r.app_id for r, _ in b_store.load()] == ["application_1_0003"]
    for s in (a_store, b_store):
        s.close()
    await admin.close()
    await a.elector.stop()
    await b.elector.stop()


async def test_an_active_that_loses_etcd_steps_down_after_its_lease_and_comes_back(etcd):
    ha = ha_config(etcd, lease_s=2)
    a = Rm(ha, "rm1")
    a.elector.start()
    await async_wait_until(lambda: a.state == HAState.ACTIVE, 20, "rm1 active")
    etcd.stop()
    await async_wait_until(lambda: a.state == HAState.STANDBY, 30, "rm1 standby after etcd stopped")
    change = a.elector.role.history[-1]
    assert change.event == HAEvent.LEASE_EXPIRED and "etcd unreachable" in change.reason
    assert a.standbys and "etcd unreachable" in a.standbys[0]
    etcd.start()
    # etcd restores the old lease on restart and lets it run out; then rm1 wins a new term.
    await async_wait_until(lambda: a.state == HAState.ACTIVE, 60, "rm1 active again after etcd came back")
    assert [epoch for epoch, _ in a.terms] == [1, 2]
    await a.elector.stop()


async def test_members_that_do_not_answer_are_named(etcd):
    import s3_server  # noqa: PLC0415 - its free_ports helper

    dead = ("127.0.0.1", s3_server.free_ports(1)[0])
    bad = await check_members([("127.0.0.1", etcd.client_port), dead], timeout_s=1.0)
    assert len(bad) == 1 and bad[0].startswith(f"127.0.0.1:{dead[1]}")


async def test_a_transition_to_standby_that_comes_during_a_campaign_keeps_the_rm_out(etcd):
    """The operator's switch lands while rm1's campaign transaction is on its way to etcd: rm1 wins
    the key but gives it back at once (its hold-off says stay out), so rm2 takes over."""
    ha = ha_config(etcd)
    a, b = Rm(ha, "rm1"), Rm(ha, "rm2")
    real = a.elector.etcd.call
    switched: list[Any] = []

    async def call(fn: Any) -> Any:
        if not switched and getattr(fn, "__name__", "") == "txn":      # the campaign's transaction
            switched.append(await a.elector.transition_to_standby("transition-to-standby by admin"))
        return await real(fn)
    a.elector.etcd.call = call      # type: ignore[method-assign]
    a.elector.start()
    await async_wait_until(lambda: switched, 20, "rm1's campaign transaction")
    b.elector.start()
    await async_wait_until(lambda: b.state == HAState.ACTIVE, 20, "rm2 active: rm1 gave the key back")
    assert a.terms == [] and a.state == HAState.STANDBY
    await asyncio.gather(a.elector.stop(), b.elector.stop())


async def test_a_stop_during_a_role_change_lets_it_end_then_tears_the_active_side_down(etcd):
    """Stopped while becoming active (its server starting), the RM lets the start end and then
    stops what it started, rather than cancelling it half-way (a half-started server keeps its port)."""
    ha = ha_config(etcd)
    started, release = asyncio.Event(), asyncio.Event()
    events: list[str] = []

    async def on_active(epoch: int, token: int) -> None:
        started.set()
        await release.wait()
        events.append("active")

    async def on_standby(reason: str) -> None:
        events.append("standby")
    e = Elector(ha, "rm1", on_active, on_standby)
    e.start()
    await asyncio.wait_for(started.wait(), 20)
    stopping = asyncio.ensure_future(e.stop())
    await async_wait_until(lambda: e.role.state == HAState.STOPPED, 10, "the stop under way")
    release.set()
    await asyncio.wait_for(stopping, 30)
    assert events == ["active", "standby"]


async def test_standby_campaign_is_refused_while_the_leader_key_is_held(etcd):
    ha = ha_config(etcd)
    a, b = Rm(ha, "rm1"), Rm(ha, "rm2")
    a.elector.start()
    b.elector.start()
    await async_wait_until(lambda: {a.state, b.state} == {HAState.ACTIVE, HAState.STANDBY}, 20, "one active")
    active, standby = (a, b) if a.state == HAState.ACTIVE else (b, a)
    change = await active.elector.transition_to_standby("transition-to-standby by admin")
    assert change.new == HAState.STANDBY
    await async_wait_until(lambda: standby.state == HAState.ACTIVE, 20, "the other RM takes over")
    # The switched RM stays out of the election for its hold-off: no term for it meanwhile.
    assert not active.elector.role.may_campaign(active.elector.clock())
    assert len(active.terms) == 1
    await asyncio.gather(a.elector.stop(), b.elector.stop())


async def test_the_store_gives_back_the_records_as_saved_typed_ps_spec_included(etcd):
    from protocol.ps_job_spec import PSJobSpec  # noqa: PLC0415

    ha = ha_config(etcd)
    a = Rm(ha, "rm1")
    a.elector.start()
    await async_wait_until(lambda: a.state == HAState.ACTIVE, 20, "rm1 active")
    store = store_for(ha, a)
    ps = msgspec.structs.replace(app_record("application_1_0002", 2), app_type="ELASTANE_PS",
                                 ps_job=PSJobSpec(app="mlr", workers=3, servers=2))
    plain = app_record("application_1_0001", 1)
    attempts = [attempt_record("application_1_0002", n) for n in (2, 1)]
    store.save_app(ps, attempts)
    store.save_app(plain, [])
    loaded = store.load()
    assert [r for r, _ in loaded] == [plain, ps]                       # submission order (seq)
    assert loaded[1][1] == sorted(attempts, key=lambda at: at.number)  # attempts by number
    store.close()
    await a.elector.stop()


async def test_the_active_compacts_etcds_history_and_keeps_the_current_keys(etcd):
    """etcd keeps every revision until compacted: the active compacts (here every second), so a
    key's old revisions go while its current value and the leader key stay; a standby does not."""
    ha = msgspec.structs.replace(ha_config(etcd), compaction_interval_s=1.0)
    a, b = Rm(ha, "rm1"), Rm(ha, "rm2")
    a.elector.start()
    await async_wait_until(lambda: a.state == HAState.ACTIVE, 20, "rm1 active")
    b.elector.start()
    await async_wait_until(lambda: b.elector.active_id == "rm1", 20, "rm2 sees rm1 as the active")
    store = store_for(ha, a)
    key = EtcdKeys(ha.etcd_prefix).app("application_1_0001")
    first = store.etcd.txn([], [put_op(key, b"v0")]).header.revision
    for i in range(1, 20):
        store.etcd.txn([], [put_op(key, f"v{i}".encode())])

    def compacted_past_first() -> bool:
        try:
            store.etcd.get_many([key], revision=first)
        except grpc.RpcError as e:
            return e.code() == grpc.StatusCode.OUT_OF_RANGE      # "required revision has been compacted"
        return False

    await async_wait_until(compacted_past_first, 20, "etcd's history compacted past the first write")
    assert store.etcd.get_many([key])[0] == [b"v19"]
    assert a.state == HAState.ACTIVE and a.elector.compaction.compacted >= first
    assert b.elector.compaction.compacted == 0
    store.close()
    await b.elector.stop()
    await a.elector.stop()


async def test_a_servers_callbacks_act_for_its_own_term_only(etcd):
    """A server left from an earlier term (its teardown waits for requests in flight) writes with
    that term's token: the store refuses it, and its fencing must not step the RM's newer term
    down; it may not act either, so its queued AM launches stay unsent."""
    ha = ha_config(etcd, lease_s=2)
    a = Rm(ha, "rm1")
    a.elector.start()
    await async_wait_until(lambda: a.state == HAState.ACTIVE, 20, "rm1 active")
    first = a.elector.role.token
    old_fenced, old_may_act = a.elector.fenced_for(first), a.elector.may_act_for(first)
    assert old_may_act()
    admin = AsyncEtcd(ha.etcd_targets(), 2.0)
    await admin.call(lambda c: c.revoke_lease(a.elector.lease_id))    # its lease ends: a new term follows
    await async_wait_until(lambda: a.state == HAState.ACTIVE and a.elector.role.token != first, 30,
                           "rm1 active in a new term")
    second = a.elector.role.token
    assert not old_may_act() and a.elector.may_act_for(second)()
    old_fenced("a write of the old term's leftover server was refused")
    assert a.state == HAState.ACTIVE and a.elector.role.token == second      # the new term stands
    a.elector.fenced_for(second)("refused")                                  # its own fencing still works
    assert a.state == HAState.STANDBY
    await admin.close()
    await a.elector.stop()
