"""The app's one clock: every view adds what it re-reads from the store, and each tick is one event.

Why one event: the browser redraws the page's status for every event it runs, whatever the event returns. Seven
views each listening to the timer made seven events every 5 s, and headless Chromium spent about half a core on
an idle Launch tab (a job started from it ran 3× slower on two cores; `docs/benchmarks.md`). One event per tick,
with no progress spinner, costs the browser one redraw.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence

import gradio as gr


class Ticks:
    """`add(fn, inputs, outputs)` as `timer.tick(fn, inputs, outputs)` would, then `wire()` once, after every view
    is built. A part that raises shows its error as a warning and leaves its own outputs as they were; the other
    parts still update."""

    def __init__(self, seconds: float):
        self.timer = gr.Timer(seconds)
        self.parts: list[tuple[Callable, list, list]] = []

    def add(self, fn: Callable, inputs: gr.components.Component | Sequence, outputs: gr.components.Component |
            Sequence) -> None:
        listed = [inputs] if isinstance(inputs, gr.components.Component) else list(inputs)
        self.parts.append((fn, listed, [outputs] if isinstance(outputs, gr.components.Component) else list(outputs)))

    def wire(self) -> None:
        inputs = list({id(c): c for _, ins, _ in self.parts for c in ins}.values())
        outputs = [c for *_, outs in self.parts for c in outs]
        if len({id(c) for c in outputs}) != len(outputs):
            raise ValueError("two views update the same component on the tick")
        at = {id(c): i for i, c in enumerate(inputs)}
        parts = [(fn, [at[id(c)] for c in ins], len(outs), _request_parameter(fn)) for fn, ins, outs in self.parts]

        def tick(request: gr.Request, *values):  # first: Gradio fills only positional parameters
            out: list = []
            for fn, picks, n, wants_request in parts:
                try:
                    got = fn(*(values[i] for i in picks), **({wants_request: request} if wants_request else {}))
                    out.extend([got] if n == 1 else got)
                except Exception as exc:  # one view's failure must not freeze the others
                    gr.Warning(f"{getattr(fn, '__name__', 'a view')}: {exc}")
                    out.extend([gr.skip()] * n)
            return out

        self.timer.tick(tick, inputs, outputs, show_progress="hidden")


def _request_parameter(fn: Callable) -> str | None:
    """The name of `fn`'s `gr.Request` parameter, which Gradio fills for an event's own function only."""
    return next((name for name, p in inspect.signature(fn).parameters.items() if p.annotation in
                 (gr.Request, "gr.Request")), None)
