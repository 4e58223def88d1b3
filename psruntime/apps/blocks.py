"""Input data blocks: the unit in which a worker holds, moves and spills its training data.

A block is a contiguous range of rows (samples, users or documents) of one app's input. It holds
two sets of named numpy arrays:

- ``data``: the immutable input (CSR-style ``indptr`` plus per-entry and per-row arrays), and
- ``state``: mutable worker-local state that belongs to those rows (NMF user factors, LDA token
  topic assignments and doc-topic counts). Keeping the state inside the block means that when
  EPS or Harmony move or spill a block, the rows' state travels with it.

Blocks serialise to a JSON-able header plus a list of plain numeric numpy buffers (no pickle),
matching what ``psruntime.wire.frame_codec`` sends and what the spill writes with lz4.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np
from protocol.errors import AppError
from protocol.json_types import JsonObject, JsonValue, json_int

# Numeric dtypes only: anything else would need pickle or carry pointers.
_ALLOWED_KINDS = frozenset("biuf")


class BlockFormatError(AppError, ValueError):
    """A serialised block whose header or buffers are inconsistent; the message names the part."""


@dataclass
class DataBlock:
    """A contiguous range of input rows of one app, with the worker-local state of those rows."""

    app: str
    block_index: int          # global index of the block: stable whatever the partitioning
    row_start: int            # global index of the block's first row
    num_rows: int
    data: dict[str, np.ndarray]
    state: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        """Bytes held by the block's arrays (input plus state), for memory accounting."""
        return sum(a.nbytes for a in self.data.values()) + sum(a.nbytes for a in self.state.values())

    def to_buffers(self) -> tuple[JsonObject, list[np.ndarray]]:
        """Header (JSON) and the arrays, data first then state, in the header's order."""
        arrays: list[np.ndarray] = []
        descs: list[JsonValue] = []
        for part, named in (("data", self.data), ("state", self.state)):
            for name, arr in named.items():
                arr = np.ascontiguousarray(arr)
                if arr.dtype.kind not in _ALLOWED_KINDS:
                    raise BlockFormatError(f"array {part}.{name} has non-numeric dtype {arr.dtype}")
                descs.append([part, name, arr.dtype.str, list(arr.shape)])
                arrays.append(arr)
        header: JsonObject = {"app": self.app, "block_index": self.block_index, "row_start": self.row_start,
                              "num_rows": self.num_rows, "arrays": descs}
        return header, arrays

    @classmethod
    def from_buffers(cls, header: Mapping[str, JsonValue],
                     buffers: Sequence[np.ndarray | bytes | bytearray | memoryview]) -> "DataBlock":
        """Rebuild a block from `to_buffers` output. Data arrays may be read-only views of the
        buffers; state arrays are copied so the worker can update them in place."""
        try:
            app = header["app"]
            block_index = json_int(header["block_index"])
            row_start = json_int(header["row_start"])
            num_rows = json_int(header["num_rows"])
            descs = header["arrays"]
        except (KeyError, TypeError, ValueError) as e:
            raise BlockFormatError(f"block header is missing or has a bad field: {e}") from None
        if not isinstance(app, str) or num_rows < 0 or block_index < 0 or row_start < 0:
            raise BlockFormatError("block header has a bad app, block_index, row_start or num_rows")
        if not isinstance(descs, list):
            raise BlockFormatError("block header field 'arrays' must be a list of array descriptors")
        if len(descs) != len(buffers):
            raise BlockFormatError(f"header lists {len(descs)} arrays but {len(buffers)} buffers were given")
        data: dict[str, np.ndarray] = {}
        state: dict[str, np.ndarray] = {}
        for desc, buf in zip(descs, buffers):
            try:
                if not isinstance(desc, list):
                    raise TypeError("not a list")
                part, name, dtype_str, dims = desc
                if not isinstance(name, str) or not isinstance(dtype_str, str) or not isinstance(dims, list):
                    raise TypeError("name and dtype must be strings and shape a list")
                dtype = np.dtype(dtype_str)
                shape = tuple(json_int(s) for s in dims)
            except (TypeError, ValueError) as e:
                raise BlockFormatError(f"bad array descriptor {desc!r}: {e}") from None
            if part not in ("data", "state"):
                raise BlockFormatError(f"array {name!r} has unknown part {part!r}")
            if dtype.kind not in _ALLOWED_KINDS:
                raise BlockFormatError(f"array {part}.{name} has non-numeric dtype {dtype}")
            flat = buf.reshape(-1).view(np.uint8) if isinstance(buf, np.ndarray) else np.frombuffer(buf, np.uint8)
            expected = dtype.itemsize * int(np.prod(shape, dtype=np.int64))
            if flat.nbytes != expected:
                raise BlockFormatError(
                    f"array {part}.{name}: buffer has {flat.nbytes} bytes, shape {shape} of {dtype} needs {expected}")
            arr = flat.view(dtype).reshape(shape)
            if part == "state":
                state[name] = arr.copy()
            else:
                data[name] = arr
        return cls(app=app, block_index=block_index, row_start=row_start, num_rows=num_rows,
                   data=data, state=state)
