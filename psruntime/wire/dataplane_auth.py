"""Mutual challenge-response authentication of a data-plane connection with the job's secret.

Between the frame layer (psruntime.wire.frame_protocol) and the request layer (psruntime.wire.dataplane):
once per connection, before any request frame is served, three header-only frames::

    server -> client   {"op": "auth_challenge", "nonce": Ns}          Ns fresh random, per connection
    client -> server   {"op": "auth_answer", "proof": HMAC(K, CLIENT | Ns | Nc), "nonce": Nc}
    server -> client   {"op": "auth_ok", "proof": HMAC(K, SERVER | Nc | Ns)}

K is the job's secret (protocol.tokens.job_secret, handed to the AM and its executors in their
environment), HMAC is HMAC-SHA256, and CLIENT / SERVER are distinct context labels so neither
side's proof can be reflected back as the other's. A recorded answer is useless on a new
connection (a new Ns); the client's own nonce Nc makes the server prove the secret too, so a
worker never pushes to or pulls from an impostor. Proofs are compared in constant time. The cost
is one round trip when a connection opens and nothing per frame.

These classes only build and check the handshake frames; psruntime.wire.dataplane drives them.
"""
from __future__ import annotations

import hashlib
import hmac
import secrets

from psruntime.wire.frame_codec import Frame
from protocol.errors import ProtocolError
from protocol.json_types import JsonObject

CHALLENGE_OP = "auth_challenge"
ANSWER_OP = "auth_answer"
OK_OP = "auth_ok"
NONCE_BYTES = 32
HANDSHAKE_TIMEOUT_S = 10.0     # a peer that has not finished the handshake by then is dropped
_CLIENT = b"elastane-dataplane-v1 client\0"
_SERVER = b"elastane-dataplane-v1 server\0"


class AuthError(ProtocolError, ConnectionError):
    """A data-plane handshake that failed: a missing or wrong proof, or not a handshake at all."""


def secret_key(secret: str | bytes | None) -> bytes | None:
    """The HMAC key of a job secret as it travels in the environment (hex text); None: no auth."""
    if secret is None or secret == "" or secret == b"":
        return None
    return secret.encode() if isinstance(secret, str) else secret


def _proof(key: bytes, label: bytes, first: bytes, second: bytes) -> bytes:
    return hmac.new(key, label + first + second, hashlib.sha256).digest()


def _hex_field(header: JsonObject, name: str, nbytes: int) -> bytes:
    value = header.get(name)
    if not isinstance(value, str) or len(value) != 2 * nbytes:
        raise AuthError(f"field {name!r} must be {2 * nbytes} hex digits")
    try:
        return bytes.fromhex(value)
    except ValueError:
        raise AuthError(f"field {name!r} is not hex") from None


class ServerHandshake:
    """The serving side of one connection: send `challenge()`, then `check(answer)`."""

    def __init__(self, key: bytes, nonce: bytes | None = None) -> None:
        self._key = key
        self.nonce = nonce if nonce is not None else secrets.token_bytes(NONCE_BYTES)

    def challenge(self) -> dict[str, str]:
        return {"op": CHALLENGE_OP, "nonce": self.nonce.hex()}

    def check(self, frame: Frame) -> dict[str, str]:
        """The `auth_ok` header for a valid answer; AuthError (with the reason) for anything else."""
        h = frame.header
        if h.get("op") != ANSWER_OP:
            raise AuthError(f"expected {ANSWER_OP!r} before any request, got op {h.get('op')!r}")
        if frame.arrays:
            raise AuthError("a handshake frame carries no buffers")
        proof = _hex_field(h, "proof", hashlib.sha256().digest_size)
        client_nonce = _hex_field(h, "nonce", NONCE_BYTES)
        if not hmac.compare_digest(proof, _proof(self._key, _CLIENT, self.nonce, client_nonce)):
            raise AuthError("wrong proof of the job secret")
        return {"op": OK_OP, "proof": _proof(self._key, _SERVER, client_nonce, self.nonce).hex()}


class ClientHandshake:
    """The connecting side: `answer(challenge)`, then `confirm(ok)`."""

    def __init__(self, key: bytes, nonce: bytes | None = None) -> None:
        self._key = key
        self.nonce = nonce if nonce is not None else secrets.token_bytes(NONCE_BYTES)
        self._server_nonce: bytes | None = None

    def answer(self, frame: Frame) -> dict[str, str]:
        h = frame.header
        if h.get("op") != CHALLENGE_OP:
            raise AuthError(f"expected the server's {CHALLENGE_OP!r}, got op {h.get('op')!r} "
                            "(does the server run without a job secret?)")
        self._server_nonce = _hex_field(h, "nonce", NONCE_BYTES)
        return {"op": ANSWER_OP, "proof": _proof(self._key, _CLIENT, self._server_nonce, self.nonce).hex(),
                "nonce": self.nonce.hex()}

    def confirm(self, frame: Frame) -> None:
        """Check the server's proof; AuthError if it does not hold the secret (or refused ours)."""
        h = frame.header
        if h.get("op") == "error":
            raise AuthError(f"the server refused the handshake: {h.get('error', '')}")
        if h.get("op") != OK_OP or self._server_nonce is None:
            raise AuthError(f"expected {OK_OP!r}, got op {h.get('op')!r}")
        proof = _hex_field(h, "proof", hashlib.sha256().digest_size)
        if not hmac.compare_digest(proof, _proof(self._key, _SERVER, self.nonce, self._server_nonce)):
            raise AuthError("the server's proof of the job secret is wrong")
