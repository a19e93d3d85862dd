"""Grounding examples for the rehearser: real (call, result) pairs it may imitate.

`reference` shows the episode's own task's ground-truth results (the reference release's choice:
strong grounding, but the answers leak). `other_tasks` draws only from *train-split* tasks other than
the current scenario, so no test answer is ever shown.
"""

from __future__ import annotations

from envace.config import RehearserOptions
from envace.rehearsal.prompts import Example
from envace.types import Task, ToolCall


def _examples(task: Task) -> list[Example]:
    return [Example(step.call, step.result.content) for turn in task.reference for step in turn]


class ExampleBank:
    def __init__(self, train_tasks: list[Task] | None = None) -> None:
        self.by_tool: dict[str, list[tuple[int, Example]]] = {}
        for task in train_tasks or []:
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
