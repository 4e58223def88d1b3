"""The apps by name: `get_app("mlr")` -> the app class; `create_app` builds a validated instance.

A job names a built-in app ("mlr", "nmf", "lda", "lasso") or a user's app as "module:Class"
(docs/app_api.md): the module is imported from sys.path with the process's working dir put first,
where the NM links the job's resources (a container started warm from the NM's executor zygote
inherits the zygote's sys.path, which does not have it). Errors are AppConfigError naming `app`;
an exception raised by the user's module while it is imported is left as it is (UserCodeError
wraps it with the traceback), so the AM can report the user's own traceback.

Each built-in app's module is imported when the app is first asked for: an executor runs one app,
and the others' imports (scipy.sparse for MLR / Lasso alone is ~0.1-0.2 s) would only delay its start.
"""
from __future__ import annotations

import importlib
import os
import sys
import traceback
from typing import Mapping

import msgspec

from protocol.ps_job_spec import USER_APP, JobSpecError, PSJobSpec
from psruntime.apps.base import AppConfigError, PSApp
from protocol.errors import AppError
from protocol.json_types import JsonValue

# name -> (module, class); tests/unit/test_apps_interface.py checks each class's `name` matches.
_APPS: dict[str, tuple[str, str]] = {
    "mlr": ("psruntime.apps.mlr", "MLRApp"),
    "nmf": ("psruntime.apps.nmf", "NMFApp"),
    "lda": ("psruntime.apps.lda", "LDAApp"),
    "lasso": ("psruntime.apps.lasso", "LassoApp"),
}
APP_NAMES: tuple[str, ...] = tuple(_APPS)


class UserCodeError(AppError, RuntimeError):
    """User code (a "module:Class" app's import, constructor or methods) raised; the message holds
    its traceback. The job fails with it: rerunning the same code would fail the same way."""

    def __init__(self, what: str, exc: BaseException) -> None:
        tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        super().__init__(f"{what}: {type(exc).__name__}: {exc}\n{tb}")
        self.what = what


def is_user_app(name: str) -> bool:
    """True for an app named as "module:Class" (a user's app), False for a built-in name."""
    return name not in _APPS and ":" in name


def raised_in_user_code(app: str, err: BaseException) -> bool:
    """Whether `err` (or an exception it was raised from) passed through the user app's package
    (`app` is "module:Class"): its traceback has a frame of that package's code. A user app's job
    also fails for the runtime's own reasons (an unreadable init_from or durable dir, a full spill
    disk, a refused arbiter request): those are not the user's code failing, and the user's
    `combine` raising in the AM, or its `compute` in an executor, is. (Here, not in the AM, so
    that the executors' app ops (psruntime.app_role) classify by the same rule.)"""
    package = app.split(":", 1)[0].split(".", 1)[0]
    seen: set[int] = set()
    e: BaseException | None = err
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        for frame, _ in traceback.walk_tb(e.__traceback__):
            name = frame.f_globals.get("__name__", "")
            if isinstance(name, str) and (name == package or name.startswith(package + ".")):
                return True
        e = e.__cause__ or e.__context__
    return False


def _working_dir_on_path() -> None:
    """Put the working dir first on sys.path: the job's shipped modules are linked there."""
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
        importlib.invalidate_caches()   # a finder cached before the links appeared would miss them


def _load_user_app(name: str) -> type[PSApp]:
    m = USER_APP.match(name)
    if m is None:
        raise AppConfigError(f"app: {name!r} is not \"module:Class\" (a dotted module name, a colon, a class name)")
    _working_dir_on_path()
    module_name, cls_name = m.group("module"), m.group("cls")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name is not None and module_name.startswith(e.name):
            raise AppConfigError(f"app: no module {module_name!r} (looked in {os.getcwd()} and sys.path; "
                                 "ship it with the job: --py-files / resources)") from None
        raise UserCodeError(f"app: importing {module_name}", e) from e
    except Exception as e:  # noqa: BLE001 - whatever the user's module raises is reported with its traceback
        raise UserCodeError(f"app: importing {module_name}", e) from e
    cls = getattr(module, cls_name, None)
    if cls is None:
        raise AppConfigError(f"app: module {module_name!r} ({getattr(module, '__file__', '?')}) has no {cls_name!r}")
    if not (isinstance(cls, type) and issubclass(cls, PSApp)):
        raise AppConfigError(f"app: {name} is not a subclass of elastane.app_api.PSApp")
    if getattr(cls, "__abstractmethods__", None):
        raise AppConfigError(f"app: {name} does not implement {sorted(cls.__abstractmethods__)}")
    for attr in ("name", "Spec", "HParams"):
        if not hasattr(cls, attr):
            raise AppConfigError(f"app: {name} has no class attribute {attr!r} (docs/app_api.md)")
    return cls


def get_app(name: str) -> type[PSApp]:
    """The app class registered as `name`, or a user's "module:Class" imported; AppConfigError
    naming `app` otherwise (UserCodeError if the user's module raised while imported)."""
    if isinstance(name, str) and is_user_app(name):
        return _load_user_app(name)
    try:
        module, cls_name = _APPS[name]
    except (KeyError, TypeError):
        raise AppConfigError(f"unknown app {name!r}; choose one of {list(APP_NAMES)} "
                             "or name a user app as \"module:Class\"") from None
    cls: type[PSApp] = getattr(importlib.import_module(module), cls_name)
    return cls


def _user_preset(cls: type[PSApp], preset: str | None) -> str | None:
    """A user app's preset: one of its PRESETS; an app without any takes the job spec's default
    ("tiny") as none at all."""
    if preset is None or preset in cls.PRESETS:
        return preset
    if not cls.PRESETS and preset == "tiny":
        return None
    raise AppConfigError(f"preset: app {cls.__module__}:{cls.__qualname__} has no preset {preset!r}; "
                         f"it has {sorted(cls.PRESETS) or 'none'}")


def create_app(name: str, spec: Mapping[str, JsonValue] | msgspec.Struct | None = None,
               hparams: Mapping[str, JsonValue] | msgspec.Struct | None = None,
               preset: str | None = None) -> PSApp:
    """Validated app instance from a job spec's builtins (errors name the bad field), or from the
    app's own Spec / HParams Structs, taken as they are. A user app's own errors (UserCodeError)
    carry its traceback; AppConfigError is a bad configuration."""
    cls = get_app(name)
    if not is_user_app(name):
        return cls.from_config(spec, hparams, preset)
    preset = _user_preset(cls, preset)
    try:
        return cls.from_config(spec, hparams, preset)
    except AppConfigError:
        raise
    except Exception as e:  # noqa: BLE001 - a user's from_config / constructor: report its traceback
        raise UserCodeError(f"app: constructing {name}", e) from e


def create_job_app(spec: PSJobSpec) -> PSApp:
    """The app of a PS job spec (protocol.ps_job_spec.PSJobSpec). A built-in app is built from the
    spec's `typed_data` / `typed_hparams`, decoded once (by `validate`) and taken as they are, so
    `app.spec is spec.typed_data`. A user app's data and hparams are decoded here, once, by its own
    class (its Spec / HParams, its presets under them): the app instance is where a user app's
    typed configuration lives (see protocol.ps_job_spec's module doc)."""
    if spec.is_user_app:
        return create_app(spec.app, spec.data, spec.app_hparams(), preset=spec.preset)
    try:
        data, hparams = spec.typed_data, spec.typed_hparams
    except JobSpecError as e:   # a spec made without validate(): the registry's own error
        raise AppConfigError(f"invalid {spec.app} job spec: {e}") from None
    return create_app(spec.app, data, hparams)
