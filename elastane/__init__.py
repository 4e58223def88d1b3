"""Elastane's public Python API.

- `elastane.app_api`: the interface a PS app implements (docs/app_api.md), versioned.
- `elastane.load_model(url)`: a PS job's model output read back (docs/model_output.md), with its
  app, values, metadata and `predict` / `evaluate`.
Everything else in the tree is internal and may change between releases.
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from elastane.model_output import SavedModel


def load_model(url: str | os.PathLike[str]) -> "SavedModel":
    """The model a PS job wrote to `url` (its `output`, or one of its epoch-N directories);
    see elastane.model_output. Imported on first use: `import elastane.app_api` stays cheap."""
    from elastane.model_output import load_model as load

    return load(url)


__all__ = ["load_model"]
