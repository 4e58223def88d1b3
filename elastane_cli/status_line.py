"""The live one-line status of an app (state, progress, elapsed), redrawn in place with \\r."""
from __future__ import annotations

import sys
from typing import TextIO

from protocol.yarn_views import AppView

from .tables import format_duration


def format_status(app: AppView, elapsed_s: float) -> str:
    """`application_..._0001  RUNNING  progress 40%  elapsed 3.2s` from a YARN app record."""
    state = app.get("state", "?")
    try:
        progress = float(app.get("progress") or 0.0)
    except (TypeError, ValueError):
        progress = 0.0
    line = f"{app.get('id', '?')}  {state:<9}  progress {progress:3.0f}%  elapsed {format_duration(elapsed_s)}"
    final = app.get("finalStatus")
    if final and final != "UNDEFINED":
        line += f"  final {final}"
    return line


class StatusLine:
    """Redraws one terminal line; on a non-tty it prints only when the text changes (ignoring time)."""

    def __init__(self, out: TextIO | None = None):
        self.out = out or sys.stdout
        self._width = 0
        self._last_key: str | None = None
        self._tty = bool(getattr(self.out, "isatty", lambda: False)())

    def update(self, text: str, key: str | None = None) -> None:
        if self._tty:
            pad = max(0, self._width - len(text))
            self.out.write("\r" + text + " " * pad)
            self._width = len(text)
            self.out.flush()
        elif key != self._last_key:
            # Logs and pipes get one line per change of state, not a flood of \r frames.
            self.out.write(text + "\n")
            self.out.flush()
        self._last_key = key

    def finish(self, text: str | None = None) -> None:
        """End the live line (optionally with a last frame) and move to a new line."""
        if text is not None:
            self.update(text, key=None if self._tty else f"final:{text}")
        if self._tty:
            self.out.write("\n")
            self.out.flush()
        self._width = 0
