"""The Qwen3 path on a tiny random Qwen3-architecture model: its own chat template is kept (it renders tools),
the thinking switch reaches the template, `<think>` blocks are stripped before any role's output is parsed, and past
turns keep their thinking as sampled or drop it as the template does (`past_thinking`)."""

from pathlib import Path

import pytest

from envace.build import build_engine
from envace.config import RolloutConfig
from envace.engine.prompts import ChatRenderer
from envace.formats import strip_thinking
from envace.policy.backend import Generation
from envace.policy.hf import HFBackend
from envace.policy.tiny import build_tiny_tokenizer
from envace.policy.tokenizer import prepare_tokenizer, tool_chat_template
from envace.training.rows import training_rows


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


class CanonicalThinker:
    """A caller that thinks in the form Qwen3's template renders (`<think>\\nthought\\n</think>\\n\\n`), so a context
    can be compared with the template's rendering token for token; one `ls` call per turn, then "Done."."""

    max_context = None

    def __init__(self, tok, thinking: bool):
        self.tokenizer, self.thinking, self.prompts = tok, thinking, []
        self.end = tok.convert_tokens_to_ids("<|im_end|>")

    def generate(self, prompts, params):
        out = []
        for prompt in prompts:
            self.prompts.append(list(prompt))
            done = "<tool_response>" in self.tokenizer.decode(prompt).rsplit("<|im_start|>user", 1)[-1]
            reply = "Done." if done else '<tool_call>\n{"name": "ls", "arguments": {}}\n</tool_call>'
            if self.thinking:
                reply = f"<think>\nthought {len(self.prompts)}\n</think>\n\n{reply}"
            out.append(Generation(self.tokenizer.encode(reply, add_special_tokens=False) + [self.end], reply, "stop"))
        return out


def _play(qwen3, bfcl, thinking: bool, past_thinking: str):
    _, tok = qwen3
    task = bfcl.load_tasks("multi_turn_base", "test", limit=2)[1]  # three user turns
    backend = CanonicalThinker(tok, thinking)
    cfg = RolloutConfig(model="tiny", mode="real", thinking=thinking, past_thinking=past_thinking, embedding=False,
                        max_steps_per_turn=3)
    (ep,) = build_engine(backend, bfcl, cfg).run_batch([(task, 0)])
    callers = ep.of_role("caller")
    assert ep.termination == "completed" and [g.turn for g in callers] == [0, 0, 1, 1, 2, 2]
    return tok, task, backend, ep, callers


def _templated(tok, task, ep, callers, thinking: bool) -> list[list[int]]:
    """Each caller message's prompt as Qwen3's template renders the conversation before it (the caller's messages
    as sampled, thinking and all: the template drops what it drops)."""
    texts = iter(g.gen.text for g in callers)
    conversation = [{"role": "system", "content": task.system_prompt}]
    prompts = []
    for who, text in ep.history:
        if who == "Assistant":
            prompts.append(tok.encode(tok.apply_chat_template(conversation, tools=task.tools, tokenize=False,
                                                              add_generation_prompt=True, enable_thinking=thinking),
                                      add_special_tokens=False))
            conversation.append({"role": "assistant", "content": next(texts)})
        else:
            conversation.append({"role": "user" if who == "User" else "tool", "content": text})
    return prompts


def test_past_thinking_drop_renders_past_turns_as_the_template_does(qwen3, bfcl):
    tok, task, backend, ep, callers = _play(qwen3, bfcl, thinking=True, past_thinking="drop")
    later = tok.decode(callers[4].prompt(ep.ids))  # turn 2's first message
    assert "thought" not in later and "<think>" not in later  # turns 0 and 1 thought 1-4
    # every prompt is the template's rendering of the conversation so far: the thoughts of past user turns
    # dropped, the current turn's kept
    assert [g.prompt(ep.ids) for g in callers] == _templated(tok, task, ep, callers, thinking=True)
    assert "thought 1" in tok.decode(callers[1].prompt(ep.ids))
    # the rows trained are exactly the prompts the sampler saw, and the completions as sampled
    _, rows = training_rows([ep], ("caller",))
    assert [r.prompt_ids for r in rows] == backend.prompts
    assert [r.completion_ids for r in rows] == [g.gen.ids for g in callers]
    assert all(g.prompt_ids is not None for g in callers[:4])  # frozen when their turn's context was re-rendered


def test_past_thinking_keep_is_token_in_token_out(qwen3, bfcl):
    tok, task, backend, ep, callers = _play(qwen3, bfcl, thinking=True, past_thinking="keep")
    assert RolloutConfig(model="tiny").past_thinking == "keep"
    for g in callers:  # every prompt is a prefix of the one growing context, each message appended as sampled
        assert g.prompt_ids is None and ep.ids[g.prompt_len: g.prompt_len + len(g.gen.ids)] == g.gen.ids
    assert "thought 1" in tok.decode(callers[4].prompt(ep.ids))  # the whole thought of turn 0 stays
    assert callers[2].prompt(ep.ids) != _templated(tok, task, ep, callers, thinking=True)[2]
    _, rows = training_rows([ep], ("caller",))
    assert [r.prompt_ids for r in rows] == backend.prompts


def test_past_thinking_drop_without_thinking_drops_the_empty_think_block(qwen3, bfcl):
    tok, task, backend, ep, callers = _play(qwen3, bfcl, thinking=False, past_thinking="drop")
    templated = _templated(tok, task, ep, callers, thinking=False)
    # a turn's first prompt is the template's; within a turn the context grows as sampled (Qwen3's template
    # would also drop the empty think block of the turn's earlier messages)
    assert [g.prompt(ep.ids) for g in callers if g.turn_step == 0] == [templated[0], templated[2], templated[4]]
    assert tok.decode(callers[4].prompt(ep.ids)).count("<think>") == 1  # the generation prompt's own
    _, rows = training_rows([ep], ("caller",))
    assert [r.prompt_ids for r in rows] == backend.prompts
    _, kept, _, kept_ep, kept_callers = _play(qwen3, bfcl, thinking=False, past_thinking="keep")
    assert kept_callers[2].prompt(kept_ep.ids) != templated[2]  # the default keeps the empty think blocks
