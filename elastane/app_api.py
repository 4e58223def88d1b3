"""The PS app API, version 1 (docs/app_api.md): what a user's model implements to train on Elastane.

A job names its app as `module:Class`; the class subclasses `PSApp` from here. Only the names in
`__all__` are public; they keep their meaning within a major `API_VERSION`.
"""
from __future__ import annotations

from psruntime.apps.base import (AppConfigError, Batch, KeyValues, ObjectivePart, Partition, PSApp, StepContext,
                                 parse_config)
from psruntime.apps.blocks import DataBlock

API_VERSION = "1.0"

__all__ = ["API_VERSION", "AppConfigError", "Batch", "DataBlock", "KeyValues", "ObjectivePart", "PSApp",
           "Partition", "StepContext", "parse_config"]
