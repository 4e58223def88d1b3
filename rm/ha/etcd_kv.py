"""etcd access for RM high availability: the key layout, the asyncio client the elector uses (aetcd),
and the blocking client the state store uses, both trying the listed members in turn.

Why two: the elector's campaign, renewals and polls are asyncio tasks (aetcd). The state store's
writes are synchronous by contract -- the server acknowledges a submission only once its write
returned (rm/server.py `submit`), exactly as with SQLite -- so they go through the same etcd v3
messages (aetcd's generated `rpc` module) on a blocking gRPC channel instead of a second event
loop in a thread.

Every gRPC channel reconnects within a second of a member coming back (gRPC's default backoff
grows to two minutes, which would keep an RM standby long after etcd returned).
"""
from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Optional, Sequence, TypeVar

# gRPC's own DNS resolver (c-ares) did not find etcd hosts named only in /etc/hosts (the multi-host
# testbed's names, and many small clusters'): every call timed out. The system resolver
# (getaddrinfo) reads /etc/hosts as every other daemon does. Set before grpc is first imported.
os.environ.setdefault("GRPC_DNS_RESOLVER", "native")

import aetcd
import aetcd.exceptions
import grpc
from aetcd import rpc

from protocol.errors import StateError

log = logging.getLogger(__name__)

T = TypeVar("T")

CHANNEL_OPTIONS: dict[str, Any] = {
    "grpc.initial_reconnect_backoff_ms": 100,
    "grpc.min_reconnect_backoff_ms": 100,
    "grpc.max_reconnect_backoff_ms": 1000,
    # Notice a silent peer (a cut link) within a few seconds rather than at TCP's timeout.
    "grpc.keepalive_time_ms": 2000,
    "grpc.keepalive_timeout_ms": 2000,
    "grpc.keepalive_permit_without_calls": 1,
    # A recovery reads every app record in one range: past gRPC's 4 MiB default answer (1,000 kept
    # apps of 4 KiB) it was refused, and no RM could finish recovering, so none became active.
    "grpc.max_receive_message_length": 1 << 30,
}


class EtcdUnavailable(StateError, ConnectionError):
    """No listed etcd member answered (each was tried once)."""


@dataclass(frozen=True)
class EtcdKeys:
    """Where the RMs' keys lie under cluster.toml's [ha] etcd_prefix."""

    prefix: str

    @property
    def leader(self) -> bytes:
        """The lease-bound key the active RM holds; its value is the RM's id. Its create revision
        is the term's fencing token."""
        return f"{self.prefix}/ha/leader".encode()

    @property
    def epoch(self) -> bytes:
        """The term counter, incremented by every won campaign in the same transaction."""
        return f"{self.prefix}/ha/epoch".encode()

    @property
    def secret_fingerprint(self) -> bytes:
        """The cluster secret's fingerprint (rm/ha/elector.py `secret_fingerprint`), written by the
        first campaign that finds it absent and never rewritten: not on a lease, so it outlives
        every term."""
        return f"{self.prefix}/ha/secret-fingerprint".encode()

    @property
    def apps(self) -> bytes:
        return f"{self.prefix}/rm/apps/".encode()

    def app(self, app_id: str) -> bytes:
        return self.apps + app_id.encode()

    @property
    def attempts(self) -> bytes:
        return f"{self.prefix}/rm/attempts/".encode()

    def app_attempts(self, app_id: str) -> bytes:
        return self.attempts + app_id.encode() + b"/"

    def attempt(self, app_id: str, attempt_id: str) -> bytes:
        return self.app_attempts(app_id) + attempt_id.encode()

    @property
    def policy_state(self) -> bytes:
        """The policy's state record, when it fits one etcd request (rm/ha/etcd_store.py)."""
        return f"{self.prefix}/rm/policy/state".encode()

    @property
    def decommissions(self) -> bytes:
        """The decommissioned and decommissioning nodes (rm/store.py DecommissionRecord)."""
        return f"{self.prefix}/rm/nodes/decommissions".encode()

    @property
    def policy_parts_index(self) -> bytes:
        """Where a policy state too large for one request lies: its generation and part count."""
        return f"{self.prefix}/rm/policy/parts-index".encode()

    @property
    def policy_parts(self) -> bytes:
        """Every generation's parts."""
        return f"{self.prefix}/rm/policy/parts/".encode()

    def policy_generation(self, generation: str) -> bytes:
        return self.policy_parts + generation.encode() + b"/"

    def policy_part(self, generation: str, index: int) -> bytes:
        return self.policy_generation(generation) + f"{index:06d}".encode()


def prefix_end(prefix: bytes) -> bytes:
    """The range end that covers every key starting with `prefix` (etcd's convention)."""
    b = bytearray(prefix)
    for i in range(len(b) - 1, -1, -1):
        if b[i] < 0xFF:
            b[i] += 1
            return bytes(b[: i + 1])
    return b"\0"


def token_compare(keys: EtcdKeys, token: int) -> Any:
    """The fencing guard: the leader key still exists with the create revision `token` (a missing
    key compares as revision 0, so a lease that ran out fails it too)."""
    return rpc.Compare(result=rpc.Compare.EQUAL, target=rpc.Compare.CREATE, key=keys.leader,
                       create_revision=token)


# ----- asyncio (the elector) -------------------------------------------------------------------

class AsyncEtcd:
    """aetcd clients for each member; `call` runs one request on the current member and moves to
    the next when it does not answer."""

    def __init__(self, targets: Sequence[tuple[str, int]], timeout_s: float):
        self.targets = list(targets)
        self.timeout_s = timeout_s
        self._clients: list[Optional[Any]] = [None] * len(self.targets)
        self._current = 0

    def _client(self, i: int) -> Any:
        c = self._clients[i]
        if c is None:
            host, port = self.targets[i]
            c = aetcd.Client(host=host, port=port, timeout=self.timeout_s, options=CHANNEL_OPTIONS,
                             connect_wait_timeout=max(1, int(self.timeout_s)))
            self._clients[i] = c
        return c

    async def call(self, fn: Callable[[Any], Awaitable[T]]) -> T:
        """`fn(client)` on the members in turn from the current one; EtcdUnavailable if none answers."""
        errors = []
        for k in range(len(self.targets)):
            i = (self._current + k) % len(self.targets)
            try:
                async with asyncio.timeout(self.timeout_s * 2):
                    out = await fn(self._client(i))
            except (aetcd.exceptions.ConnectionFailedError, aetcd.exceptions.ConnectionTimeoutError,
                    aetcd.exceptions.InternalError, asyncio.TimeoutError) as e:
                errors.append(f"{self.targets[i][0]}:{self.targets[i][1]}: {type(e).__name__} {e}".strip())
                continue
            except asyncio.CancelledError:
                # Cut short from outside (a renewal's own bound, rm/ha/elector.py): the next call
                # starts at the next member, so one that hangs does not take every renewal's time.
                self._current = (i + 1) % len(self.targets)
                raise
            self._current = i
            return out
        raise EtcdUnavailable("no etcd member answered: " + "; ".join(errors))

    async def close(self) -> None:
        for c in self._clients:
            if c is not None:
                try:
                    await c.close()
                except Exception:  # noqa: BLE001 - closing a channel to a dead member may fail; nothing to do
                    log.debug("closing an etcd client failed", exc_info=True)
        self._clients = [None] * len(self.targets)


async def check_members(targets: Sequence[tuple[str, int]], timeout_s: float) -> list[str]:
    """Each member that does not answer a status request within `timeout_s`, as `host:port: why`."""
    bad = []
    for host, port in targets:
        client = aetcd.Client(host=host, port=port, timeout=timeout_s, options=CHANNEL_OPTIONS)
        try:
            async with asyncio.timeout(timeout_s + 1):
                await client.status()
        except (aetcd.exceptions.ClientError, asyncio.TimeoutError, OSError) as e:
            bad.append(f"{host}:{port}: {type(e).__name__} {e}".strip())
        finally:
            try:
                await client.close()
            except Exception:  # noqa: BLE001 - see AsyncEtcd.close
                pass
    return bad


# ----- blocking (the state store) --------------------------------------------------------------

_UNREACHABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


class BlockingEtcd:
    """KV calls on blocking gRPC channels to each member, moving on to the next member when one
    does not answer."""

    def __init__(self, targets: Sequence[tuple[str, int]], timeout_s: float):
        self.targets = list(targets)
        self.timeout_s = timeout_s
        self._channels = [grpc.insecure_channel(f"{h}:{p}", options=list(CHANNEL_OPTIONS.items()))
                          for h, p in self.targets]
        self._stubs = [rpc.KVStub(ch) for ch in self._channels]
        self._current = 0

    def _call(self, method: str, request: Any) -> Any:
        errors = []
        for k in range(len(self._stubs)):
            i = (self._current + k) % len(self._stubs)
            try:
                out = getattr(self._stubs[i], method)(request, timeout=self.timeout_s)
            except grpc.RpcError as e:
                code = e.code() if hasattr(e, "code") else None
                if code not in _UNREACHABLE:
                    raise
                errors.append(f"{self.targets[i][0]}:{self.targets[i][1]}: {code}")
                continue
            self._current = i
            return out
        raise EtcdUnavailable("no etcd member answered: " + "; ".join(errors))

    def txn(self, compare: list[Any], success: list[Any], failure: Optional[list[Any]] = None) -> Any:
        """One transaction (etcd's TxnResponse)."""
        return self._call("Txn", rpc.TxnRequest(compare=compare, success=success, failure=failure or []))

    def range_prefix(self, prefix: bytes, keys_only: bool = False) -> list[Any]:
        """Every key-value under `prefix`, in key order (etcd's KeyValue messages; with `keys_only`
        their values are left out)."""
        resp = self._call("Range", rpc.RangeRequest(key=prefix, range_end=prefix_end(prefix), keys_only=keys_only))
        return list(resp.kvs)

    def get_many(self, keys: Sequence[bytes], revision: int = 0) -> tuple[list[Optional[bytes]], int]:
        """The values of `keys` (None where absent) read together, at `revision` (0: the latest),
        and the revision they were read at."""
        ops = [rpc.RequestOp(request_range=rpc.RangeRequest(key=k, revision=revision)) for k in keys]
        resp = self.txn([], ops)
        values = [bytes(r.response_range.kvs[0].value) if r.response_range.kvs else None for r in resp.responses]
        return values, int(resp.header.revision) if revision == 0 else revision

    def close(self) -> None:
        for ch in self._channels:
            ch.close()


def put_op(key: bytes, value: bytes) -> Any:
    return rpc.RequestOp(request_put=rpc.PutRequest(key=key, value=value))


def delete_op(key: bytes, prefix: bool = False) -> Any:
    req = rpc.DeleteRangeRequest(key=key, range_end=prefix_end(key) if prefix else b"")
    return rpc.RequestOp(request_delete_range=req)
