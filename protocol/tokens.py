"""HMAC-SHA256 signed tokens: NM tokens, AM tokens (per attempt) and container tokens; and the
per-job secret of an AM attempt, with the AM-control tokens signed with it.

A token is `base64url(json payload) "." base64url(hmac)`. Every payload carries `kind` and `exp`
(unix seconds). The cluster secret lives in conf/cluster.toml and is shared by the RM and NMs,
as Hadoop shares its secret keys; AMs never see it, they only hold tokens the RM gave them.
"""
from __future__ import annotations

import base64
import functools
import hashlib
import hmac
import secrets
import time
from types import MappingProxyType
from typing import Callable

import orjson
from protocol.errors import ProtocolError
from protocol.json_types import JsonInObject, JsonObject, JsonValue

NM = "nm"
AM = "am"
CONTAINER = "container"
CLIENT = "client"
AM_CONTROL = "am-control"   # signed with a job's secret: lets its bearer use the AM's /scale, /checkpoint
AM_CONTROL_LIFETIME_S = 300.0
_JOB_SECRET_CONTEXT = b"elastane job secret\0"


class TokenError(ProtocolError):
    """A token that is malformed, forged, expired or of the wrong kind."""


def generate_secret() -> str:
    return secrets.token_hex(32)


def job_secret(cluster_secret: str | bytes, attempt_id: str) -> str:
    """The per-job secret of one AM attempt (hex): the data plane's key and the AM's control key.

    A keyed derivation (HMAC of the attempt id under the cluster secret) rather than fresh random
    bytes: as unpredictable to anyone without the cluster secret, distinct per attempt, and the RM
    (or an operator holding the cluster secret) can recompute it at any time, so it needs no state
    store entry and survives an RM restart. Each attempt gets its own: executors left over from a
    failed attempt can neither reach the new attempt's executors nor be reached by them -- except
    in an app that keeps containers across attempts, whose next attempt takes those executors over
    on purpose: the RM derives all its attempts' secret from the first attempt's id.
    """
    key = cluster_secret.encode() if isinstance(cluster_secret, str) else cluster_secret
    return hmac.new(key, _JOB_SECRET_CONTEXT + attempt_id.encode(), hashlib.sha256).hexdigest()


def am_control_token(secret: str | bytes, attempt_id: str, lifetime_s: float = AM_CONTROL_LIFETIME_S,
                     now: float | None = None) -> str:
    """A short-lived bearer token for an AM's control endpoints, signed with its job secret
    (the secret itself never travels)."""
    return sign(secret, AM_CONTROL, {"attempt_id": attempt_id}, lifetime_s, now=now)


def _b64(b: bytes) -> str:
    return base64.urlsafe_b64encode(b).rstrip(b"=").decode()


def _unb64(s: str) -> bytes:
    return base64.urlsafe_b64decode(s + "=" * (-len(s) % 4))


def sign(secret: str | bytes, kind: str, payload: JsonInObject, lifetime_s: float,
         now: float | None = None) -> str:
    """Mint a token of `kind` carrying `payload`, valid for `lifetime_s` seconds."""
    key = secret.encode() if isinstance(secret, str) else secret
    now = time.time() if now is None else now
    body = dict(payload)
    body["kind"] = kind
    body["exp"] = now + lifetime_s
    encoded = _b64(orjson.dumps(body, option=orjson.OPT_SORT_KEYS))
    mac = hmac.new(key, encoded.encode(), hashlib.sha256).digest()
    return encoded + "." + _b64(mac)


def verify(secret: str | bytes, token: str, kind: str, now: float | None = None, *,
           allow_expired: bool = False) -> JsonObject:
    """Return the payload of a valid token of `kind`; raise TokenError otherwise. `allow_expired`:
    accept an authentic one past its `exp` (for a caller that checks what it may still do)."""
    key = secret.encode() if isinstance(secret, str) else secret
    # Tokens are base64url text: anything else (a non-UTF-8 header byte arrives as a surrogate,
    # which str.encode cannot encode) is malformed, not an internal error.
    if not isinstance(token, str) or not token.isascii() or token.count(".") != 1:
        raise TokenError("malformed token")
    payload = dict(_signed_payload(key, token))
    if payload.get("kind") != kind:
        raise TokenError(f"expected a {kind} token, got {payload.get('kind')!r}")
    now = time.time() if now is None else now
    exp = payload.get("exp", 0)
    if not isinstance(exp, (int, float, str)):
        raise TokenError(f"token has a bad exp {exp!r}")
    if float(exp) < now and not allow_expired:
        raise TokenError("token expired")
    return payload


# A daemon sees the same few tokens over and over (an NM's on every heartbeat, an AM's on every
# allocate): the signature check and decoding were half the RM's own work per heartbeat. Only
# verified tokens are kept (a failure raises, and lru_cache keeps no exceptions), keyed by the exact
# key and token; kind and expiry are still checked on every use. Sized above the live tokens of a
# large cluster (an NM has one, an AM one): NMs heartbeat round-robin, and an LRU smaller than that
# set misses on every call (5000 NMs against 4096 entries did). ~0.8 KB an entry, ~25 MB when full.
TOKEN_CACHE_SIZE = 1 << 15


@functools.lru_cache(maxsize=TOKEN_CACHE_SIZE)
def _signed_payload(key: bytes, token: str) -> MappingProxyType[str, JsonValue]:
    encoded, mac_s = token.split(".")
    try:
        mac = _unb64(mac_s)
    except Exception:
        raise TokenError("malformed token signature") from None
    expected = hmac.new(key, encoded.encode(), hashlib.sha256).digest()
    if not hmac.compare_digest(mac, expected):
        raise TokenError("token signature does not match")
    try:
        payload = orjson.loads(_unb64(encoded))
    except Exception:
        raise TokenError("malformed token payload") from None
    if not isinstance(payload, dict):
        raise TokenError("malformed token payload: not an object")
    return MappingProxyType(payload)


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def token_from_header(value: str | None) -> str | None:
    if not value or not value.startswith("Bearer "):
        return None
    return value[len("Bearer "):].strip()


Clock = Callable[[], float]
