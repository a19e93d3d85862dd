"""Tokenizers made ready for the engine: a ChatML chat template that renders tools, left padding, a pad token."""

from __future__ import annotations

from pathlib import Path

END_OF_MESSAGE = "<|im_end|>"
_PROBE_TOOL = {"type": "function", "function": {"name": "envace_probe_tool", "description": "probe",
                                                "parameters": {"type": "object", "properties": {}}}}


def tool_chat_template() -> str:
    """A ChatML template that renders `tools=` (SmolLM2's own template silently drops them).

    Qwen2.5's template (the copy TRL ships as `chat_templates/qwen2_5.jinja`, kept here byte for byte so
    that loading a tokenizer needs neither TRL nor the `datasets` it imports) uses the same special tokens
    as SmolLM2 and is prefix-preserving.
    """
    return (Path(__file__).with_name("chatml_tools.jinja")).read_text(encoding="utf-8")


def renders_tools(tok) -> bool:
    """Whether the tokenizer's own template is ChatML and shows the tools it is given (Qwen2.5, Qwen3 do)."""
    if not getattr(tok, "chat_template", None):
        return False
    try:
        text = tok.apply_chat_template([{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}],
                                       tools=[_PROBE_TOOL], tokenize=False)
    except Exception:  # noqa: BLE001 - a template that cannot render this conversation is not usable here
        return False
    return "envace_probe_tool" in text and f"a{END_OF_MESSAGE}" in text


def prepare_tokenizer(tok):
    """The model's own template when it renders tools (else TRL's Qwen2.5 one), left padding for batched
    generation, and pad = eos (ChatML `<|im_end|>`)."""
    if not renders_tools(tok):
        tok.chat_template = tool_chat_template()
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok
