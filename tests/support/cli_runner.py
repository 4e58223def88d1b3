"""Run the `elastane` CLI in-process for a test: its exit code and what it printed."""
from __future__ import annotations

import pytest

from elastane_cli import main as cli


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `elastane ARGV`; argparse's SystemExit gives the code too."""
    try:
        code = cli.main(argv)
    except SystemExit as e:  # argparse
        code = int(e.code or 0)
    out, err = capsys.readouterr()
    return code, out, err
