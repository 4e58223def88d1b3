"""The RM state store on etcd, fenced: every write is one etcd transaction guarded by the term's
fencing token, so a deposed RM cannot write.

Same interface as the SQLite store (rm/store.py `StateStore`), same JSON documents:
`<prefix>/rm/apps/<app_id>` holds an AppRecord, `<prefix>/rm/attempts/<app_id>/<attempt_id>` an
AttemptRecord, `<prefix>/rm/policy/state` the PolicyStateRecord. Each write compares the leader key's create revision with the token this RM was
elected with (rm/ha/etcd_kv.py `token_compare`); when another RM has been elected since -- or the
lease ran out and nobody holds the key -- the comparison fails, nothing is written, the store
refuses every later write without asking etcd, and `on_fenced` tells the elector, which steps
the RM down at once (YARN's ZKRMStateStore fences the same way, with a ZooKeeper multi-op on its
fencing node).
"""
from __future__ import annotations

import logging
from typing import Any, Callable, Optional

import msgspec

from protocol.errors import StateError

from ..store import AppRecord, AttemptRecord, PolicyStateRecord, StateStore
from .etcd_kv import BlockingEtcd, EtcdKeys, delete_op, put_op, token_compare

log = logging.getLogger(__name__)

# etcd's default --max-txn-ops: an app's write (its record and its attempts) must fit in one
# transaction to stay atomic.
MAX_TXN_OPS = 128


class StoreFenced(StateError, RuntimeError):
    """This RM's fencing token no longer holds: another RM is (or may be) active. Nothing was written."""


class EtcdStateStore(StateStore):
    """Apps and attempts in etcd, every write guarded by the fencing token of the current term."""

    def __init__(self, etcd: BlockingEtcd, keys: EtcdKeys, token: int, on_fenced: Callable[[str], None]):
        self.etcd = etcd
        self.keys = keys
        self.token = token
        self.on_fenced = on_fenced
        self.fenced_reason = ""
        self.path = f"etcd {', '.join(f'{h}:{p}' for h, p in etcd.targets)} under {keys.prefix}"
        self._enc = msgspec.json.Encoder()

    def _write(self, ops: list[Any], what: str) -> None:
        if self.fenced_reason:
            raise StoreFenced(f"not writing {what}: {self.fenced_reason}")
        resp = self.etcd.txn([token_compare(self.keys, self.token)], ops)
        if not resp.succeeded:
            self.fenced_reason = (f"fenced: the leader key no longer has this RM's token (revision {self.token}); "
                                  f"another ResourceManager is or may be active")
            log.warning("state store write of %s refused by etcd: %s", what, self.fenced_reason)
            self.on_fenced(self.fenced_reason)
            raise StoreFenced(f"not writing {what}: {self.fenced_reason}")

    def save_app(self, app: AppRecord, attempts: list[AttemptRecord]) -> None:
        ops = [put_op(self.keys.app(app.app_id), self._enc.encode(app))]
        ops += [put_op(self.keys.attempt(a.app_id, a.attempt_id), self._enc.encode(a)) for a in attempts]
        if len(ops) > MAX_TXN_OPS:
            raise StateError(f"{app.app_id}: {len(attempts)} attempts do not fit one etcd transaction "
                             f"({MAX_TXN_OPS} operations)")
        self._write(ops, app.app_id)

    def load(self) -> list[tuple[AppRecord, list[AttemptRecord]]]:
        apps = [msgspec.json.decode(kv.value, type=AppRecord) for kv in self.etcd.range_prefix(self.keys.apps)]
        by_app: dict[str, list[AttemptRecord]] = {}
        for kv in self.etcd.range_prefix(self.keys.attempts):
            at = msgspec.json.decode(kv.value, type=AttemptRecord)
            by_app.setdefault(at.app_id, []).append(at)
        apps.sort(key=lambda a: (a.seq, a.app_id))
        return [(a, sorted(by_app.get(a.app_id, []), key=lambda at: at.number)) for a in apps]

    def remove_app(self, app_id: str) -> None:
        self._write([delete_op(self.keys.app_attempts(app_id), prefix=True), delete_op(self.keys.app(app_id))],
                    f"the removal of {app_id}")

    @property
    def policy_key(self) -> bytes:
        return f"{self.keys.prefix}/rm/policy/state".encode()

    def save_policy_state(self, record: PolicyStateRecord) -> None:
        self._write([put_op(self.policy_key, self._enc.encode(record))], "the policy state")

    def load_policy_state(self) -> Optional[PolicyStateRecord]:
        for kv in self.etcd.range_prefix(self.policy_key):
            if bytes(kv.key) == self.policy_key:
                return msgspec.json.decode(kv.value, type=PolicyStateRecord)
        return None

    def close(self) -> None:
        self.etcd.close()
