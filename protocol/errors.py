"""The project's exception root and its families.

Every exception class in the product packages derives from `ElastaneError` through one family
(tests/unit/test_errors.py walks the packages to check it). A class that derived from a builtin
before the families existed keeps that builtin as a second base -- e.g. `class ConfigError(
ConfigurationError, ValueError)` -- so every `except ValueError` (or `OSError`, `ConnectionError`,
`RuntimeError`) that caught it still does. The families carry no builtin of their own.
"""
from __future__ import annotations


class ElastaneError(Exception):
    """The root: every error the project defines is one of these."""


class ConfigurationError(ElastaneError):
    """What an operator gives is unusable: a config file or flag, CLI usage, a local resource or
    durable-storage location, a daemon's environment, a trace or calibration file."""


class ProtocolError(ElastaneError):
    """Wire, decoding and remote errors: a body or frame that does not decode, a token or handshake
    that fails, a remote answer that is an error, a peer that is gone, an ask the receiver refuses."""


class AppError(ElastaneError):
    """An ML app or its job: the job spec, data sets and block files, user code, model outputs,
    checkpoints and the model's stored blocks."""


class StateError(ElastaneError):
    """An event or call the current state does not allow: invalid transitions, lifecycle misuse,
    an operation on something that is not (or no longer) running."""


class PlanningError(ElastaneError):
    """Models, policies and planners: inputs a performance model cannot evaluate, a decision or plan
    that does not hold together, a solver with no feasible answer, a plan op that failed."""


class HostError(ElastaneError):
    """The host: processes, cgroups, shells, localization, spill files, bringing a cluster up."""


__all__ = ["AppError", "ConfigurationError", "ElastaneError", "HostError", "PlanningError", "ProtocolError",
           "StateError"]
