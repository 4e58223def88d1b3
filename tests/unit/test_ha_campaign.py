"""The election (rm/ha/elector.py) of two RMs on one in-memory etcd, stepped by hand on a fake
clock: RMs whose cluster secrets differ never both become active -- the second stays standby,
says why, and never rewrites the stored fingerprint, even when the leader key is free -- while
RMs sharing one take over from each other; and an RM whose recovery failed stays out of the
elections for its hold-off, so the healthy standby wins (docs/operating.md, "What a failover
looks like")."""
from __future__ import annotations

import itertools
import logging
from types import SimpleNamespace
from typing import Any, Awaitable, Callable, Optional

from aetcd import rpc, transactions
from aetcd.client import Transactions

from fakes import FakeClock
from protocol.ha_config import HAConfig
from rm.ha.elector import Elector, secret_fingerprint
from rm.ha.etcd_kv import EtcdKeys
from rm.ha.role import RECOVERY_HOLD_OFF_LEASES, HAEvent, HAState

LEASE_S = 5.0
KEYS = EtcdKeys("/test")


class MemoryEtcd:
    """etcd's key-value rules as the elector uses them: revisions, leases whose keys go with them,
    transactions whose compares (built by aetcd's own classes) all hold or nothing is applied; a
    missing key compares as revision 0 and fails every value compare, as in etcd."""

    def __init__(self) -> None:
        self.revision = 1
        self.kv: dict[bytes, tuple[bytes, int, int, int]] = {}    # key -> (value, create, mod, lease)
        self.leases: set[int] = set()
        self._ids = itertools.count(1)
        self.before_txn: Optional[Callable[[], None]] = None      # runs once, just before the next txn

    def put(self, key: bytes, value: bytes, lease: int = 0) -> None:
        self.revision += 1
        old = self.kv.get(key)
        self.kv[key] = (value, old[1] if old else self.revision, self.revision, lease)

    def read(self, key: bytes) -> Optional[SimpleNamespace]:
        if key not in self.kv:
            return None
        value, create, mod, _ = self.kv[key]
        return SimpleNamespace(key=key, value=value, create_revision=create, mod_revision=mod)

    def holds(self, c: Any) -> bool:
        assert c.op == rpc.Compare.EQUAL
        kv = self.read(bytes(c.key))
        if isinstance(c, transactions.Value):
            return kv is not None and kv.value == c.value
        got = {transactions.Create: kv.create_revision if kv else 0, transactions.Mod: kv.mod_revision if kv else 0}
        return got[type(c)] == c.value

    def revoke(self, lease_id: int) -> None:
        self.leases.discard(lease_id)
        for key in [k for k, v in self.kv.items() if v[3] == lease_id]:
            del self.kv[key]


class Client:
    """aetcd's client as the elector calls it, for one RM (what it asked is kept per RM)."""

    def __init__(self, etcd: MemoryEtcd) -> None:
        self.etcd = etcd
        self.transactions = Transactions()
        self.granted: list[int] = []

    async def get(self, key: bytes) -> Any:
        return self.etcd.read(key)

    async def lease(self, ttl: int) -> Any:
        lease_id = next(self.etcd._ids)
        self.etcd.leases.add(lease_id)
        self.granted.append(lease_id)
        return SimpleNamespace(id=lease_id)

    async def revoke_lease(self, lease_id: int) -> None:
        self.etcd.revoke(lease_id)

    async def refresh_lease(self, lease_id: int) -> Any:
        ttl = int(LEASE_S) if lease_id in self.etcd.leases else 0
        return SimpleNamespace(TTL=ttl, header=SimpleNamespace(revision=self.etcd.revision))

    async def transaction(self, compare: list[Any], success: list[Any], failure: list[Any]) -> Any:
        hook, self.etcd.before_txn = self.etcd.before_txn, None
        if hook is not None:
            hook()
        ok = all(self.etcd.holds(c) for c in compare)
        responses: list[Any] = []
        for op in success if ok else failure:
            if isinstance(op, transactions.Put):
                self.etcd.put(op.key, op.value, op.lease or 0)
                responses.append(SimpleNamespace())
            else:
                kv = self.etcd.read(op.key)
                responses.append([(kv.value, kv)] if kv is not None else [])
        return ok, responses


class Etcd:
    """AsyncEtcd's interface on one RM's client."""

    def __init__(self, client: Client) -> None:
        self.client = client

    async def call(self, fn: Callable[[Any], Awaitable[Any]]) -> Any:
        return await fn(self.client)

    async def close(self) -> None:
        pass


class Rm:
    """One RM's elector on the shared etcd, and what its callbacks saw."""

    def __init__(self, etcd: MemoryEtcd, clock: FakeClock, rm_id: str, secret: str,
                 recovery: Optional[Callable[[], None]] = None) -> None:
        ha = HAConfig(enabled=True, rm_ids=["rm1", "rm2"],
                      rm_addresses={"rm1": "http://127.0.0.1:1", "rm2": "http://127.0.0.1:2"},
                      etcd_endpoints=["http://127.0.0.1:9"], lease_s=LEASE_S, etcd_prefix=KEYS.prefix,
                      compaction_interval_s=0)
        self.terms: list[int] = []
        self.standbys: list[str] = []
        self.recovery = recovery
        self.elector = Elector(ha, rm_id, self.on_active, self.on_standby, clock=clock, cluster_secret=secret)
        self.client = Client(etcd)
        self.elector.etcd = Etcd(self.client)     # type: ignore[assignment]
        self.elector._log(self.elector.role.start(clock()))

    async def on_active(self, epoch: int, token: int) -> None:
        if self.recovery is not None:
            self.recovery()
        self.terms.append(epoch)

    async def on_standby(self, reason: str) -> None:
        self.standbys.append(reason)

    async def step(self) -> None:
        """One round of the elector's loop, then the role changes it queued."""
        await self.elector._step()
        while not self.elector._transitions.empty():
            job = self.elector._transitions.get_nowait()
            assert job is not None
            await job()

    @property
    def state(self) -> HAState:
        return self.elector.role.state


def world(secret1: str, secret2: str) -> tuple[MemoryEtcd, FakeClock, Rm, Rm]:
    etcd, clock = MemoryEtcd(), FakeClock(1000.0)
    return etcd, clock, Rm(etcd, clock, "rm1", secret1), Rm(etcd, clock, "rm2", secret2)


async def test_an_rm_with_another_secret_stays_standby_says_why_and_never_rewrites_the_fingerprint(caplog):
    etcd, clock, rm1, rm2 = world("secret-one", "secret-two")
    await rm1.step()
    assert rm1.state == HAState.ACTIVE and rm1.terms == [1]
    stored = etcd.kv[KEYS.secret_fingerprint]
    assert stored[0] == secret_fingerprint("secret-one") and stored[3] == 0     # no lease: outlives the term
    assert b"secret-one" not in stored[0]

    with caplog.at_level(logging.WARNING, logger="rm.ha.elector"):
        await rm2.step()        # rm1 active: the mismatch shows before any failover
        assert rm2.state == HAState.STANDBY and rm2.elector.role.history[-1].event == HAEvent.SECRET_MISMATCH
        reason = rm2.elector.role.reason
        assert "cluster secret differs from the active term's" in reason and "[cluster]" in reason
        assert "every RM host" in reason and reason in caplog.text

        await rm1.elector.stop()        # the active leaves: the leader key is free
        assert KEYS.leader not in etcd.kv
        for _ in range(5):
            clock.advance(rm2.elector.poll_s)
            await rm2.step()
    assert rm2.state == HAState.STANDBY and rm2.terms == [] and rm2.client.granted == []
    assert rm2.elector.role.reason == reason
    assert [c.event for c in rm2.elector.role.history].count(HAEvent.SECRET_MISMATCH) == 1   # said once
    assert etcd.kv[KEYS.secret_fingerprint] == stored and KEYS.leader not in etcd.kv

    rm1b = Rm(etcd, clock, "rm1", "secret-one")     # the RM with the recorded secret comes back
    await rm1b.step()
    assert rm1b.state == HAState.ACTIVE and rm1b.terms == [2]


async def test_rms_sharing_the_secret_take_over_from_each_other():
    etcd, clock, rm1, rm2 = world("same", "same")
    await rm1.step()
    await rm2.step()
    assert (rm1.state, rm2.state) == (HAState.ACTIVE, HAState.STANDBY)
    assert not rm2.elector.secret_mismatch and rm2.elector.active_id == "rm1"
    stored = etcd.kv[KEYS.secret_fingerprint]
    await rm1.elector.stop()
    clock.advance(rm2.elector.poll_s)
    await rm2.step()
    assert rm2.state == HAState.ACTIVE and rm2.terms == [2]
    assert etcd.kv[KEYS.secret_fingerprint] == stored      # found, matched, left as it was


async def test_a_fingerprint_stored_between_the_read_and_the_campaign_makes_the_campaign_fail():
    etcd, clock, rm1, rm2 = world("secret-one", "secret-two")
    # rm2 read "no fingerprint, no leader"; rm1's whole campaign lands before rm2's transaction.
    etcd.before_txn = lambda: etcd.put(KEYS.secret_fingerprint, secret_fingerprint("secret-one"))
    await rm2.step()
    assert rm2.state == HAState.STANDBY and rm2.terms == [] and KEYS.leader not in etcd.kv
    assert etcd.kv[KEYS.secret_fingerprint][0] == secret_fingerprint("secret-one")
    assert rm2.client.granted and not etcd.leases     # its lease given back at once
    clock.advance(rm2.elector.poll_s)
    await rm2.step()                                    # the next round reads it and says why
    assert rm2.elector.role.history[-1].event == HAEvent.SECRET_MISMATCH and KEYS.leader not in etcd.kv


async def test_after_a_failed_recovery_the_rm_stays_out_of_elections_so_the_healthy_standby_wins():
    etcd, clock = MemoryEtcd(), FakeClock(1000.0)

    def broken() -> None:
        raise RuntimeError("the store's records do not decode")
    rm1 = Rm(etcd, clock, "rm1", "s", recovery=broken)
    rm2 = Rm(etcd, clock, "rm2", "s")
    await rm1.step()
    failed_at = clock()
    assert rm1.state == HAState.STANDBY and rm1.elector.role.history[-1].event == HAEvent.RECOVERY_FAILED
    assert KEYS.leader not in etcd.kv and rm1.standbys == ["recovery failed: the store's records do not decode"]

    # rm1 polls first every round, the key free: it must not take it again before rm2 does.
    for _ in range(3):
        clock.advance(rm1.elector.poll_s)
        await rm1.step()
        await rm2.step()
    assert len(rm1.client.granted) == 1 and rm1.state == HAState.STANDBY
    assert rm2.state == HAState.ACTIVE and rm2.terms == [2]

    hold_off = RECOVERY_HOLD_OFF_LEASES * LEASE_S
    assert not rm1.elector.role.may_campaign(failed_at + hold_off - 0.01)
    assert rm1.elector.role.may_campaign(failed_at + hold_off)


async def test_once_an_operator_deletes_the_fingerprint_the_refusing_rm_may_campaign_and_records_its_own():
    etcd, clock, rm1, rm2 = world("old-secret", "new-secret")
    await rm1.step()
    await rm2.step()
    assert rm2.elector.secret_mismatch
    await rm1.elector.stop()
    del etcd.kv[KEYS.secret_fingerprint]        # `etcdctl del <prefix>/ha/secret-fingerprint`
    clock.advance(rm2.elector.poll_s)
    await rm2.step()
    events = [c.event for c in rm2.elector.role.history]
    assert events[-4:] == [HAEvent.SECRET_MISMATCH, HAEvent.SECRET_MATCHES, HAEvent.ELECTED, HAEvent.RECOVERED]
    assert rm2.state == HAState.ACTIVE and etcd.kv[KEYS.secret_fingerprint][0] == secret_fingerprint("new-secret")
