"""Loading a model spec (`specs.py`) into (model, tokenizer), and LoRA adapters for training."""

from __future__ import annotations

import os

from envace.policy.specs import TINY_MODEL, resolve_model
from envace.policy.tiny import build_tiny, build_tiny_tokenizer
from envace.policy.tokenizer import prepare_tokenizer


def load_policy(spec: str, dtype: str = "float32", gpu: bool = True):
    """Load (model, tokenizer) for a spec, with the tool chat template and left padding; on this process's GPU
    where there is one, unless `gpu` is False (a copy that only carries weights to a vLLM server)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # the CLI draws its own progress
    if spec == TINY_MODEL:
        return build_tiny()
    where = resolve_model(spec)
    tok = AutoTokenizer.from_pretrained(where)
    model = AutoModelForCausalLM.from_pretrained(where, dtype=getattr(torch, dtype))
    if gpu and torch.cuda.is_available():  # one GPU per process; `accelerate launch` sets LOCAL_RANK
        model.to(f"cuda:{os.environ.get('LOCAL_RANK', '0')}")
    return model.eval(), prepare_tokenizer(tok)


def load_tokenizer(spec: str):
    """The tokenizer of a model spec alone (a served model's, for `envace.policy.remote`)."""
    if spec == TINY_MODEL:
        return build_tiny_tokenizer()
    from transformers import AutoTokenizer

    return prepare_tokenizer(AutoTokenizer.from_pretrained(resolve_model(spec)))


def tokenizer_for(spec: str):
    """The tokenizer a spec's prompts are rendered with: a server spec names it (`?tokenizer=`), else its own."""
    from urllib.parse import parse_qs, urlsplit

    from envace.policy.specs import is_remote

    if is_remote(spec):
        query = parse_qs(urlsplit(spec.split(",")[-1]).query)
        return load_tokenizer(query.get("tokenizer", ["default"])[-1])
    return load_tokenizer(spec)


def has_dropout(model) -> bool:
    """Whether a training forward of `model` draws random numbers (dropout anywhere, attention's included).

    Only then must a checkpointed recompute replay the global RNG state. Replaying it otherwise would rewind
    the RNG under anything drawing from it meanwhile: an actor sampling on another thread (`grpo.max_staleness`)
    would draw other tokens depending on how the two interleave."""
    import torch

    config = getattr(model, "config", None)
    return any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in model.modules()) or \
        float(getattr(config, "attention_dropout", 0.0) or 0.0) > 0


def enable_checkpointing(model) -> None:
    """Recompute each decoder layer's activations in the backward pass (less memory, ~30% more time).

    transformers 5.2x names it `activation_checkpointing_enable` (its old name a deprecated alias); 5.17, the
    GPU machine's, has only `gradient_checkpointing_enable`. Non-reentrant: it composes with FSDP2 and with
    the checkpointed segments of tree packing. LoRA leaves the embeddings frozen, so the checkpointed
    blocks get a gradient path through their inputs."""
    kwargs = {"use_reentrant": False, "preserve_rng_state": has_dropout(model)}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    model.enable_input_require_grads()


def add_lora(model, rank: int):
    """LoRA adapters on the attention projections; `disable_adapter()` then gives back the base model."""
    import warnings

    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0,
                        target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
    with warnings.catch_warnings():  # peft reads a property transformers deprecated: nothing to act on here
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        return get_peft_model(model, config)


def put_weights(model, named) -> None:
    """Copy each (name, tensor) of `named` (a dict's items, or any iterable of pairs) into `model`'s parameter of
    that name, in place: the weights a learner published, gathered or saved, into another copy of the model."""
    import torch

    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, value in named:
            params[name].copy_(value)
