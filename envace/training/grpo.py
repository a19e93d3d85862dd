"""Role-wise GRPO, as the EnvACE reference release does it, on one screen.

A *row* is one generation of one role (a caller message, or the rehearsal of one call) with the
episode's score as its reward: both roles share the task reward, and each row is trained only on its
own generated tokens, so neither role is ever trained on the other's text and rehearsed tool
responses *are* trained (unlike a tool loop that masks tool tokens out).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Row:
    """One generation: the unit of training."""

    task_uid: str
    role: str
    prompt_ids: list[int]
    completion_ids: list[int]
    reward: float


def role_advantages(rows: list[Row], scale_by_std: bool = False, empty_penalty: float = 0.1) -> list[float]:
    """A_i = r_i − mean{ r_j : task_j = task_i and role_j = role_i }.

    r_i is the episode score shared by every row of the trajectory, minus `empty_penalty` when the
    row generated nothing. The mean pools every row of that (task, role) across all G rollouts, so a
    trajectory with more steps weighs more in the baseline (the reference's `group_by_agent_id`).
    No division by the std unless `scale_by_std` (Dr.GRPO-style default). A group of one row has
    advantage 0 here; the reference's special case (mean 0 for singleton groups) is not copied,
    since it turns an unbaselined reward into a signal.
    """
    rewards = [r.reward - (empty_penalty if not r.completion_ids else 0.0) for r in rows]
    groups: dict[tuple[str, str], list[int]] = defaultdict(list)
    for i, row in enumerate(rows):
        groups[(row.task_uid, row.role)].append(i)
    advantages = [0.0] * len(rows)
    for members in groups.values():
        values = torch.tensor([rewards[i] for i in members], dtype=torch.float64)
        centred = values - values.mean()
        if scale_by_std and len(members) > 1:
            centred = centred / (values.std() + 1e-6)
        for i, a in zip(members, centred.tolist(), strict=True):
            advantages[i] = a
    return advantages


def completion_mask(completion_lens: list[int]) -> torch.Tensor:
    """1 where a predicted position holds one of the row's own completion tokens.

    Rows are left-padded so every sequence ends at the same position; the last `max(completion_lens)`
    predictions then cover every completion, and row i's are its last `completion_lens[i]`.
    """
    width = max(completion_lens)
    mask = torch.zeros(len(completion_lens), width)
    for i, n in enumerate(completion_lens):
        if n:
            mask[i, width - n:] = 1.0
    return mask


def completion_logprobs(model, rows: list[Row], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(log-probs of the completion tokens, their logits, the mask), one row per `Row`, left-aligned at the end.

    Only the completion positions go through the vocabulary projection (`logits_to_keep`): BFCL
    prompts are thousands of tokens, completions tens, and the projection dominates otherwise.
    """
    seqs = [r.prompt_ids + r.completion_ids for r in rows]
    width = max(len(s) for s in seqs)
    keep = max(max(len(r.completion_ids) for r in rows), 1)
    ids = torch.tensor([[pad_id] * (width - len(s)) + s for s in seqs])
    attention = torch.tensor([[0] * (width - len(s)) + [1] * len(s) for s in seqs])
    positions = (attention.cumsum(-1) - 1).clamp(min=0)  # left padding must not shift positions
    logits = model(input_ids=ids, attention_mask=attention, position_ids=positions,
                   logits_to_keep=keep + 1).logits[:, :-1].float()
    targets = ids[:, width - keep:]
    logprobs = torch.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    mask = completion_mask([len(r.completion_ids) for r in rows])
    if mask.shape[1] < keep:  # every completion empty
        mask = torch.zeros(len(rows), keep)
    return logprobs, logits, mask


def policy_loss(model, rows: list[Row], advantages: list[float], pad_id: int) -> tuple[torch.Tensor, dict]:
    """L = − 1/N Σ_i A_i · (1/|c_i|) Σ_t log π(c_i,t | p_i, c_i,<t).

    One optimiser step per batch keeps the policy on-policy, so the PPO ratio is 1 and clipping never
    acts: this is exactly REINFORCE with the role-wise baseline, with a token mean per sequence.
    """
    logprobs, logits, mask = completion_logprobs(model, rows, pad_id)
    per_row = (logprobs * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    loss = -(torch.tensor(advantages, dtype=per_row.dtype) * per_row).mean()
    with torch.no_grad():
        probs = torch.softmax(logits, dim=-1)
        entropy = (-(probs * torch.log(probs.clamp(min=1e-12))).sum(-1) * mask).sum() / mask.sum().clamp(min=1)
    return loss, {"loss": loss.item(), "entropy": entropy.item(), "tokens": int(mask.sum().item())}


def backward(model, rows: list[Row], advantages: list[float], pad_id: int, micro_batch: int = 1) -> dict:
    """Accumulate the gradient of `policy_loss` over the whole batch, `micro_batch` rows at a time.

    Micro-batches of one row avoid padding, which on CPU keeps attention on its fast causal path for
    prompts of thousands of tokens; the summed gradients equal the full batch's.
    """
    loss_sum, entropy_sum, tokens, finite = 0.0, 0.0, 0, True
    for i in range(0, len(rows), micro_batch):
        chunk = slice(i, i + micro_batch)
        loss, stats = policy_loss(model, rows[chunk], advantages[chunk], pad_id)
        finite = finite and bool(torch.isfinite(loss))
        if finite:
            (loss * len(rows[chunk]) / len(rows)).backward()
        loss_sum += stats["loss"] * len(rows[chunk])
        entropy_sum += stats["entropy"] * stats["tokens"]
        tokens += stats["tokens"]
    return {"loss": loss_sum / len(rows), "entropy": entropy_sum / max(tokens, 1), "tokens": tokens,
            "finite": finite}


def grpo_step(model, optimizer, rows: list[Row], advantages: list[float], pad_id: int,
              max_grad_norm: float = 1.0, micro_batch: int = 1) -> dict:
    """One on-policy update with `role_advantages(rows)`. A non-finite loss or gradient skips the step."""
    optimizer.zero_grad(set_to_none=True)
    stats = backward(model, rows, advantages, pad_id, micro_batch)
    params = [p for p in model.parameters() if p.requires_grad]
    grad_norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm) if stats.pop("finite") else None
    if grad_norm is None or not torch.isfinite(grad_norm):
        optimizer.zero_grad(set_to_none=True)
        return {**stats, "skipped": True, "grad_norm": float("nan")}
    optimizer.step()
    adv = torch.tensor(advantages)
    return {**stats, "skipped": False, "grad_norm": grad_norm.item(), "adv_mean": adv.mean().item(),
            "adv_std": adv.std().item() if len(adv) > 1 else 0.0}
