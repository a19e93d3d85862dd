"""Ctrl-C and SIGTERM stop a command the same way, and neither is lost when it lands in a finalizer."""

from __future__ import annotations

import os
import signal
import sys
import threading


class Terminated(BaseException):
    """SIGTERM (`kill`, `timeout`, a job scheduler, the app's Stop): handled as Ctrl-C is."""


def _on_sigterm(signum, frame) -> None:
    raise Terminated()


def _redeliver_lost_stop(unraisable) -> None:
    """`sys.unraisablehook`: send again a Ctrl-C or SIGTERM that a finalizer swallowed.

    A signal handler raises in the main thread at whatever bytecode it is running; when that is a finalizer
    (a `__del__` run by the garbage collector: `regex`'s, torch's), Python prints the exception as "ignored"
    and carries on, and the stop is lost: the job ran to its end. The signal is sent again from another thread a
    moment later, when the finalizer has returned (if it lands in another one, this runs again)."""
    if isinstance(unraisable.exc_value, (KeyboardInterrupt, Terminated)):
        signum = signal.SIGTERM if isinstance(unraisable.exc_value, Terminated) else signal.SIGINT
        threading.Timer(0.05, os.kill, (os.getpid(), signum)).start()
        return
    _previous_unraisablehook(unraisable)


_previous_unraisablehook = sys.unraisablehook


def install_stop_handlers() -> None:
    """SIGTERM handled as Ctrl-C is, and neither of them lost in a finalizer (main thread only: Python's rule)."""
    if threading.current_thread() is threading.main_thread():
        global _previous_unraisablehook
        signal.signal(signal.SIGTERM, _on_sigterm)
        if sys.unraisablehook is not _redeliver_lost_stop:  # called again in one process (tests): chain once
            _previous_unraisablehook, sys.unraisablehook = sys.unraisablehook, _redeliver_lost_stop
