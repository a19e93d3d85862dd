"""The second control: the starting weights moved by a random update as large as the trained one.

The lr = 1e-12 control covers sampling noise; it leaves the weights where they are, so it cannot tell learning
from drift (any change of the weights of that size). For each tensor W with start W₀ and trained W₁:

    Δ = W₁ − W₀,    R ~ N(0, I) (seeded),    W_random = W₀ + R · ‖Δ‖_F / ‖R‖_F     (W_random = W₀ where Δ = 0)

so every tensor moves exactly as far as training moved it, in a random direction. (A LoRA update is low rank;
R is not: the control matches the size of the update, not its shape.)
"""

from __future__ import annotations

from pathlib import Path

import torch

from envace.training.pool import SEEN_FILE


def random_update(start: str | Path, trained: str | Path, out: str | Path, seed: int, dtype: str) -> dict[str, float]:
    """Write to `out` the checkpoint `start` + a random update with `trained`'s per-tensor norms; returns the
    update's global norm and the tensors it moved."""
    from envace.policy.models import load_policy

    model, tok = load_policy(str(start), dtype)
    moved, _ = load_policy(str(trained), dtype)
    after = dict(moved.named_parameters())
    generator = torch.Generator().manual_seed(seed)
    squared, tensors = 0.0, 0
    with torch.no_grad():
        for name, weight in model.named_parameters():
            delta = after[name].detach().float() - weight.detach().float()
            norm = float(delta.norm())
            noise = torch.randn(weight.shape, generator=generator)  # drawn for every tensor: the draws do not
            if norm == 0.0:                                        # depend on which tensors training moved
                continue
            weight.add_((noise * (norm / float(noise.norm()))).to(weight.dtype))
            squared, tensors = squared + norm ** 2, tensors + 1
    out = Path(out)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    seen = Path(start) / SEEN_FILE  # what SFT showed the start, it showed this checkpoint
    if seen.is_file():
        (out / SEEN_FILE).write_text(seen.read_text())
    return {"update_norm": squared ** 0.5, "tensors_moved": tensors}
