"""Prompt rendering as token ids, append-only (token-in, token-out).

The caller's context is one growing list of token ids. Generated ids are appended verbatim; only new
messages (tool responses, the next user turn) are rendered and tokenized, as the *delta* the chat
template adds after a finished assistant message. Nothing the model wrote is ever re-tokenized, so
the prompt of step k+1 always starts with the exact ids of step k's prompt and completion.
"""

from __future__ import annotations

import json
from typing import Any

from envace.types import Task, ToolResult

# A throwaway conversation ending in an assistant message: rendering it with and without the new
# messages isolates exactly the text the template adds for them.
_PREFIX = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
           {"role": "assistant", "content": "a"}]


class ChatRenderer:
    """Renders a task's opening prompt and later message deltas into token ids."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.end_of_message = tokenizer.convert_tokens_to_ids("<|im_end|>")
        prefix = self._render(_PREFIX, generation_prompt=False)
        if not prefix.endswith("<|im_end|>\n"):
            raise ValueError("chat template is not ChatML: the assistant message should end with <|im_end|>")
        # The generated message ends at <|im_end|>; the template's trailing newline belongs to the delta.
        self._prefix_len = len(prefix) - 1

    def _render(self, messages: list[dict[str, Any]], generation_prompt: bool,
                tools: list[dict[str, Any]] | None = None) -> str:
        return self.tokenizer.apply_chat_template(messages, tools=tools or None, tokenize=False,
                                                  add_generation_prompt=generation_prompt)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def opening(self, task: Task) -> list[int]:
        """System prompt with the task's tools, the first user turn, and the assistant header."""
        messages = [{"role": "system", "content": task.system_prompt},
                    {"role": "user", "content": task.user_turns[0]}]
        return self.encode(self._render(messages, generation_prompt=True, tools=task.tools))

    def delta(self, messages: list[dict[str, Any]]) -> list[int]:
        """Ids of `messages` plus the next assistant header, to append after a finished assistant message."""
        full = self._render(_PREFIX + messages, generation_prompt=True)
        return self.encode(full[self._prefix_len:])

    def tool_results(self, results: list[ToolResult]) -> list[int]:
        return self.delta([{"role": "tool", "content": r.content} for r in results])

    def user_turn(self, text: str, new_tools: list[dict[str, Any]] | None = None) -> list[int]:
        """The next user message; tools revealed at this turn are listed in it, as BFCL's prompting mode does."""
        if new_tools:
            listing = "\n".join(json.dumps(t, ensure_ascii=False) for t in new_tools)
            text = f"<tools>\n{listing}\n</tools>\n{text}"
        return self.delta([{"role": "user", "content": text}])
