"""Whether a process still runs: what a run marked `running` or a reserved port is kept alive by."""

from __future__ import annotations

import os


def alive(pid: int | None) -> bool:
    """True while process `pid` exists (also one of another user's, which we may not signal)."""
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
