"""The layers above `envace` (the app, the store benchmark) run as their own programs, so no import arrow points up."""

from __future__ import annotations

import os
import sys


def run_module(module: str, argv: list[str]) -> int:
    """Replace this process with `python -m module argv…`."""
    sys.stdout.flush()
    os.execv(sys.executable, [sys.executable, "-m", module, *argv])
    return 0  # not reached
