"""Ownership table: which executor owns each block, with a version, and key -> block hashing.

Keys are ints (dense row/range indices of a model) or strings. A key maps to a block by a stable
hash (splitmix64 for ints, blake2b for strings), never Python's salted hash(), so every process
agrees on it. The number of blocks is fixed for the life of a job (a job parameter).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Iterable, Union

import numpy as np
from protocol.errors import StateError
from protocol.json_types import JsonObject, JsonValue

Key = Union[int, str]
_MASK = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def key_hash(key: Key) -> int:
    """A 64-bit hash of `key` that is the same in every process and on every run."""
    if isinstance(key, bool) or not isinstance(key, (int, str)):
        raise TypeError(f"key must be an int or a str, not {type(key).__name__}")
    if isinstance(key, int):
        return _splitmix64(key & _MASK)
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little")


def block_of(key: Key, num_blocks: int) -> int:
    """The block that holds `key` in a key space of `num_blocks` hashed blocks."""
    return key_hash(key) % num_blocks


# Block ids of the keys 0 .. n-1 per block count, grown on demand up to TABLE_KEYS keys: a model's
# keys are a dense range, and every pull and push routes its keys twice (client and server), so a
# lookup (two numpy passes) replaces the hash's dozen on every request.
TABLE_KEYS = 1 << 19
_block_tables: dict[int, np.ndarray] = {}


def _hash_blocks(keys: np.ndarray, num_blocks: int) -> np.ndarray:
    x = keys.astype(np.uint64)
    with np.errstate(over="ignore"):  # splitmix64 relies on wrap-around arithmetic
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        x = x ^ (x >> np.uint64(31))
    return (x % np.uint64(num_blocks)).astype(np.int64)


def blocks_of_int_keys(keys: np.ndarray, num_blocks: int) -> np.ndarray:
    """Vectorised block_of for an array of int keys (same result as block_of per key)."""
    if not len(keys):
        return np.zeros(0, np.int64)
    lo, hi = int(keys.min()), int(keys.max())
    if lo < 0 or hi >= TABLE_KEYS:
        return _hash_blocks(keys, num_blocks)
    table = _block_tables.get(num_blocks)
    if table is None or len(table) <= hi:
        # Doubling: a growing model (keys inserted in order) rebuilds the table O(log n) times.
        size = min(TABLE_KEYS, max(1024, 2 * (hi + 1), 0 if table is None else 2 * len(table)))
        table = _block_tables[num_blocks] = _hash_blocks(np.arange(size, dtype=np.int64), num_blocks)
    return table[keys]


def as_int_keys(keys: object) -> np.ndarray:
    """`keys` as a 1-D int64 array (no copy when it already is one); ValueError naming what is wrong."""
    arr = np.asarray(keys)
    if arr.ndim != 1:
        raise ValueError(f"int keys must be a 1-D array, got shape {arr.shape}")
    if arr.dtype.kind not in "iu":
        if arr.size == 0:
            return np.zeros(0, np.int64)
        raise ValueError(f"int keys must have an integer dtype, got {arr.dtype}")
    if arr.dtype.kind == "u" and arr.size and int(arr.max()) > np.iinfo(np.int64).max:
        raise ValueError("int keys must fit in int64")
    return arr.astype(np.int64, copy=False)


class OwnershipError(StateError, ValueError):
    """An ownership table or update that is inconsistent (bad block id, unknown owner...)."""


@dataclass
class OwnershipTable:
    """Block -> owner executor id, the executors' data-plane addresses, and a version number.

    The controller (in the AM) holds the authoritative table and bumps `version` on every change;
    executors and clients hold copies and only accept newer versions. A client may also learn a
    single block's owner from a redirect (`note_owner`), ahead of the next broadcast.
    """

    num_blocks: int
    owners: list[str]
    addresses: dict[str, str] = field(default_factory=dict)
    version: int = 0
    # (owners snapshot, distinct owners, block -> owner position): see owner_index().
    _owner_index: Any = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.num_blocks <= 0:
            raise OwnershipError(f"num_blocks must be positive, got {self.num_blocks}")
        if len(self.owners) != self.num_blocks:
            raise OwnershipError(f"owners has {len(self.owners)} entries for {self.num_blocks} blocks")

    @classmethod
    def round_robin(cls, num_blocks: int, executors: list[str], addresses: dict[str, str] | None = None) -> "OwnershipTable":
        """Spread blocks evenly over `executors` (block b -> executors[b % n])."""
        if not executors:
            raise OwnershipError("need at least one executor to own blocks")
        return cls(num_blocks, [executors[b % len(executors)] for b in range(num_blocks)], dict(addresses or {}))

    def block_of(self, key: Key) -> int:
        return block_of(key, self.num_blocks)

    def owner_index(self) -> tuple[list[str], np.ndarray]:
        """(distinct owners, block -> position in that list as an int array), for vectorised routing.

        Cached until `owners` changes (a newer table, an assignment or a learned redirect), so
        routing a batch of keys costs one hash and two fancy-indexing passes, no Python per key.
        """
        snapshot = tuple(self.owners)
        cached = self._owner_index
        if cached is not None and cached[0] == snapshot:
            return cached[1], cached[2]
        names = sorted(set(snapshot))
        pos = {o: i for i, o in enumerate(names)}
        index = np.fromiter((pos[o] for o in snapshot), np.int64, len(snapshot))
        self._owner_index = (snapshot, names, index)
        return names, index

    def owner_of_block(self, block: int) -> str:
        self._check_block(block)
        return self.owners[block]

    def owner_of(self, key: Key) -> str:
        return self.owners[self.block_of(key)]

    def address_of(self, executor_id: str) -> str:
        try:
            return self.addresses[executor_id]
        except KeyError:
            raise OwnershipError(f"no data-plane address known for executor {executor_id!r}") from None

    def blocks_owned_by(self, executor_id: str) -> list[int]:
        return [b for b, o in enumerate(self.owners) if o == executor_id]

    def _check_block(self, block: int) -> None:
        if isinstance(block, bool) or not isinstance(block, int) or not 0 <= block < self.num_blocks:
            raise OwnershipError(f"block {block!r} is out of range 0..{self.num_blocks - 1}")

    def assign(self, blocks: Iterable[int], owner: str, address: str | None = None) -> int:
        """Controller side: give `blocks` to `owner` and bump the version; returns the new version."""
        blocks = list(blocks)
        for b in blocks:
            self._check_block(b)
        for b in blocks:
            self.owners[b] = owner
        if address is not None:
            self.addresses[owner] = address
        self.version += 1
        return self.version

    def note_owner(self, block: int, owner: str, address: str | None) -> None:
        """Client side: learn one block's owner from a redirect, without changing the version."""
        self._check_block(block)
        self.owners[block] = owner
        if address:
            self.addresses[owner] = address

    def replace_if_newer(self, other: "OwnershipTable") -> bool:
        """Adopt `other` if its version is newer; returns whether it was adopted."""
        if other.num_blocks != self.num_blocks:
            raise OwnershipError(f"table has {other.num_blocks} blocks, this job has {self.num_blocks}")
        if other.version <= self.version:
            return False
        self.owners = list(other.owners)
        self.addresses = {**self.addresses, **other.addresses}
        self.version = other.version
        return True

    def to_wire(self) -> JsonObject:
        """The table as JSON (SetOwnership.table, a reply's "table"); `from_wire` reads it back."""
        return {"num_blocks": self.num_blocks, "owners": list(self.owners), "addresses": dict(self.addresses),
                "version": self.version}

    @classmethod
    def from_wire(cls, obj: JsonValue) -> "OwnershipTable":
        if not isinstance(obj, dict):
            raise OwnershipError("ownership table must be an object")
        try:
            nb, owners, addrs, ver = obj["num_blocks"], obj["owners"], obj.get("addresses", {}), obj["version"]
        except KeyError as e:
            raise OwnershipError(f"ownership table is missing field {e.args[0]!r}") from None
        if not isinstance(nb, int) or isinstance(nb, bool):
            raise OwnershipError("ownership table field 'num_blocks' must be an int")
        if not isinstance(owners, list) or not all(isinstance(o, str) for o in owners):
            raise OwnershipError("ownership table field 'owners' must be a list of executor ids")
        if not isinstance(addrs, dict) or not all(isinstance(v, str) for v in addrs.values()):
            raise OwnershipError("ownership table field 'addresses' must map executor id -> host:port")
        if not isinstance(ver, int) or isinstance(ver, bool):
            raise OwnershipError("ownership table field 'version' must be an int")
        return cls(nb, [o for o in owners if isinstance(o, str)],
                   {k: v for k, v in addrs.items() if isinstance(v, str)}, ver)

    def copy(self) -> "OwnershipTable":
        return OwnershipTable(self.num_blocks, list(self.owners), dict(self.addresses), self.version)
