"""Grounding examples for the rehearser: real (call, result) pairs it may imitate.

`reference` shows the episode's own task's ground-truth results (the reference release's choice:
strong grounding, but the answers leak). `other_tasks` draws only from *train-split* tasks other than
the current scenario, so no test answer is ever shown.
"""

from __future__ import annotations

from envace.config import RehearserOptions
from envace.formats import render_tool_call
from envace.rehearsal.prompts import Example
from envace.types import Task, ToolCall


def _examples(task: Task) -> list[Example]:
    return [Example(step.call, step.result.content) for turn in task.reference for step in turn]


class ExampleBank:
    """Train-split material for prompts: rehearser grounding and caller demonstrations."""

    def __init__(self, train_tasks: list[Task] | None = None) -> None:
        self.by_tool: dict[str, list[tuple[int, Example]]] = {}
        self.tasks = list(train_tasks or [])
        for task in self.tasks:
            if task.split != "train":
                raise ValueError(f"{task.uid} is not a train task; the bank must never hold test answers")
            for example in _examples(task):
                self.by_tool.setdefault(example.call.name, []).append((task.scenario, example))

    def for_call(self, task: Task, call: ToolCall, options: RehearserOptions) -> list[Example]:
        """Examples for rehearsing `call`: the same tool first, at most `options.max_examples`."""
        if options.fewshot == "reference":
            pool = _examples(task)
        elif options.fewshot == "other_tasks":
            pool = [e for scenario, e in self.by_tool.get(call.name, []) if scenario != task.scenario]
        else:
            return []
        same = [e for e in pool if e.call.name == call.name]
        return (same + [e for e in pool if e.call.name != call.name])[: options.max_examples]

    def demonstration(self, task: Task) -> list[dict[str, str]]:
        """A worked first turn of another train task with the same tools, as chat messages.

        The 135M default model copies the `<tool_call>` format from context but never produces it
        zero-shot, so an in-context demonstration is what makes its calls (and rehearsals) happen.
        """
        names = {t["function"]["name"] for t in task.tools}
        classes = task.payload.get("entry", {}).get("involved_classes")
        # Prefer a task over exactly the same tools, so the demonstration uses tools the caller has.
        ranked = sorted(self.tasks, key=lambda o: o.payload.get("entry", {}).get("involved_classes") != classes)
        for other in ranked:
            first = other.reference[0] if other.reference else []
            if other.scenario == task.scenario or not first or not {s.call.name for s in first} <= names:
                continue
            # A bare call as the previous assistant turn is the pattern it copies; showing the tool
            # response as well made it imitate the response block instead.
            return [{"role": "user", "content": other.user_turns[0]},
                    {"role": "assistant", "content": "\n".join(render_tool_call(s.call) for s in first)}]
        return []
