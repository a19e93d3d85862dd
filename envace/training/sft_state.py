"""A warm-up that goes on after a kill: SFT's place in `sft_state.pt`, saved every `sft.save_every` SFT steps.

SFT's chunks are drawn from (seed, epoch) alone (`sft.warm_up`), so the trainable weights, AdamW's moments,
torch's random state, the steps done and their losses are all a killed warm-up needs: resumed, it takes the same
steps in the same order as one never stopped, and reports the same per-epoch NLL. One process only: a warm-up
over several processes (sharded moments) starts over, as every warm-up did before. `checkpoint.start_or_resume`
removes the file once SFT is done and `state.pt` holds its result.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch


@dataclass(frozen=True)
class SftState:
    path: Path
    every: int  # SFT steps between saves; 0: never (a killed warm-up starts over)

    def load(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> tuple[int, list[float]]:
        """(steps done, their losses) after putting the saved weights, moments and random state back; (0, [])
        when nothing was saved."""
        if not self.path.exists():
            return 0, []
        state = torch.load(self.path, weights_only=True)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if p.requires_grad:
                    p.copy_(state["weights"][name])
        optimizer.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["rng"])
        return int(state["step"]), [float(x) for x in state["losses"]]

    def save(self, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer, losses: list[float]) -> None:
        """After SFT step `step` (1-based), when it is due: written beside and renamed, so a kill mid-write
        leaves the previous state loadable."""
        if not self.every or step % self.every:
            return
        weights = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.partial")
        torch.save({"step": step, "weights": weights, "optimizer": optimizer.state_dict(),
                    "rng": torch.get_rng_state(), "losses": torch.tensor(losses, dtype=torch.float64)}, tmp)
        os.replace(tmp, self.path)

    def clear(self) -> None:
        self.path.unlink(missing_ok=True)
