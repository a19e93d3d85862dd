"""A free localhost port, for tests that start a server of their own."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A port the kernel has just handed out on 127.0.0.1 (free until something else binds it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
