"""The apps by name: `get_app("mlr")` -> the app class; `create_app` builds a validated instance."""
from __future__ import annotations

from typing import Any, Mapping

from psruntime.apps.base import AppConfigError, PSApp
from psruntime.apps.lasso import LassoApp
from psruntime.apps.lda import LDAApp
from psruntime.apps.mlr import MLRApp
from psruntime.apps.nmf import NMFApp

_APPS: dict[str, type[PSApp]] = {cls.name: cls for cls in (MLRApp, NMFApp, LDAApp, LassoApp)}
APP_NAMES: tuple[str, ...] = tuple(_APPS)


def get_app(name: str) -> type[PSApp]:
    """The app class registered as `name`; AppConfigError naming the choices otherwise."""
    try:
        return _APPS[name]
    except (KeyError, TypeError):
        raise AppConfigError(f"unknown app {name!r}; choose one of {list(APP_NAMES)}") from None


def create_app(name: str, spec: Mapping[str, Any] | None = None, hparams: Mapping[str, Any] | None = None,
               preset: str | None = None) -> PSApp:
    """Validated app instance from a job spec's builtins (errors name the bad field)."""
    return get_app(name).from_config(spec, hparams, preset)
