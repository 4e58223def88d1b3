"""Every exception class the product packages define derives from protocol.errors.ElastaneError."""
from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

from protocol import errors
from protocol.state_machine import InvalidTransition

PACKAGES = ["protocol", "models", "rm", "nodemanager", "psruntime", "appmaster", "elastane_cli", "sim", "elastane"]
FAMILIES = (errors.ConfigurationError, errors.ProtocolError, errors.AppError, errors.StateError,
            errors.PlanningError, errors.HostError)


def _exception_classes() -> list[type[BaseException]]:
    found: list[type[BaseException]] = []
    for name in PACKAGES:
        pkg = importlib.import_module(name)
        modules = [pkg] + [importlib.import_module(m.name)
                           for m in pkgutil.walk_packages(pkg.__path__, prefix=f"{name}.")
                           if not m.name.endswith("__main__")]
        for mod in modules:
            for _, obj in inspect.getmembers(mod, inspect.isclass):
                if obj.__module__ == mod.__name__ and issubclass(obj, BaseException):
                    found.append(obj)
    return found


def test_the_walk_finds_the_project_exceptions() -> None:
    names = {c.__qualname__ for c in _exception_classes()}
    assert {"ConfigError", "DecodeError", "ApiError", "InvalidTransition", "CliError"} <= names
    assert len(names) > 60


@pytest.mark.parametrize("cls", _exception_classes(), ids=lambda c: f"{c.__module__}.{c.__qualname__}")
def test_every_exception_derives_from_elastane_error_through_one_family(cls: type[BaseException]) -> None:
    assert issubclass(cls, errors.ElastaneError), cls
    if cls is not errors.ElastaneError and cls not in FAMILIES:
        assert any(issubclass(cls, f) for f in FAMILIES), cls


def test_families_carry_no_builtin_so_builtins_come_from_the_classes() -> None:
    for fam in FAMILIES:
        assert fam.__bases__ == (errors.ElastaneError,)
    from protocol.config import ConfigError
    from psruntime.wire.dataplane import PeerLost
    assert issubclass(ConfigError, ValueError) and issubclass(ConfigError, errors.ConfigurationError)
    assert issubclass(PeerLost, ConnectionError) and issubclass(PeerLost, errors.ProtocolError)


def test_one_invalid_transition_for_rm_nm_and_migration() -> None:
    from nodemanager import container_state
    from psruntime.store import migration
    from rm import state_machines
    assert state_machines.InvalidTransition is container_state.InvalidTransition is migration.InvalidTransition
    assert InvalidTransition is migration.InvalidTransition
    assert issubclass(InvalidTransition, ValueError) and issubclass(InvalidTransition, RuntimeError)
