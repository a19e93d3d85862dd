"""The update's maths as objects, one per algorithm: `[train] algorithm` picks one, `Learner` and SFT call it.

    advantages(rows)              A_i of a batch's groups
    weight(row_i, A_i)            A_i · c_i: what each of the row's completion tokens weighs
    normaliser(rows, processes)   N, over every data-parallel process's rows
    L = − 1/N Σ_i A_i · c_i · Σ_t w_i,t · log π(c_i,t | p_i, c_i,<t)        (`grpo.policy_loss`)

A new algorithm is a new object here, not a branch in the loss: role-wise GRPO (`grpo.RoleWiseGRPO`, the
reference's sequence mean), its token mean, and SFT's NLL through the same backward pass.
"""

from __future__ import annotations

from dataclasses import dataclass

from envace.config import TrainConfig
from envace.training.grpo import RoleWiseGRPO, Row


@dataclass(frozen=True)
class TokenMeanGRPO(RoleWiseGRPO):
    """Role-wise advantages with the token-level mean of Dr. GRPO and DAPO: c_i = 1 and N = the batch's completion
    tokens, so every token weighs the same and a long message's tokens are not diluted by its length."""

    def weight(self, row: Row, advantage: float) -> float:
        return advantage

    def normaliser(self, rows: list[Row], processes=None) -> float:
        tokens = sum(len(r.completion_ids) for r in rows)
        return processes.total(tokens) if processes else tokens


@dataclass(frozen=True)
class SupervisedNLL(RoleWiseGRPO):
    """SFT: every row's advantage is 1, so the loss is the mean over rows of each completion's mean NLL."""

    def advantages(self, rows: list[Row]) -> list[float]:
        return [1.0] * len(rows)


ALGORITHMS: dict[str, type[RoleWiseGRPO]] = {"role_grpo": RoleWiseGRPO, "token_mean": TokenMeanGRPO}
SFT = SupervisedNLL()


def of(cfg: TrainConfig) -> RoleWiseGRPO:
    """The config's GRPO algorithm."""
    return ALGORITHMS[cfg.grpo.algorithm](scale_by_std=cfg.grpo.scale_by_std)
