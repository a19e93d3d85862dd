"""A scripted policy that replays each task's reference trajectory, as a real `Backend`.

Each prompt's task is named by its uid (`SamplingParams.tasks`, passed by the engine). As caller it reads
the prompt it is given (rendered by our own `ChatRenderer`), recovers the user turn and step, and emits
that step's ground-truth call, or "Done." once the turn's calls are made (the task's `reference_answer` at the
end of its last turn, where it has one). As rehearser it answers a call
with the real result of the matching reference call; as a simulated user it says the task's scripted
messages; as summariser it writes a memory naming what it was written from; as the judge of an imagined
attempt (private rehearsal's `memory = select`) it says yes when the attempt made every gold call of the turn
judged, as the caller writes it, and no otherwise. Running the
rollout engine with it yields exactly the rows a perfect policy would produce, token for token in
the engine's own prompts: SFT data for the warm-up, and an end-to-end check of engine, environment
and checker.
"""

from __future__ import annotations

import json

from envace.formats import as_json_value, render_execution_result, render_tool_call
from envace.policy.backend import Generation, SamplingParams
from envace.types import Task
from envace.units import whole_uid

_CALL_HEADER = "## Call to simulate\n"
_HISTORY_HEADER = "## Conversation so far\n"
_ATTEMPT_HEADER = "## Imagined attempt"
_MEMORY = "\n\n<rehearsal_memory>"
_JUDGE_HEADER = "## Attempt to judge\n"  # `private.selection.judge_prompt`'s
_REQUEST_HEADER = "## User request\n"


class ReferencePolicy:
    """Replays the reference of each prompt's task, found by the uid the engine passes (`SamplingParams.tasks`).

    Tasks may share their opening (τ² telecom has 5 distinct tickets among 114 tasks), so the uid decides; a
    prompt that comes without one (a backend call from outside the engine) falls back to the task whose first
    user turn the prompt shows. As simulated user it plays the task's `SimulatedUser.script`, message by message.
    """

    max_context: int | None = None  # replays text: no context window to respect
    concurrent = True  # keeps nothing between calls but a count and the prompts seen: threads may call it at once

    def __init__(self, tokenizer, tasks: list[Task], caller_text: str | None = None,
                 rehearsal_text: str | None = None) -> None:
        self.tokenizer = tokenizer
        self.by_uid = {t.uid: t for t in tasks}
        # conversations a benchmark plays before a task (BFCL memory's prerequisites): nothing to replay, "Done."
        for task in tasks:
            for uid in task.payload.get("prerequisites", ()):
                self.by_uid.setdefault(uid, Task(uid, task.env, task.category, task.split, task.scenario, "", [],
                                                 [""], []))
        self.by_first_turn = {t.user_turns[0]: t for t in tasks}
        self.caller_text = caller_text  # a fixed caller reply instead of the reference (for tests)
        self.rehearsal_text = rehearsal_text  # a fixed rehearser reply instead of the real result
        self.end = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.calls = 0
        self.prompts: list[list[int]] = []

    def task_of(self, uid: str | None, text: str) -> Task | None:
        """The task a prompt belongs to: by its uid (a turn unit's own, else the whole task's), else by its text."""
        if uid:
            task = self.by_uid.get(uid) or self.by_uid.get(whole_uid(uid))
            if task is not None:
                return task
        return next((t for first, t in self.by_first_turn.items() if f"User: {first}" in text or
                     f"user\n{first}" in text), None)

    @staticmethod
    def _openings(task: Task) -> set[str]:
        """The user texts that can open an episode of `task`: its first turn, or its scripted user's first message."""
        script = task.simulated_user.script if task.simulated_user is not None else ()
        return {task.user_turns[0], *script[:1]}

    def _caller(self, text: str, task: Task | None) -> str:
        if self.caller_text is not None:
            return self.caller_text
        if task is None:
            raise LookupError("the reference policy holds no task for this caller prompt")
        blocks = [b[len("user\n"):].split("<|im_end|>")[0].split(_MEMORY)[0]
                  for b in text.split("<|im_start|>") if b.startswith("user\n")]
        users = [i for i, b in enumerate(blocks) if not b.startswith("<tool_response>")]
        # the task's own first turn is the last opening seen (a caller demonstration may come before it)
        openings = self._openings(task)
        start = max((i for i in users if blocks[i] in openings), default=users[0])
        turn, step = sum(i > start for i in users), len(blocks) - 1 - users[-1]
        reference = task.reference[turn] if turn < len(task.reference) else []
        # the last turn closes with the answer a perfect caller gives, where the task has one (BFCL memory)
        done = task.payload.get("reference_answer", "Done.") if turn == len(task.user_turns) - 1 else "Done."
        if task.max_steps_per_turn == 1:  # a turn of one message (BFCL single-turn): every call in it, in parallel
            return "\n".join(render_tool_call(r.call) for r in reference) if step == 0 and reference else done
        return render_tool_call(reference[step].call) if step < len(reference) else done

    def _rehearser(self, text: str, task: Task | None) -> str:
        if self.rehearsal_text is not None:
            return self.rehearsal_text
        if task is None:
            raise LookupError("the reference policy holds no task for this rehearser prompt")
        call = json.loads(text.rsplit(_CALL_HEADER, 1)[1].split("<|im_end|>")[0])
        gold = [ref for turn in task.reference for ref in turn]
        same = [ref for ref in gold if ref.call.name == call["name"] and ref.call.arguments == call["arguments"]]
        # the call at the position the conversation has reached (a call made twice may get two results), else
        # the first gold call like it
        if _HISTORY_HEADER in text:
            answered = text.split(_HISTORY_HEADER, 1)[1].split("\n\n## ", 1)[0].count("\nTool[")
            at = gold[answered] if answered < len(gold) else None
            if at is not None and at.call.name == call["name"] and at.call.arguments == call["arguments"]:
                same = [at]
        if same:
            return render_execution_result(as_json_value(same[0].result.content))
        return render_execution_result({"error": "no such call in the reference"})

    @staticmethod
    def _user(text: str, task: Task) -> str:
        """The scripted user's next message: as many as it has written so far (its own turns are `assistant`)."""
        script = task.simulated_user.script
        written = text.count("<|im_start|>assistant") - 1  # the last one is the generation header
        return script[min(written, len(script) - 1)]

    @staticmethod
    def _summariser(text: str) -> str:
        """A memory that says what it was written from: the attempts it saw and the memory it revised."""
        attempts = text.count(_ATTEMPT_HEADER)
        before = text.split("## Memory so far\n", 1)[1].split("\n\n")[0] if "## Memory so far\n" in text else ""
        return f"[{before}] + {attempts} attempt(s)" if before else f"{attempts} attempt(s)"

    @staticmethod
    def _judge(text: str, task: Task | None) -> str:
        """yes when the attempt's messages made every gold call of the turn its request opens (as `_caller` writes
        them: same name, same arguments), no otherwise."""
        if task is None:
            raise LookupError("the reference policy holds no task for this judge prompt")
        request = text.split(_REQUEST_HEADER, 1)[1].split("\n\n" + _JUDGE_HEADER, 1)[0]
        attempt = text.split(_JUDGE_HEADER, 1)[1]
        turn = next((k for k, t in enumerate(task.user_turns) if t == request), None)
        gold = task.reference[turn] if turn is not None and turn < len(task.reference) else []
        made = [render_tool_call(s.call) in attempt for s in gold]
        return "yes" if all(made) and turn is not None else "no"

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        self.calls += 1
        self.prompts.extend(prompts)
        out = []
        for n, prompt in enumerate(prompts):
            text = self.tokenizer.decode(prompt, skip_special_tokens=False)
            if _JUDGE_HEADER in text:
                uid = params.tasks[n] if n < len(params.tasks) else None
                reply = self._judge(text, self.task_of(uid, text))
            elif _ATTEMPT_HEADER in text:
                reply = self._summariser(text)
            else:
                task = self.task_of(params.tasks[n] if n < len(params.tasks) else None, text)
                user = task.simulated_user if task is not None else None
                if user is not None and user.script and user.system_prompt in text:  # the user's own prompt
                    reply = self._user(text, task)
                elif _CALL_HEADER in text:
                    reply = self._rehearser(text, task)
                else:
                    reply = self._caller(text, task)
            ids = self.tokenizer.encode(reply, add_special_tokens=False) + [self.end]
            out.append(Generation(ids=ids, text=reply, finish="stop"))
        return out
