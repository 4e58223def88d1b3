"""The manifest of a checkpoint's store blocks, `manifest-<executor>.json`, as a typed record.

One per executor that wrote blocks into a checkpoint directory (psruntime/store/checkpoint.py writes and
merges them). `blocks` maps a block to its entry as stored: formats 3 and 2 `{"file",
"other_keys"}` (the file's suffix tells them apart: .buf or .npz), format 1 `[[key, file], ...]`
(still read); the entries stay in that shape because the readers
of both formats dispatch on it.
"""
from __future__ import annotations

from typing import Any, Union

import msgspec

FORMAT = 3

# A block's entry: {"file", "other_keys"} (formats 3 and 2) or [[key, file], ...] (format 1).
BlockEntry = Union[dict[str, Any], list[list[Any]]]


class BlockManifest(msgspec.Struct, forbid_unknown_fields=False):
    """One executor's blocks in a checkpoint directory: the job's block count, the ownership
    table version the blocks were cut at, and each block's entry (keys are block numbers, JSON
    strings on disk)."""

    num_blocks: int
    blocks: dict[int, BlockEntry] = {}
    format: int = FORMAT
    table_version: int = 0
