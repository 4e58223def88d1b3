"""SIGTERM for a benchmark: unwind like Ctrl-C, so the `finally` that stops the local cluster it
started runs and no RM, NM, AM or executor of it is left behind. The handler is the CLI's
(`elastane_cli.processes.unwind_on_sigterm`, which `elastane sim calibrate` uses too); every
benchmark puts the project root on sys.path before importing this."""
from __future__ import annotations

from elastane_cli.processes import unwind_on_sigterm

__all__ = ["unwind_on_sigterm"]
