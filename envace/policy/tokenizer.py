"""Tokenizers made ready for the engine: a chat template that renders tools, left padding, a pad token."""

from __future__ import annotations

END_OF_MESSAGE = "<|im_end|>"


def tool_chat_template() -> str:
    """A ChatML template that renders `tools=` (SmolLM2's own template silently drops them).

    TRL's Qwen2.5 template uses the same special tokens as SmolLM2 and is prefix-preserving.
    """
    from trl.chat_template_utils import qwen2_5_chat_template

    return qwen2_5_chat_template


def prepare_tokenizer(tok):
    """Tool template, left padding for batched generation, and pad = eos (ChatML `<|im_end|>`)."""
    tok.chat_template = tool_chat_template()
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok
