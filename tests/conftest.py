"""Shared fixtures: the tiny in-process model, BFCL tasks, and a scripted reference policy."""

from __future__ import annotations

import pytest

from envace.envs import registry
from envace.policy.backend import Generation, SamplingParams
from envace.policy.hf import HFBackend
from envace.policy.tiny import build_tiny


@pytest.fixture(scope="session")
def bfcl():
    return registry.get("bfcl")


@pytest.fixture(scope="session")
def tiny():
    """(model, tokenizer): 2-layer random-init Llama with an in-process BPE tokenizer."""
    return build_tiny()


@pytest.fixture()
def tiny_backend(tiny):
    model, tok = tiny
    return HFBackend(model, tok)


class ReferencePolicy:
    """A scripted policy: reads the prompt it is given and emits the task's next ground-truth call.

    It is a real `Backend` (token ids in, token ids out) that knows the answers, so the engine, the
    environment and the official checker can be tested end to end without a trained model.
    """

    def __init__(self, tokenizer, tasks, corrupt: str | None = None, rehearsal: str | None = None) -> None:
        self.tokenizer = tokenizer
        self.by_first_turn = {t.user_turns[0]: t for t in tasks}
        self.corrupt = corrupt
        self.rehearsal = rehearsal  # a fixed rehearser reply, else the real result of the matching reference call
        self.calls = 0
        self.prompts: list[list[int]] = []

    def _reply(self, prompt: list[int]) -> str:
        from envace.formats import render_tool_call

        text = self.tokenizer.decode(prompt, skip_special_tokens=False)
        if "## Call to simulate\n" in text:
            return self._rehearse(text)
        blocks = [b for b in text.split("<|im_start|>") if b.startswith("user\n")]
        first = blocks[0][len("user\n"):].split("<|im_end|>")[0]
        task = self.by_first_turn[first]
        user_blocks = [i for i, b in enumerate(blocks) if not b.startswith("user\n<tool_response>")]
        turn, step = len(user_blocks) - 1, len(blocks) - 1 - user_blocks[-1]
        if self.corrupt:
            return self.corrupt
        reference = task.reference[turn]
        return render_tool_call(reference[step].call) if step < len(reference) else "Done."

    def _rehearse(self, text: str) -> str:
        import json

        from envace.formats import as_json_value, render_execution_result

        if self.rehearsal is not None:
            return self.rehearsal
        call = json.loads(text.split("## Call to simulate\n", 1)[1].split("<|im_end|>")[0])
        task = next(t for first, t in self.by_first_turn.items() if f"User: {first}" in text)
        for turn in task.reference:
            for ref in turn:
                if ref.call.name == call["name"] and ref.call.arguments == call["arguments"]:
                    return render_execution_result(as_json_value(ref.result.content))
        return render_execution_result({"result": "ok"})

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        self.calls += 1
        self.prompts.extend(prompts)
        end = self.tokenizer.convert_tokens_to_ids("<|im_end|>")
        out = []
        for p in prompts:
            text = self._reply(p)
            out.append(Generation(ids=self.tokenizer.encode(text, add_special_tokens=False) + [end], text=text,
                                  finish="stop"))
        return out


@pytest.fixture()
def reference_policy(tiny):
    return lambda tasks, corrupt=None, rehearsal=None: ReferencePolicy(tiny[1], tasks, corrupt, rehearsal)
