"""argparse `type=` parsers shared by the CLI's commands: each names the flag in its message,
which argparse prints after the usage line with exit code 2."""
from __future__ import annotations

import argparse
import math
from typing import Callable

from protocol import ids
from protocol.app_timeouts import LifetimeError, check_lifetime_s


def positive_int(label: str) -> Callable[[str], int]:
    """An integer >= 1 for the flag `label`."""
    def parse(v: str) -> int:
        try:
            n = int(v)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{label} must be an integer, got {v!r}") from None
        if n <= 0:
            raise argparse.ArgumentTypeError(f"{label} must be positive, got {n}")
        return n
    return parse


def lifetime_s(label: str) -> Callable[[str], int]:
    """An app lifetime in seconds for the flag `label`: 1 .. 100 years, as the RM takes it."""
    as_int = positive_int(label)

    def parse(v: str) -> int:
        n = as_int(v)
        try:
            check_lifetime_s(n)
        except LifetimeError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
        return n
    return parse


def non_negative_float(label: str) -> Callable[[str], float]:
    """A finite number >= 0 for the flag `label` (seconds, mostly)."""
    return _finite_float(label, positive=False)


def positive_float(label: str) -> Callable[[str], float]:
    """A finite number > 0 for the flag `label` (an interval, mostly)."""
    return _finite_float(label, positive=True)


def _finite_float(label: str, positive: bool) -> Callable[[str], float]:
    bound = "> 0" if positive else ">= 0"

    def parse(v: str) -> float:
        try:
            x = float(v)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{label} must be a number, got {v!r}") from None
        if not ((0 < x) if positive else (0 <= x)) or not x < math.inf:      # also refuses nan
            raise argparse.ArgumentTypeError(f"{label} must be a finite number {bound}, got {v}")
        return x
    return parse


def application_id(v: str) -> str:
    """An application id (application_<cluster timestamp>_<number>), normalised."""
    try:
        return str(ids.ApplicationId.parse(v))
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
