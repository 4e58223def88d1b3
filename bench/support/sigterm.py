"""SIGTERM for a benchmark: unwind like Ctrl-C, so the `finally` that stops the local cluster it
started runs and no RM, NM, AM or executor of it is left behind."""
from __future__ import annotations

import signal
from types import FrameType
from typing import Optional


def _exit(signum: int, frame: Optional[FrameType]) -> None:
    raise SystemExit(128 + signum)


def unwind_on_sigterm() -> None:
    """From now on SIGTERM raises SystemExit(143) in the main thread (through `asyncio.run` too)."""
    signal.signal(signal.SIGTERM, _exit)
