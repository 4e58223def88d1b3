"""The apps by name: `get_app("mlr")` -> the app class; `create_app` builds a validated instance.

Each app's module is imported when the app is first asked for: an executor runs one app, and the
others' imports (scipy.sparse for MLR / Lasso alone is ~0.1-0.2 s) would only delay its start.
"""
from __future__ import annotations

import importlib
from typing import Any, Mapping

from psruntime.apps.base import AppConfigError, PSApp

# name -> (module, class); tests/test_apps_interface.py checks each class's `name` matches.
_APPS: dict[str, tuple[str, str]] = {
    "mlr": ("psruntime.apps.mlr", "MLRApp"),
    "nmf": ("psruntime.apps.nmf", "NMFApp"),
    "lda": ("psruntime.apps.lda", "LDAApp"),
    "lasso": ("psruntime.apps.lasso", "LassoApp"),
}
APP_NAMES: tuple[str, ...] = tuple(_APPS)


def get_app(name: str) -> type[PSApp]:
    """The app class registered as `name`; AppConfigError naming the choices otherwise."""
    try:
        module, cls_name = _APPS[name]
    except (KeyError, TypeError):
        raise AppConfigError(f"unknown app {name!r}; choose one of {list(APP_NAMES)}") from None
    cls: type[PSApp] = getattr(importlib.import_module(module), cls_name)
    return cls


def create_app(name: str, spec: Mapping[str, Any] | None = None, hparams: Mapping[str, Any] | None = None,
               preset: str | None = None) -> PSApp:
    """Validated app instance from a job spec's builtins (errors name the bad field)."""
    return get_app(name).from_config(spec, hparams, preset)
