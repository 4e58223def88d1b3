"""The fenced etcd state store (rm/ha/etcd_store.py) and the active RM on it, on an in-memory etcd
that keeps etcd's rules: every transaction at most 128 operations (--max-txn-ops), the fencing
compare on the leader key's create revision. An app with more attempts than one transaction
holds is saved and recovered whole, and a flush whose write finds the RM fenced launches no AM."""
from __future__ import annotations

from typing import Any, Optional, Sequence

import grpc
import msgspec
import pytest
from aetcd import rpc

from protocol.config import ClusterConfig, RMConfig
from protocol.records import Resource
from rm.ha.etcd_kv import EtcdKeys, prefix_end
from rm.ha.etcd_store import MAX_TXN_OPS, EtcdStateStore, StoreFenced
from rm.ha.ha_http import HaEndpoints
from rm.ha.ha_server import HaActiveServer
from rm.ha.role import HaRole
from rm.server import ResourceManagerServer
from rm.store import AppRecord, AttemptRecord
from rm_testing import SECRET, FakeClock, register, submit

KEYS = EtcdKeys("/test")
TOKEN = 5
APP_ID = "application_1700000000000_0001"


class TooManyOps(grpc.RpcError):
    """What etcd answers a transaction above --max-txn-ops."""

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.INVALID_ARGUMENT

    def details(self) -> str:
        return "etcdserver: too many operations in txn request"


class MemoryEtcd:
    """BlockingEtcd's calls on a dict, keeping etcd's revisions; `txns` logs each transaction's
    operation count and whether it was applied."""

    targets = [("memory", 2379)]

    def __init__(self) -> None:
        self.revision = 1
        self.kv: dict[bytes, tuple[bytes, int, int]] = {}     # key -> (value, create, mod revision)
        self.txns: list[tuple[int, bool]] = []
        self.elect(TOKEN)

    def elect(self, token: int) -> None:
        """The leader key, created at revision `token` (another RM's election moves it on)."""
        self.revision = max(self.revision, token)
        self.kv[KEYS.leader] = (b"rm1", token, token)

    def _holds(self, c: Any) -> bool:
        assert c.target == rpc.Compare.CREATE and c.result == rpc.Compare.EQUAL
        return self.kv.get(bytes(c.key), (b"", 0, 0))[1] == c.create_revision

    def _range(self, key: bytes, end: bytes) -> list[bytes]:
        if not end:
            return [key] if key in self.kv else []
        return sorted(k for k in self.kv if key <= k < end)

    def txn(self, compare: list[Any], success: list[Any], failure: Optional[list[Any]] = None) -> Any:
        if len(success) > MAX_TXN_OPS or len(failure or []) > MAX_TXN_OPS:
            raise TooManyOps()
        ok = all(self._holds(c) for c in compare)
        self.txns.append((len(success), ok))
        responses = []
        if ok and any(op.WhichOneof("request") != "request_range" for op in success):
            self.revision += 1
        for op in success if ok else failure or []:
            kind = op.WhichOneof("request")
            if kind == "request_put":
                r = op.request_put
                old = self.kv.get(bytes(r.key))
                self.kv[bytes(r.key)] = (bytes(r.value), old[1] if old else self.revision, self.revision)
                responses.append(rpc.ResponseOp(response_put=rpc.PutResponse()))
            elif kind == "request_delete_range":
                r = op.request_delete_range
                for k in self._range(bytes(r.key), bytes(r.range_end)):
                    del self.kv[k]
                responses.append(rpc.ResponseOp(response_delete_range=rpc.DeleteRangeResponse()))
            else:
                k = bytes(op.request_range.key)
                kvs = [self._kv(k)] if k in self.kv else []
                responses.append(rpc.ResponseOp(response_range=rpc.RangeResponse(kvs=kvs)))
        return rpc.TxnResponse(header=rpc.ResponseHeader(revision=self.revision), succeeded=ok, responses=responses)

    def _kv(self, k: bytes) -> Any:
        value, create, mod = self.kv[k]
        return rpc.KeyValue(key=k, value=value, create_revision=create, mod_revision=mod)

    def range_prefix(self, prefix: bytes, keys_only: bool = False) -> list[Any]:
        return [self._kv(k) for k in self._range(prefix, prefix_end(prefix))]

    def get_many(self, keys: Sequence[bytes], revision: int = 0) -> tuple[list[Optional[bytes]], int]:
        return [self.kv[k][0] if k in self.kv else None for k in keys], self.revision

    def close(self) -> None:
        pass


class Fencing:
    """The elector's side of the term, as the active server sees it: fenced once a write is refused."""

    def __init__(self) -> None:
        self.reasons: list[str] = []

    def fenced(self, reason: str) -> None:
        self.reasons.append(reason)

    def may_act(self) -> bool:
        return not self.reasons


def store_on(etcd: MemoryEtcd, fencing: Optional[Fencing] = None) -> EtcdStateStore:
    return EtcdStateStore(etcd, KEYS, TOKEN, (fencing or Fencing()).fenced)   # type: ignore[arg-type]


def app_record(state: str = "ACCEPTED") -> AppRecord:
    return msgspec.convert({"app_id": APP_ID, "user": "alice", "name": "j", "queue": "default", "app_type": "YARN",
                            "am_commands": ["true"], "am_environment": {}, "am_local_resources": {},
                            "am_resource": msgspec.to_builtins(Resource(128, 1)), "max_attempts": 2,
                            "submit_time": 1.0, "seq": 1, "state": state, "final_status": "UNDEFINED"}, AppRecord)


def lost_attempts(n: int, diagnostics: str = "Attempt lost: the ResourceManager restarted") -> list[AttemptRecord]:
    """`n` attempts that failed without counting (their AM's host was lost, the RM restarted, ...)."""
    return [AttemptRecord(attempt_id=f"appattempt_1700000000000_0001_{k:06d}", app_id=APP_ID, number=k,
                          state="FAILED", start_time=float(k), finish_time=k + 0.5, diagnostics=diagnostics,
                          counts_as_failure=False) for k in range(1, n + 1)]


def test_an_app_with_more_attempts_than_one_transaction_holds_is_saved_and_loaded_whole():
    etcd = MemoryEtcd()
    store = store_on(etcd)
    attempts = lost_attempts(300)
    store.save_app(app_record(), attempts)
    ((app, loaded),) = store.load()
    assert app == app_record() and loaded == attempts
    assert all(ok and n <= MAX_TXN_OPS for n, ok in etcd.txns)
    # Written beside other apps (a flush's batch), it is saved too, and so are they.
    other = msgspec.structs.replace(app_record(), app_id="application_1700000000000_0002", seq=2)
    assert store.save_apps([(other, []), (app_record("RUNNING"), lost_attempts(200)), (other, [])]) == {}
    assert [(a.state, len(ats)) for a, ats in store.load()] == [("RUNNING", 300), ("ACCEPTED", 0)]


def test_an_active_recovers_an_app_with_127_uncounted_attempts_and_saves_its_128th(tmp_path):
    etcd = MemoryEtcd()
    store_on(etcd).save_app(app_record(), lost_attempts(127))
    store = store_on(etcd)
    rm = ResourceManagerServer(RMConfig(state_dir=str(tmp_path)), ClusterConfig(secret=SECRET), clock=FakeClock(),
                               store=store, run_timers=False)
    app = rm.core.apps[APP_ID]
    assert len(app.attempts) == 128 and app.current_attempt == "appattempt_1700000000000_0001_000128"
    assert not rm.core.dirty
    ((_, stored),) = store.load()
    assert [a.number for a in stored] == list(range(1, 129)) and stored[-1].state != "FAILED"
    # The next term recovers the same attempts and numbers its own after them.
    again = ResourceManagerServer(RMConfig(state_dir=str(tmp_path)), ClusterConfig(secret=SECRET),
                                  clock=FakeClock(), store=store_on(etcd), run_timers=False)
    assert len(again.core.apps[APP_ID].attempts) == 129 and not again.core.dirty


def test_a_write_in_parts_fenced_midway_leaves_the_app_record_as_it_was_and_no_gap():
    etcd = MemoryEtcd()
    store_on(etcd).save_app(app_record(), lost_attempts(200))
    fencing = Fencing()
    store = store_on(etcd, fencing)
    changed = lost_attempts(300, diagnostics="second term")
    real = etcd.txn

    def then_another_rm_is_elected(*args: Any, **kw: Any) -> Any:
        out = real(*args, **kw)
        etcd.elect(TOKEN + 100)
        return out
    etcd.txn = then_another_rm_is_elected        # type: ignore[method-assign]
    with pytest.raises(StoreFenced):
        store.save_app(app_record("RUNNING"), changed)
    assert fencing.reasons and store.fenced
    ((app, loaded),) = store_on(etcd).load()
    assert app == app_record()                       # the app's own change did not land
    assert [a.number for a in loaded] == list(range(1, len(loaded) + 1))    # a gapless run from the first
    assert len(loaded) == 200 and loaded[:MAX_TXN_OPS] == changed[:MAX_TXN_OPS]
    assert all(a.diagnostics != "second term" for a in loaded[MAX_TXN_OPS:])


class RecordingLauncher:
    def __init__(self) -> None:
        self.launched: list[str] = []

    def launch(self, eff: Any) -> None:
        self.launched.append(eff.attempt_id)

    def remove_app_dir(self, app_id: str) -> None:
        pass


def active_server(tmp_path: Any, etcd: MemoryEtcd, fencing: Fencing) -> HaActiveServer:
    cluster = ClusterConfig(secret=SECRET)
    role = HaRole("rm1", 5.0, now=0.0)
    endpoints = HaEndpoints(cluster, "rm1", lambda: role, lambda: ("rm1", ""), lambda: "", lambda reason: None)
    rm = HaActiveServer(RMConfig(state_dir=str(tmp_path)), cluster, store_on(etcd, fencing), endpoints, epoch=1,
                        may_act=fencing.may_act)
    rm.launcher = RecordingLauncher()     # type: ignore[assignment]
    return rm


def test_a_flush_whose_write_finds_the_rm_fenced_launches_no_am(tmp_path):
    etcd, fencing = MemoryEtcd(), Fencing()
    rm = active_server(tmp_path, etcd, fencing)
    launcher = rm.launcher
    assert isinstance(launcher, RecordingLauncher)
    register(rm.core, "n1:1")
    app_id = submit(rm.core)              # its AM is allocated at once: a launch is due
    assert rm.core.effects and app_id in rm.core.dirty
    etcd.elect(TOKEN + 100)               # meanwhile another RM was elected
    assert rm.may_act()                   # this one does not know yet: the flush starts
    rm.flush()
    assert fencing.reasons and not rm.may_act()
    assert launcher.launched == []        # the next active recovers the attempt and launches it
    assert app_id in rm.core.dirty


def test_a_flush_while_the_term_holds_launches_the_am(tmp_path):
    etcd, fencing = MemoryEtcd(), Fencing()
    rm = active_server(tmp_path, etcd, fencing)
    register(rm.core, "n1:1")
    app_id = submit(rm.core)
    rm.flush()
    assert rm.launcher.launched == [rm.core.apps[app_id].current_attempt]    # type: ignore[union-attr]
    assert not rm.core.dirty and not fencing.reasons


def test_a_plain_server_on_a_store_that_refused_a_write_as_fenced_launches_no_am(tmp_path):
    etcd = MemoryEtcd()
    rm = ResourceManagerServer(RMConfig(state_dir=str(tmp_path)), ClusterConfig(secret=SECRET), clock=FakeClock(),
                               store=store_on(etcd), run_timers=False)
    launcher = RecordingLauncher()
    rm.launcher = launcher                # type: ignore[assignment]
    register(rm.core, "n1:1")
    submit(rm.core)
    etcd.elect(TOKEN + 100)
    rm.flush()
    assert rm.store.fenced and launcher.launched == []
