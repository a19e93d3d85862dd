"""A VitaBench episode: one database per task, tools run by the domain's toolbox.

Results follow upstream's calling convention (TOOLS.md §1): a string passes through, a number becomes the
JSON text of its Python text (`"35.0"`, quotes included), a list a JSON list of such texts; a soft failure
is a plain sentence with the error flag off; a hard failure (the tool raised) is `Error: <message>` with the
flag on, as `EXECUTION_ERROR`. As upstream, no argument is checked against the schema first
(`validate_arguments`): `get_holiday_date(year=2025)` runs with its integer, and a call the tool cannot take
fails in the tool (`Error: …`). A tool the task does not have is still refused before any runs.

`score` replays the episode's dispatched calls on a fresh database and runs §7's end-state check on it
(an offline deterministic substitute for the official LLM judge; not comparable with published numbers).
Ids of created records are deterministic per episode, so the replay reaches the same ids the caller saw.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from envace.envs.base import Environment, Steps
from envace.envs.vitabench.db import Database
from envace.envs.vitabench.scoring import CAVEAT, end_state_score
from envace.envs.vitabench.tools_delivery import DeliveryTools
from envace.envs.vitabench.tools_instore import InstoreTools
from envace.types import Score, Task, ToolCall, ToolResult

TOOLBOXES = {"delivery": DeliveryTools, "instore": InstoreTools}


def render(value: Any) -> str:
    """Upstream's serialization of a tool's return value (§1)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list | tuple):
        return json.dumps([str(v) for v in value], ensure_ascii=False)
    return json.dumps(str(value), ensure_ascii=False)


def result_is_error(content: str) -> bool:
    """VitaBench's failure convention for results the environment did not flag itself (a rehearser's): a hard
    failure reads `Error: <message>`. Soft failures are plain sentences, indistinguishable from answers."""
    return content.startswith("Error:")


class VitaBenchEnv(Environment):
    """VitaBench delivery or in-store (English or Chinese): state is one `Database` per episode."""

    validate_arguments = False
    result_is_error = staticmethod(result_is_error)

    def _setup(self, task: Task) -> None:
        self.db = Database.of(task.payload["task"]["environment"])
        self.toolbox = TOOLBOXES[task.payload["domain"]](self.db, task.payload["lang"])

    def _dispatch(self, call: ToolCall) -> ToolResult:
        method = None if call.name.startswith("_") else getattr(self.toolbox, call.name, None)
        if method is None:
            return ToolResult(f"Error: Tool '{call.name}' not found.", is_error=True, error_kind="EXECUTION_ERROR")
        try:
            value = method(**copy.deepcopy(call.arguments))
        except Exception as exc:  # a hard failure is the caller's observation (§1)
            return ToolResult(f"Error: {exc}", is_error=True, error_kind="EXECUTION_ERROR")
        return ToolResult(render(value))

    def score(self, task: Task, steps: Steps, texts: list[str] | None = None,
              termination: str = "completed") -> Score:
        """§7 on the state the dispatched calls leave, replayed on a fresh episode; `texts` are not read.

        An episode the engine did not end `completed` scores 0, as the official runner scores step-limit
        endings.
        """
        if termination != "completed":
            return Score(False, f"terminated ({termination}); {CAVEAT}", value=0.0)
        replay = VitaBenchEnv()
        replay.reset(task)
        for call in (call for turn in steps for step in turn for call in step):
            replay.execute(call)
        return end_state_score(self.initial(task), replay.db, task.payload["required_orders"])

    @staticmethod
    def initial(task: Task) -> Database:
        """The task's database as it is before any call."""
        return Database.of(task.payload["task"]["environment"])
