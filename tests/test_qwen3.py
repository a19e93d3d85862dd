"""The Qwen3 path on a tiny random Qwen3-architecture model: its own chat template is kept (it renders tools),
the thinking switch reaches the template, and `<think>` blocks are stripped before any role's output is parsed."""

from pathlib import Path

import pytest

from envace.config import RolloutConfig
from envace.formats import strip_thinking
from envace.policy.backend import Generation
from envace.policy.hf import HFBackend
from envace.policy.tiny import build_tiny_tokenizer
from envace.policy.tokenizer import prepare_tokenizer, tool_chat_template
from envace.rehearsal.build import build_engine
from envace.rehearsal.prompts import ChatRenderer


@pytest.fixture(scope="module")
def qwen3():
    """(model, tokenizer): a 2-layer random Qwen3 with the tiny tokenizer and Qwen3's own chat template."""
    import torch
    import trl
    from transformers import Qwen3Config, Qwen3ForCausalLM

    tok = build_tiny_tokenizer()
    tok.chat_template = (Path(trl.__file__).parent / "chat_templates" / "qwen3.jinja").read_text()
    tok = prepare_tokenizer(tok)
    cfg = Qwen3Config(vocab_size=len(tok), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=32768,
                      tie_word_embeddings=True, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    return Qwen3ForCausalLM(cfg).eval(), tok


def test_the_models_own_template_is_kept_when_it_renders_tools(qwen3, tiny):
    _, tok = qwen3
    assert tok.chat_template != tool_chat_template() and "<think>" in tok.chat_template
    assert tiny[1].chat_template == tool_chat_template()  # a template that drops tools is replaced


@pytest.mark.parametrize("thinking", [False, True])
def test_the_switch_reaches_the_template_and_deltas_stay_append_only(qwen3, bfcl, thinking):
    _, tok = qwen3
    task = bfcl.load_tasks("multi_turn_base", "test", limit=1)[0]
    renderer = ChatRenderer(tok, "compact", thinking=thinking)
    opening = tok.decode(renderer.opening(task))
    assert opening.endswith("<think>\n\n</think>\n\n") != thinking  # off: the empty think block is prefilled
    from envace.types import ToolResult

    delta = tok.decode(renderer.tool_results([ToolResult('{"ok": 1}')]))
    assert delta.startswith("\n<|im_start|>user\n<tool_response>\n{\"ok\": 1}\n</tool_response><|im_end|>")
    assert delta.endswith("<|im_start|>assistant\n" + ("" if thinking else "<think>\n\n</think>\n\n"))


def test_strip_thinking():
    assert strip_thinking("<think>call <tool_call>x</tool_call></think>\nDone.") == "Done."
    assert strip_thinking("the plan\n</think>\n\nanswer") == "answer"  # the prompt opened the block
    assert strip_thinking("<think>cut off mid-thought") == ""
    assert strip_thinking("no thinking here") == "no thinking here"


class ThinkingScript:
    """A backend that thinks aloud before answering: a call inside the thinking must never run."""

    max_context = None

    def __init__(self, tok):
        self.tokenizer, self.calls, self.end = tok, 0, tok.convert_tokens_to_ids("<|im_end|>")

    def generate(self, prompts, params):
        self.calls += 1
        out = []
        for prompt in prompts:
            text = self.tokenizer.decode(prompt)
            if "## Call to simulate" in text:
                reply = '<think>it lists files</think>\n<execution_result>\n{"current_directory_content": []}' \
                        "\n</execution_result>"
            elif "<tool_response>" in text.rsplit("<|im_start|>user", 1)[-1]:
                reply = "<think>done now</think>\nDone."
            else:
                reply = ('<think>maybe <tool_call>\n{"name": "rm", "arguments": {"file_name": "x"}}\n</tool_call>'
                         '</think>\n<tool_call>\n{"name": "ls", "arguments": {}}\n</tool_call>')
            out.append(Generation(self.tokenizer.encode(reply, add_special_tokens=False) + [self.end], reply, "stop"))
        return out


def test_thinking_is_stripped_before_calls_and_rehearsals_are_parsed(qwen3, bfcl):
    _, tok = qwen3
    task = bfcl.load_tasks("multi_turn_base", "test", limit=1)[0]
    engine = build_engine(ThinkingScript(tok), bfcl, RolloutConfig(model="tiny", mode="rehearse", thinking=True,
                                                                   embedding=False, max_steps_per_turn=3))
    (ep,) = engine.run_batch([(task, 0)])
    assert {c["name"] for c in ep.calls} == {"ls"}  # the rm inside <think> was never issued
    assert all(g.parse_error is None for g in ep.generations)  # every rehearsal parsed after its thinking
    assert "maybe" not in " ".join(text for _, text in ep.history)  # the rehearser never reads the thinking


def test_a_tiny_qwen3_plays_episodes(qwen3, bfcl):
    model, tok = qwen3
    task = bfcl.load_tasks("multi_turn_base", "test", limit=1)[0]
    cfg = RolloutConfig(model="tiny", mode="real+shadow", max_new_tokens=8, max_steps_per_turn=1, embedding=False,
                        tool_docs="compact")
    (ep,) = build_engine(HFBackend(model, tok), bfcl, cfg).run_batch([(task, 0)])
    assert ep.generations and ep.termination in ("completed", "step_limit")
    assert all(len(g.gen.logprobs) == len(g.gen.ids) for g in ep.generations)
