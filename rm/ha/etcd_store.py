"""The RM state store on etcd, fenced: every write is one etcd transaction guarded by the term's
fencing token, so a deposed RM cannot write.

Same interface as the SQLite store (rm/store.py `StateStore`), same JSON documents:
`<prefix>/rm/apps/<app_id>` holds an AppRecord, `<prefix>/rm/attempts/<app_id>/<attempt_id>` an
AttemptRecord, `<prefix>/rm/policy/state` the PolicyStateRecord (or, when it is larger than one etcd
request takes, its parts: see `save_policy_state`). Each write compares the leader key's create revision with the token this RM was
elected with (rm/ha/etcd_kv.py `token_compare`); when another RM has been elected since -- or the
lease ran out and nobody holds the key -- the comparison fails, nothing is written, the store
refuses every later write without asking etcd, and `on_fenced` tells the elector, which steps
the RM down at once (YARN's ZKRMStateStore fences the same way, with a ZooKeeper multi-op on its
fencing node).
"""
from __future__ import annotations

import logging
import uuid
from typing import Any, Callable, Optional, Sequence

import msgspec

from protocol.errors import StateError

from ..store import AppRecord, AttemptRecord, DecommissionRecord, PolicyStateRecord, StateStore
from .etcd_kv import BlockingEtcd, EtcdKeys, EtcdUnavailable, delete_op, put_op, token_compare

log = logging.getLogger(__name__)

# etcd's default --max-txn-ops: the most puts one transaction holds. An app's write (its record
# and its attempts) that fits one is atomic; one with more attempts is written in several
# (`_app_txns`).
MAX_TXN_OPS = 128
# etcd refuses a request above its --max-request-bytes (1.5 MiB by default). A policy's state grows
# with its jobs (Optimus keeps a few KB of fits and samples per job), so a state above this is
# written in parts of this size, each request well under the limit.
POLICY_PART_BYTES = 1 << 20
# The records of several apps written in one transaction (save_apps): well under the request limit.
APPS_TXN_BYTES = 512 << 10


class PolicyStateParts(msgspec.Struct, forbid_unknown_fields=False):
    """Where a policy state written in parts lies: `parts` values under its generation's prefix,
    `size` bytes in all (the encoded PolicyStateRecord, cut at POLICY_PART_BYTES)."""

    generation: str
    parts: int
    size: int


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

    @property
    def fenced(self) -> bool:
        return bool(self.fenced_reason)

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

    def _app_txns(self, app: AppRecord, attempts: list[AttemptRecord]) -> list[list[Any]]:
        """The puts of an app's record and its attempts', as the transactions that write them: one
        (atomic) when they fit one, as nearly always. Attempts are not capped (an AM that exits
        without being counted is retried without limit) and the RM needs every one back: the next
        attempt's number follows the recovered ones' (rm/core.py `_new_attempt`) and the failures
        that count are counted from them. So a longer list goes in several transactions, each
        fenced, of at most MAX_TXN_OPS puts and APPS_TXN_BYTES, oldest attempts first and the
        app's record last. Cut short (fenced, etcd gone), they leave the app's record as it was
        and each attempt before the cut new, each after it as it was or absent: the stored
        attempts stay a gapless run from the first, and the app's own change is lost as with a
        write that failed whole (it stays dirty and is written again at the next flush)."""
        app_op = put_op(self.keys.app(app.app_id), self._enc.encode(app))
        ops = [put_op(self.keys.attempt(a.app_id, a.attempt_id), self._enc.encode(a)) for a in attempts]
        if 1 + len(ops) <= MAX_TXN_OPS:
            return [[app_op, *ops]]
        txns: list[list[Any]] = [[]]
        size = 0
        for op in [*ops, app_op]:
            n = len(op.request_put.value)
            if txns[-1] and (len(txns[-1]) == MAX_TXN_OPS or size + n > APPS_TXN_BYTES):
                txns.append([])
                size = 0
            txns[-1].append(op)
            size += n
        return txns

    def _write_app(self, app_id: str, txns: list[list[Any]]) -> None:
        for i, ops in enumerate(txns):
            self._write(ops, app_id if len(txns) == 1 else f"{app_id} (part {i + 1} of {len(txns)})")

    def save_app(self, app: AppRecord, attempts: list[AttemptRecord]) -> None:
        self._write_app(app.app_id, self._app_txns(app, attempts))

    def save_apps(self, apps: Sequence[tuple[AppRecord, list[AttemptRecord]]]) -> dict[str, Exception]:
        """Several apps to a transaction (at most MAX_TXN_OPS operations and APPS_TXN_BYTES of
        records each), every one fenced: each write is a round trip and a commit (an fsync on
        etcd's members), and a new term writes back every unfinished app it recovered while its
        lease's renewals wait on the same event loop -- one app a write took 0.6 ms on this
        project's machine and takes several on a disk whose fsync is slower, so a cluster with
        thousands of unfinished apps could outlast the lease. A transaction etcd refuses (one app
        too large, say) is written again app by app, so that app does not keep the others out;
        fenced, or with no etcd member answering, nothing more is tried (each try would wait out
        a timeout on the loop)."""
        failed: dict[str, Exception] = {}
        batch: list[tuple[AppRecord, list[AttemptRecord]]] = []
        ops: list[Any] = []
        size = 0
        down: Optional[Exception] = None      # etcd did not answer: the rest is not tried (a timeout each)

        def write() -> None:
            nonlocal ops, size, down
            try:
                self._write(ops, batch[0][0].app_id if len(batch) == 1 else f"{len(batch)} applications")
            except StoreFenced as e:
                failed.update((a.app_id, e) for a, _ in batch)
            except EtcdUnavailable as e:
                failed.update((a.app_id, e) for a, _ in batch)
                down = e
            except Exception as e:     # noqa: BLE001 - one by one, to name the app at fault
                if len(batch) == 1:    # already alone: trying again would only wait out etcd twice
                    failed[batch[0][0].app_id] = e
                else:
                    failed.update(super(EtcdStateStore, self).save_apps(batch))
            batch.clear()
            ops, size = [], 0

        def refused(app_id: str) -> Optional[Exception]:
            """Why nothing more is tried: fenced, or no etcd member answering."""
            if self.fenced_reason:
                return StoreFenced(f"not writing {app_id}: {self.fenced_reason}")
            return down

        for app, attempts in apps:
            if (why := refused(app.app_id)) is not None:
                failed[app.app_id] = why
                continue
            txns = self._app_txns(app, attempts)
            if len(txns) > 1:       # more than one transaction holds: written alone, in its parts
                if batch:
                    write()
                    if (why := refused(app.app_id)) is not None:
                        failed[app.app_id] = why
                        continue
                try:
                    self._write_app(app.app_id, txns)
                except EtcdUnavailable as e:
                    failed[app.app_id] = down = e
                except Exception as e:     # noqa: BLE001 - fenced (refused() then stops the rest), or a part refused
                    failed[app.app_id] = e
                continue
            mine = txns[0]
            mine_size = sum(len(op.request_put.value) for op in mine)
            if batch and (len(ops) + len(mine) > MAX_TXN_OPS or size + mine_size > APPS_TXN_BYTES):
                write()
                if (why := refused(app.app_id)) is not None:
                    failed[app.app_id] = why
                    continue
            batch.append((app, attempts))
            ops += mine
            size += mine_size
        if batch:
            write()
        return failed

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

    def save_policy_state(self, record: PolicyStateRecord) -> None:
        """Store `record` in place of the last one. One that fits a request goes in one transaction,
        which also drops any parts. A larger one is written as a new generation of parts, each in a
        fenced transaction of its own, then made current in one that puts its index and removes the
        whole-record key: a reader finds the old state or the new one, never a mix, and a term
        fenced midway leaves only parts no index names (removed by the next save)."""
        data = self._enc.encode(record)
        k = self.keys
        if len(data) <= POLICY_PART_BYTES:
            self._write([put_op(k.policy_state, data), delete_op(k.policy_parts_index),
                         delete_op(k.policy_parts, prefix=True)], "the policy state")
            return
        generation = uuid.uuid4().hex
        parts = [data[i:i + POLICY_PART_BYTES] for i in range(0, len(data), POLICY_PART_BYTES)]
        for i, part in enumerate(parts):
            self._write([put_op(k.policy_part(generation, i), part)],
                        f"part {i + 1} of {len(parts)} of the policy state")
        index = PolicyStateParts(generation, len(parts), len(data))
        self._write([put_op(k.policy_parts_index, self._enc.encode(index)), delete_op(k.policy_state)],
                    "the policy state's index")
        # Earlier generations (the last current one, any a fenced term left): no index names them.
        stale = sorted({bytes(kv.key)[len(k.policy_parts):].split(b"/", 1)[0].decode()
                        for kv in self.etcd.range_prefix(k.policy_parts, keys_only=True)} - {generation})
        for i in range(0, len(stale), MAX_TXN_OPS):
            self._write([delete_op(k.policy_generation(g), prefix=True) for g in stale[i:i + MAX_TXN_OPS]],
                        "the policy state's previous parts")

    def load_policy_state(self) -> Optional[PolicyStateRecord]:
        """The stored record (None if none): the whole-record key, or the parts its index names,
        read at the index's revision."""
        k = self.keys
        (whole, index_doc), revision = self.etcd.get_many([k.policy_state, k.policy_parts_index])
        if whole is not None:
            return msgspec.json.decode(whole, type=PolicyStateRecord)
        if index_doc is None:
            return None
        index = msgspec.json.decode(index_doc, type=PolicyStateParts)
        # One part a request: a response above gRPC's 4 MiB default would be refused.
        parts = [self.etcd.get_many([k.policy_part(index.generation, i)], revision)[0][0] for i in range(index.parts)]
        missing = [i for i, p in enumerate(parts) if p is None]
        data = b"".join(p for p in parts if p is not None)
        if missing or len(data) != index.size:
            raise StateError(f"the policy state's generation {index.generation} is incomplete: "
                             f"parts {missing} missing, {len(data)} of {index.size} bytes")
        return msgspec.json.decode(data, type=PolicyStateRecord)

    def save_decommissions(self, record: DecommissionRecord) -> None:
        self._write([put_op(self.keys.decommissions, self._enc.encode(record))], "the decommissioned nodes")

    def load_decommissions(self) -> DecommissionRecord:
        (doc,), _ = self.etcd.get_many([self.keys.decommissions])
        return DecommissionRecord() if doc is None else msgspec.json.decode(doc, type=DecommissionRecord)

    def close(self) -> None:
        self.etcd.close()
