"""Tokenizers made ready for the engine: a ChatML chat template that renders tools, left padding, a pad token."""

from __future__ import annotations

END_OF_MESSAGE = "<|im_end|>"
_PROBE_TOOL = {"type": "function", "function": {"name": "envace_probe_tool", "description": "probe",
                                                "parameters": {"type": "object", "properties": {}}}}


def tool_chat_template() -> str:
    """A ChatML template that renders `tools=` (SmolLM2's own template silently drops them).

    TRL's Qwen2.5 template uses the same special tokens as SmolLM2 and is prefix-preserving.
    """
    from trl.chat_template_utils import qwen2_5_chat_template

    return qwen2_5_chat_template


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
