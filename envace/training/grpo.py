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
    """One generation: the unit of training. `behaviour` holds the log-probabilities the sampling backend gave
    its tokens (a vLLM server's may differ slightly from the trainer's: see `policy_loss`)."""

    task_uid: str
    role: str
    prompt_ids: list[int]
    completion_ids: list[int]
    reward: float
    behaviour: list[float] | None = None


def role_advantages(rows: list[Row], scale_by_std: bool = False) -> list[float]:
    """A_i = r_i − mean{ r_j : task_j = task_i and role_j = role_i }.

    r_i is the reward the row's role got for its episode (`envace.rewards`). The mean pools every row
    of that (task, role) across all G rollouts, so a trajectory with more steps weighs more in the
    baseline (the reference's `group_by_agent_id`). No division by the std unless `scale_by_std`
    (Dr.GRPO-style default). A group of one row has advantage 0 here; the reference's special case
    (mean 0 for singleton groups) is not copied, since it turns an unbaselined reward into a signal.
    """
    groups: dict[tuple[str, str], list[int]] = defaultdict(list)
    for i, row in enumerate(rows):
        groups[(row.task_uid, row.role)].append(i)
    advantages = [0.0] * len(rows)
    for members in groups.values():
        values = torch.tensor([rows[i].reward for i in members], dtype=torch.float64)
        centred = values - values.mean()
        if scale_by_std and len(members) > 1:
            centred = centred / (values.std() + 1e-6)
        for i, a in zip(members, centred.tolist(), strict=True):
            advantages[i] = a
    return advantages


def signal_groups(rows: list[Row]) -> dict[str, float]:
    """Per role: the share of its (task, role) groups whose rewards are not all equal.

    A group whose G rollouts all got the same reward has every advantage 0: it moves no weight. This is
    the share of the batch that carries a learning signal at all.
    """
    rewards: dict[tuple[str, str], set[float]] = defaultdict(set)
    for row in rows:
        rewards[(row.task_uid, row.role)].add(round(row.reward, 9))
    out: dict[str, list[bool]] = defaultdict(list)
    for (_, role), values in rewards.items():
        out[role].append(len(values) > 1)
    return {role: sum(flags) / len(flags) for role, flags in out.items()}


def pack(rows: list[Row]) -> list[list[int]]:
    """Row indices grouped so that every row's prompt extends the previous row's sequence in its group.

    A caller's prompt at step k is its step k−1 prompt + completion + the tool results, token for
    token, so all caller rows of an episode become one sequence and one forward pass instead of one
    per message; causal attention makes every log-prob identical to the row's own forward pass.
    """
    groups: list[list[int]] = []
    for i in sorted(range(len(rows)), key=lambda i: len(rows[i].prompt_ids)):
        prompt = rows[i].prompt_ids
        for group in reversed(groups):
            last = rows[group[-1]]
            n = len(last.prompt_ids) + len(last.completion_ids)
            if len(prompt) >= n and prompt[: len(last.prompt_ids)] == last.prompt_ids and \
                    prompt[len(last.prompt_ids): n] == last.completion_ids:
                group.append(i)
                break
        else:
            groups.append([i])
    return groups


def completion_logprobs(model, packs: list[list[Row]], pad_id: int
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(log-probs, logits, owner, behaviour) at the completion positions of each pack's one sequence.

    A pack's sequence is its last row's prompt + completion; `owner[p, t]` is the index (in
    `[r for pack in packs for r in pack]`) of the row whose completion holds that token, or −1.
    Packs are left-padded so they end together, and only the positions from the earliest completion
    on go through the vocabulary projection (`logits_to_keep`): prompts are thousands of tokens.
    `behaviour` holds each row's sampling log-probs at the same positions (NaN where none were given).
    """
    seqs = [pk[-1].prompt_ids + pk[-1].completion_ids for pk in packs]
    width = max(len(s) for s in seqs)
    keep = max(max(len(s) - min(len(r.prompt_ids) for r in pk) for s, pk in zip(seqs, packs, strict=True)), 1)
    device = next(model.parameters()).device
    ids = torch.tensor([[pad_id] * (width - len(s)) + s for s in seqs], device=device)
    attention = torch.tensor([[0] * (width - len(s)) + [1] * len(s) for s in seqs], device=device)
    positions = (attention.cumsum(-1) - 1).clamp(min=0)  # left padding must not shift positions
    logits = model(input_ids=ids, attention_mask=attention, position_ids=positions,
                   logits_to_keep=keep + 1).logits[:, :-1].float()
    targets = ids[:, width - keep:]
    logprobs = torch.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    owner = torch.full((len(packs), keep), -1, dtype=torch.long, device=device)
    behaviour = torch.full((len(packs), keep), float("nan"), dtype=logprobs.dtype, device=device)
    index = 0
    for p, (seq, pk) in enumerate(zip(seqs, packs, strict=True)):
        for row in pk:
            end = keep - (len(seq) - len(row.prompt_ids) - len(row.completion_ids))
            owner[p, end - len(row.completion_ids): end] = index
            if row.behaviour is not None and len(row.behaviour) == len(row.completion_ids):
                behaviour[p, end - len(row.completion_ids): end] = torch.tensor(row.behaviour, dtype=logprobs.dtype)
            index += 1
    return logprobs, logits, owner, behaviour


def policy_loss(model, packs: list[list[Row]], advantages: list[float], pad_id: int,
                importance_cap: float | None = None) -> tuple[torch.Tensor, dict]:
    """L = − 1/N Σ_i A_i · (1/|c_i|) Σ_t w_i,t · log π(c_i,t | p_i, c_i,<t), over the N rows of `packs`.

    One optimiser step per batch keeps the policy on-policy, so the PPO ratio is 1 and clipping never
    acts: this is exactly REINFORCE with the role-wise baseline, with a token mean per sequence, and
    w = 1. When another engine sampled the tokens (vLLM), its log-probs b differ slightly from the
    trainer's: with Δ = log π − b per token, the gap is reported as mean |Δ| and as a KL estimate
    E_b[e^Δ − 1 − Δ] ≥ 0 (Schulman's k3), and `importance_cap` turns on truncated importance sampling,
    w = min(e^Δ, cap) without gradient (as TRL does), correcting the sampler's mismatch.
    """
    rows = [r for pk in packs for r in pk]
    logprobs, logits, owner, behaviour = completion_logprobs(model, packs, pad_id)
    mask = owner >= 0
    lengths = torch.tensor([max(len(r.completion_ids), 1) for r in rows], dtype=logprobs.dtype, device=owner.device)
    weight = torch.tensor(advantages, dtype=logprobs.dtype, device=owner.device) / lengths
    sampled = mask & ~torch.isnan(behaviour)
    delta = torch.where(sampled, logprobs.detach() - behaviour.nan_to_num(), 0.0)
    tis = torch.ones_like(logprobs)
    if importance_cap is not None:
        tis = torch.where(sampled, delta.exp().clamp(max=importance_cap), 1.0)
    loss = -(torch.where(mask, weight[owner.clamp(min=0)], 0.0) * tis * logprobs).sum() / len(rows)
    with torch.no_grad():
        probs = torch.softmax(logits, dim=-1)
        entropy = (-(probs * torch.log(probs.clamp(min=1e-12))).sum(-1) * mask).sum() / mask.sum().clamp(min=1)
        n = int(sampled.sum().item())
        gap = {"behaviour_tokens": n, "logprob_gap_sum": delta.abs().sum().item(),
               "kl_sum": torch.where(sampled, delta.exp() - 1 - delta, 0.0).sum().item()}
    return loss, {"loss": loss.item(), "entropy": entropy.item(), "tokens": int(mask.sum().item()), **gap}


def backward(model, rows: list[Row], advantages: list[float], pad_id: int, micro_batch: int = 1,
             total_rows: int | None = None, processes=None, importance_cap: float | None = None) -> dict:
    """Accumulate the gradient of `policy_loss` over the whole batch, `micro_batch` packs at a time.

    Micro-batches of one pack avoid padding, which on CPU keeps attention on its fast causal path for
    prompts of thousands of tokens; the summed gradients equal the full batch's. `total_rows` is the
    batch size the loss is normalised by when other `processes` hold the rest of the batch. Every pass
    back-propagates, even a non-finite one (the caller then skips the update), and under FSDP a
    process with fewer packs runs idle passes (advantage 0): its peers wait for it in each collective.
    """
    total_rows = total_rows or len(rows)
    packs = pack(rows)
    groups = [packs[i: i + micro_batch] for i in range(0, len(packs), micro_batch)]
    chunks = [([[rows[j] for j in pk] for pk in g], [advantages[j] for pk in g for j in pk]) for g in groups]
    passes = processes.passes(len(chunks)) if processes else len(chunks)
    idle = ([[Row("", "", [pad_id], [pad_id], 0.0)]], [0.0])
    loss_sum, entropy_sum, tokens, finite = 0.0, 0.0, 0, True
    gap = {"behaviour_tokens": 0, "logprob_gap_sum": 0.0, "kl_sum": 0.0}
    for i in range(passes):
        if processes:
            processes.gradient_sync(model, last=i == passes - 1)
        chunk, advs = chunks[i] if i < len(chunks) else idle
        loss, stats = policy_loss(model, chunk, advs, pad_id, importance_cap)
        n = sum(len(pk) for pk in chunk)
        (loss * n / total_rows).backward()
        if i >= len(chunks):
            continue
        finite = finite and bool(torch.isfinite(loss))
        loss_sum += stats["loss"] * n
        entropy_sum += stats["entropy"] * stats["tokens"]
        tokens += stats["tokens"]
        gap = {k: gap[k] + stats[k] for k in gap}
    out = {"loss": loss_sum / max(len(rows), 1), "entropy": entropy_sum / max(tokens, 1), "tokens": tokens,
           "packs": len(packs), "finite": finite}
    if gap["behaviour_tokens"]:  # the sampler's log-probs against the trainer's, over the tokens that have them
        out.update(logprob_gap=gap["logprob_gap_sum"] / gap["behaviour_tokens"],
                   kl_estimate=gap["kl_sum"] / gap["behaviour_tokens"])
    return out


def grpo_step(model, optimizer, rows: list[Row], advantages: list[float], pad_id: int,
              max_grad_norm: float = 1.0, micro_batch: int = 1, processes=None,
              importance_cap: float | None = None) -> dict:
    """One on-policy update with `role_advantages(rows)`. A non-finite loss or gradient skips the step.

    With data-parallel `processes` (`envace.training.distributed`), `rows` is this process's share
    and the gradients of all shares are summed before clipping (FSDP: reduce-scattered, and clipped
    by the global norm).
    """
    optimizer.zero_grad(set_to_none=True)
    total = int(processes.total(len(rows))) if processes else len(rows)
    stats = backward(model, rows, advantages, pad_id, micro_batch, total, processes, importance_cap)
    params = [p for p in model.parameters() if p.requires_grad]
    finite = processes.sum_gradients(params, stats.pop("finite")) if processes else stats.pop("finite")
    grad_norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm) if finite else None
    if hasattr(grad_norm, "full_tensor"):  # FSDP: a replicated DTensor, the same global norm everywhere
        grad_norm = grad_norm.full_tensor()
    if grad_norm is None or not torch.isfinite(grad_norm):
        optimizer.zero_grad(set_to_none=True)
        return {**stats, "skipped": True, "grad_norm": float("nan")}
    optimizer.step()
    adv = torch.tensor(advantages)
    return {**stats, "skipped": False, "grad_norm": grad_norm.item(), "adv_mean": adv.mean().item(),
            "adv_std": adv.std().item() if len(adv) > 1 else 0.0}
