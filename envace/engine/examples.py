"""Grounding examples for the rehearser: real (call, result) pairs it may imitate.

`reference` shows the episode's own task's ground-truth results (the reference release's choice:
strong grounding, but the answers leak). `other_tasks` draws only from *train-split* tasks outside the
current task's group (`types.task_group`: near-duplicates share one), so no test answer is ever shown. Only
protocol fields are read (`Task.tools`, `reference`, `user_turns`, the group), so any benchmark gets both.
"""

from __future__ import annotations

from envace.config import RehearserOptions
from envace.engine.prompts import Example
from envace.formats import render_tool_call
from envace.types import Task, ToolCall, task_group


def _tool_names(task: Task) -> set[str]:
    return {t["function"]["name"] for t in task.tools}


def _examples(task: Task) -> list[Example]:
    return [Example(step.call, step.result.content) for turn in task.reference for step in turn]


class ExampleBank:
    """Train-split material for prompts: rehearser grounding and caller demonstrations."""

    def __init__(self, train_tasks: list[Task] | None = None) -> None:
        self.by_tool: dict[str, list[tuple[str, Example]]] = {}
        self.tasks = list(train_tasks or [])
        for task in self.tasks:
            if task.split != "train":
                raise ValueError(f"{task.uid} is not a train task; the bank must never hold test answers")
            for example in _examples(task):
                self.by_tool.setdefault(example.call.name, []).append((task_group(task), example))

    def for_call(self, task: Task, call: ToolCall, options: RehearserOptions) -> list[Example]:
        """Examples for rehearsing `call`: the same tool first, at most `options.max_examples`."""
        if options.fewshot == "reference":
            pool = _examples(task)
        elif options.fewshot == "other_tasks":
            group = task_group(task)
            pool = [e for other, e in self.by_tool.get(call.name, []) if other != group]
        else:
            return []
        same = [e for e in pool if e.call.name == call.name]
        return (same + [e for e in pool if e.call.name != call.name])[: options.max_examples]

    def demonstration(self, task: Task) -> list[dict[str, str]]:
        """A worked first turn of another train task with the same tools, as chat messages.

        The 135M default model copies the `<tool_call>` format from context but never produces it
        zero-shot, so an in-context demonstration is what makes its calls (and rehearsals) happen.
        """
        names = _tool_names(task)
        group = task_group(task)
        # Prefer a task over exactly the same tools, so the demonstration uses tools the caller has.
        ranked = sorted(self.tasks, key=lambda o: _tool_names(o) != names)
        for other in ranked:
            first = other.reference[0] if other.reference else []
            if task_group(other) == group or not first or not {s.call.name for s in first} <= names:
                continue
            # A bare call as the previous assistant turn is the pattern it copies; showing the tool
            # response as well made it imitate the response block instead.
            return [{"role": "user", "content": other.user_turns[0]},
                    {"role": "assistant", "content": "\n".join(render_tool_call(s.call) for s in first)}]
        return []
