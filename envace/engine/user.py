"""The simulated user of a conversational benchmark (τ²): its own part, beside the engine that plays the caller.

A task with a `SimulatedUser` has no scripted user turns: the episode starts waiting on its user, and
the `user` role (the policy's backend, or another model's) writes the next user message of every
waiting episode in one backend call. The user sees its instructions and the conversation with roles
flipped (the caller's plain answers as `user`, never its tool calls). A stop signal ends the episode as
`completed`; calls to the user's own tools run through `execute_user` and count as steps of the turn;
any other message opens the caller's next turn. User generations are recorded with role `user` and are
never trained.
"""

from __future__ import annotations

from envace.engine.episode import Episode
from envace.engine.prompts import ChatRenderer
from envace.engine.sampler import Sampler
from envace.formats import parse_tool_calls, strip_thinking
from envace.policy.backend import Backend
from envace.types import Role


class UserSimulator:
    def __init__(self, sampler: Sampler, renderer: ChatRenderer, backend: Backend | None = None,
                 max_new_tokens: int = 128, max_tool_steps: int = 20) -> None:
        # backend None: the policy plays the user too; `renderer` renders prompts for the user's tokenizer
        self.sampler, self.renderer, self.backend = sampler, renderer, backend
        self.max_new_tokens, self.max_tool_steps = max_new_tokens, max_tool_steps

    @staticmethod
    def start(ep: Episode) -> None:
        """The conversation opens with the agent's greeting, which the user answers first."""
        ep.user_view.append({"role": "user", "content": ep.task.simulated_user.greeting})
        ep.awaiting_user = True

    @staticmethod
    def hear(ep: Episode, text: str) -> None:
        """The caller's plain answer reaches the user, who writes next."""
        ep.user_view.append({"role": "user", "content": text})
        ep.awaiting_user = True

    def respond(self, waiting: list[Episode]) -> list[Episode]:
        """Write every waiting episode's next user message; returns those whose message opens a caller turn."""
        prompts = [self.renderer.messages([{"role": "system", "content": ep.task.simulated_user.system_prompt},
                                           *ep.user_view], ep.task.simulated_user.tools or None)
                   for ep in waiting]
        gens = self.sampler(prompts, self.max_new_tokens, backend=self.backend, tasks=[ep.task.uid for ep in waiting])
        opened = []
        for ep, prompt, gen in zip(waiting, prompts, gens, strict=True):
            ep.record(Role.USER, gen, len(prompt), prompt_ids=prompt, call_index=0)
            text = strip_thinking(gen.text).strip()
            ep.user_view.append({"role": "assistant", "content": text})
            user = ep.task.simulated_user
            calls = parse_tool_calls(text).calls if user.tools else []
            if user.stopped(text):
                ep.termination = "completed"
            elif calls:
                results = [ep.env.execute_user(call) for call in calls]
                ep.steps[ep.turn].append([c for c, r in zip(calls, results, strict=True) if r.dispatched])
                ep.user_view.extend({"role": "tool", "content": r.content} for r in results)
                if sum(g.turn == ep.turn for g in ep.of_role(Role.USER)) >= self.max_tool_steps:
                    ep.termination = "step_limit"
            else:
                ep.awaiting_user = False
                ep.task.user_turns.append(text)
                ep.history.append(("User", text))
                opened.append(ep)
        return opened
