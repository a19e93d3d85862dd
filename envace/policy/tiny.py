"""A tiny random-init Llama with a byte-level BPE tokenizer trained in-process (about a second).

Used by the test suite, `experiments/smoke.toml` and the notebooks: real transformers code paths,
no files, no downloads. The tokenizer is byte-level, so any text round-trips.
"""

from __future__ import annotations

import json
from functools import lru_cache

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def _corpus() -> list[str]:
    # Enough tool-call, JSON and ChatML text that common fragments become single tokens.
    words = ["name", "arguments", "tool_call", "tool_response", "execution_result", "user", "assistant",
             "system", "cd", "ls", "mkdir", "folder", "file_name", "content", "error", "result", "true",
             "false", "null", "current_working_directory", "The", "the", "and", "to", "of", "is"]
    lines = []
    for i, w in enumerate(words):
        call = {"name": w, "arguments": {words[(i + 1) % len(words)]: f"value {i}", "n": i}}
        lines.append(f"<|im_start|>assistant\n<tool_call>\n{json.dumps(call)}\n</tool_call><|im_end|>\n")
        lines.append(f"<|im_start|>user\n<tool_response>\n{json.dumps({w: i})}\n</tool_response><|im_end|>")
        lines.append(f"<execution_result>\n{json.dumps({'result': w})}\n</execution_result>")
    lines *= 4
    # Benchmark tool docs make realistic prompts short in tokens, which keeps tests fast.
    try:
        from envace.envs.bfcl.data import data_dir

        for doc in sorted((data_dir() / "multi_turn_func_doc").glob("*.json")):
            lines.extend(doc.read_text().splitlines())
    except Exception:  # noqa: BLE001 - the tokenizer still works without them, only less compactly
        pass
    return lines


@lru_cache(maxsize=1)
def _tokenizer_json() -> str:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=4096, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_corpus(), trainer=trainer)
    return tok.to_str()


def build_tiny_tokenizer():
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    from envace.policy.models import prepare_tokenizer

    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(_tokenizer_json()),
                                  bos_token="<|im_start|>", eos_token="<|im_end|>",
                                  pad_token="<|im_end|>", unk_token="<|endoftext|>")
    return prepare_tokenizer(tok)


def build_tiny(seed: int = 0, hidden: int = 64, layers: int = 2):
    """(model, tokenizer): a 2-layer Llama, random init from `seed`, in float32."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = build_tiny_tokenizer()
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=hidden, intermediate_size=hidden * 2,
                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=16384, tie_word_embeddings=True,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg).eval()
    model.generation_config.pad_token_id = tok.pad_token_id
    return model, tok
