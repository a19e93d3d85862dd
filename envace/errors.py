"""The one exception type that means "bad input", and the one place a program turns it into exit 2."""

from __future__ import annotations

import sys
from collections.abc import Callable


class UsageError(Exception):
    """Bad user input (unknown name, missing path, malformed config). Message is one clear line."""


class Stopped(Exception):
    """A job stopped by a fault it cannot work around (a learner rank of a Ray run died): one `stopped: …` line
    saying what happened and how to go on, exit 1, never a traceback; what it stored stays, `--resume` continues."""


def run_main(body: Callable[[], int]) -> int:
    """`body()`'s exit code; bad input (`UsageError`) is one `error: …` line on stderr and exit 2, argparse's code
    for it, never a traceback."""
    try:
        return body()
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
