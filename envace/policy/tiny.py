"""A tiny random-init Llama with a byte-level BPE tokenizer shipped beside this file (4k tokens).

Used by the test suite, `experiments/smoke.toml` and the notebooks: real transformers code paths, no
downloads. The tokenizer is byte-level, so any text round-trips; it was trained once on ChatML, tool-call
and tool-schema text, which keeps realistic prompts short in tokens and the tests fast.
"""

from __future__ import annotations

import shutil
from functools import lru_cache
from pathlib import Path

from envace.paths import envace_home
from envace.policy.tokenizer import prepare_tokenizer

_TOKENIZER = Path(__file__).with_name("tiny_tokenizer.json")


@lru_cache(maxsize=1)
def _tokenizer_json() -> str:
    return _TOKENIZER.read_text()


def build_tiny_tokenizer():
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(_tokenizer_json()),
                                  bos_token="<|im_start|>", eos_token="<|im_end|>",
                                  pad_token="<|im_end|>", unk_token="<|endoftext|>")
    return prepare_tokenizer(tok)


def build_tiny(seed: int = 0, hidden: int = 128, layers: int = 2):
    """(model, tokenizer): a 2-layer Llama, random init from `seed`, in float32."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = build_tiny_tokenizer()
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=hidden, intermediate_size=hidden * 2,
                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=32768, tie_word_embeddings=True,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg).eval()
    model.generation_config.pad_token_id = tok.pad_token_id
    return model, tok


def saved_tiny() -> Path:
    """`build_tiny()` saved once as a model folder (weights + tokenizer), for a vLLM server to load."""
    out = envace_home() / "models" / "tiny-128"
    if (out / "config.json").exists() and (out / "model.safetensors").exists():
        return out
    model, tok = build_tiny()
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out
