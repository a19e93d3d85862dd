"""Role-wise GRPO, as the EnvACE reference release does it, on one screen.

A *row* is one generation of one role (a caller message, or the rehearsal of one call) with the
episode's score as its reward: both roles share the task reward, and each row is trained only on its
own generated tokens, so neither role is ever trained on the other's text and rehearsed tool
responses *are* trained (unlike a tool loop that masks tool tokens out). How the rows become forward
passes (`row`, `chain`, or the default `tree`: every shared prefix computed once) is `packing/`'s business;
the loss here reads only each pack's scored tokens.
"""

from __future__ import annotations

from collections import defaultdict
from contextlib import nullcontext
from dataclasses import dataclass, replace

import torch

from envace.errors import UsageError
from envace.training import flex_tree
from envace.training import forward as fwd
from envace.training.packing import Pack, build, sequence_pack
from envace.training.packing.chain import chains as pack  # noqa: F401  (an episode's caller rows, joined)
from envace.training.packing.tree import Restore


@dataclass(frozen=True)
class Row:
    """One generation: the unit of training. `behaviour` holds the log-probabilities the sampling backend gave
    its tokens (a vLLM server's may differ slightly from the trainer's: see `policy_loss`), and `temperature` and
    `top_p` what it was sampled under (None: not recorded; `aligned` reads them)."""

    task_uid: str
    role: str
    prompt_ids: list[int]
    completion_ids: list[int]
    reward: float
    behaviour: list[float] | None = None
    temperature: float | None = None
    top_p: float | None = None


def aligned(rows: list[Row], importance_cap: float | None = None) -> list[Row]:
    """The rows, each one's behaviour log-probs b aligned token by token with its completion c, or one clear error.

    Lengths. b[t] is the sampler's log-prob of c[t]. A served backend that appends the stop token itself (the
    server stopped on it without returning it or its log-prob: `policy/remote.py`) leaves b one short: b[t] is
    still c[t]'s for every t < |b|, and the stop token gets NaN, no behaviour log-prob: its importance weight is 1
    (the on-policy value; its log-prob is unknown, not assumed), it is left out of the log-prob gap, and it is
    counted in `behaviour_missing_tokens`. Any other length is refused (`ValueError` naming the row): weights of
    1 on every token of the row would silently drop its correction.

    Sampling parameters. b and the learner's log π (`forward.scored_logprobs`) are both of the model's raw
    distribution, temperature 1 and no top-p (what vLLM and the HF backend report). So with importance sampling
    (`importance_cap`), w = e^(log π − b) is the ratio π/q only for tokens sampled from q = that distribution; a
    row sampled at another temperature or top-p was drawn from q' ≠ q, whose log-prob needs its normaliser over
    the vocabulary, which is not stored: it cannot be corrected, and is refused (`UsageError`; `TrainConfig`
    refuses such a setting before a run starts). A row whose parameters were not recorded (None: built by hand,
    or read from a store written before they were) is taken as sampled at temperature 1. Without importance
    sampling b only measures the engines' gap, and any row trains.
    """
    out = []
    for i, row in enumerate(rows):
        b, n = row.behaviour, len(row.completion_ids)
        if b is None:
            out.append(row)
            continue
        if len(b) not in (n, n - 1):
            raise ValueError(f"row {i} (task {row.task_uid}, {row.role}): {len(b)} behaviour log-probs for {n} "
                             "completion tokens; they must align token by token (the stop token's alone may be "
                             "missing)")
        if importance_cap is not None and (row.temperature not in (None, 1.0) or row.top_p not in (None, 1.0)):
            raise UsageError(f"row {i} (task {row.task_uid}, {row.role}) was sampled at temperature "
                             f"{row.temperature} and top_p {row.top_p}: importance sampling (grpo.importance_cap) "
                             "weighs tokens against the model's raw distribution, so they must be sampled at "
                             "temperature 1 and top_p 1")
        out.append(row if len(b) == n else replace(row, behaviour=[*b, float("nan")]))
    return out


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


@dataclass(frozen=True)
class RoleWiseGRPO:
    """The update's maths as an object (the seam `algorithms.py` fills with others): the advantages of a batch's
    groups, and what each row's tokens weigh in the loss of rows,

        L = − 1/N Σ_i A_i · c_i · Σ_t w_i,t · log π(c_i,t | p_i, c_i,<t)        (`policy_loss`)

    with A_i · c_i = `weight(row_i, A_i)` and N = `normaliser(rows, processes)`. Role-wise GRPO, as the reference:
    A = `role_advantages`, c_i = 1/|c_i| (a token mean per sequence), N = the batch's rows on every process."""

    scale_by_std: bool = False

    def advantages(self, rows: list[Row]) -> list[float]:
        return role_advantages(rows, self.scale_by_std)

    def weight(self, row: Row, advantage: float) -> float:
        """A_i · c_i: what each of the row's completion tokens weighs."""
        return advantage / max(len(row.completion_ids), 1)

    def normaliser(self, rows: list[Row], processes=None) -> float:
        return processes.total(len(rows)) if processes else len(rows)


ROLE_WISE = RoleWiseGRPO()


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


def policy_loss(forwarded: fwd.Forwarded, pk: Pack, rows: list[Row], weights: list[float], normaliser: float,
                importance_cap: float | None = None) -> tuple[torch.Tensor, dict]:
    """L = − 1/N Σ_i A_i · c_i · Σ_t w_i,t · log π(c_i,t | p_i, c_i,<t), this pack's share of the rows; `weights`
    holds each row's A_i · c_i (`RoleWiseGRPO`: c_i = 1/|c_i|, N the rows).

    One optimiser step per batch keeps the policy on-policy, so the PPO ratio is 1 and clipping never
    acts: this is exactly REINFORCE with the role-wise baseline, with a token mean per sequence, and
    w = 1. The sum runs over the pack's *entries* (a row's completion token): a token several rows own
    (the tree) is computed once and counted once per row. When another engine sampled the tokens (vLLM),
    its log-probs b differ slightly from the trainer's: with Δ = log π − b per token, the gap is reported
    as mean |Δ| and as a KL estimate E_b[e^Δ − 1 − Δ] ≥ 0 (Schulman's k3), and `importance_cap` turns on
    truncated importance sampling, w = min(e^Δ, cap) without gradient (as TRL does). `rows` come `aligned`: a
    token without a behaviour log-prob (NaN, or a row without any) has w = 1 and no Δ.
    """
    device = forwarded.logp.device
    node = torch.tensor(pk.entry_node, dtype=torch.long, device=device)
    logp = forwarded.logp[node]
    weight = torch.tensor([weights[r] for r in pk.entry_row], dtype=logp.dtype, device=device)
    behaviour = torch.tensor([b[t] if (b := rows[r].behaviour) is not None else float("nan")
                              for r, t in zip(pk.entry_row, pk.entry_token, strict=True)], dtype=logp.dtype,
                             device=device)
    sampled = ~torch.isnan(behaviour)
    missing = sum(rows[r].behaviour is not None for r in pk.entry_row) - int(sampled.sum().item())
    delta = torch.where(sampled, logp.detach() - behaviour.nan_to_num(), 0.0)
    tis = torch.ones_like(logp)
    if importance_cap is not None:
        tis = torch.where(sampled, delta.exp().clamp(max=importance_cap), 1.0)
    loss = -(weight * tis * logp).sum() / normaliser
    stats = {"entropy_sum": forwarded.entropy[node].sum().item(), "tokens": len(pk.entry_node),
             "behaviour_tokens": int(sampled.sum().item()), "behaviour_missing_tokens": missing,
             "logprob_gap_sum": delta.abs().sum().item(),
             "kl_sum": torch.where(sampled, delta.exp() - 1 - delta, 0.0).sum().item()}
    return loss, stats


_SUMS = ("loss", "entropy_sum", "tokens", "behaviour_tokens", "behaviour_missing_tokens", "logprob_gap_sum",
         "kl_sum")


def _run(model, ops: list, rows: list[Row], weights: list[float], normaliser: int, importance_cap,
         chunk: int, sums: dict, tree_attention: str = "dense") -> bool:
    """Forward and back-propagate `ops` in order (a deferred segment's backward waits for its `Restore`), adding
    each pack's statistics into `sums`; False if any loss was not finite. Under `torch.no_grad()`: forward only."""
    deferred: dict[int, tuple] = {}  # segment -> (its loss, recorded keys and values, their leaves)
    leaves: dict[int, list] = {}
    finite = True
    for op in ops:
        if isinstance(op, Restore):
            loss, recorded, own = deferred.pop(op.segment)
            del leaves[op.segment]
            if torch.is_grad_enabled():
                fwd.restore(loss, recorded, own)
            continue
        forwarded = fwd.forward(model, op, leaves, chunk, tree_attention)
        loss, stats = policy_loss(forwarded, op, rows, weights, normaliser, importance_cap)
        finite = finite and bool(torch.isfinite(loss))
        sums["loss"] += loss.item()
        for k in _SUMS[1:]:
            sums[k] += stats[k]
        sums["passes"] += 1
        sums["forward_tokens"] += len(op.ids)
        sums["tree_attention_flex_packs"] += forwarded.flex
        if forwarded.recorded is not None:
            sums["recomputed_tokens"] += len(op.ids) * torch.is_grad_enabled()  # forwarded again by `restore`
            leaves[op.tree.record] = fwd.leaves_of(forwarded.recorded)
            deferred[op.tree.record] = (loss, forwarded.recorded, leaves[op.tree.record])
        elif loss.requires_grad:
            loss.backward()
    return finite


def _passes(model, rows: list[Row], weights: list[float], normaliser: int, processes, importance_cap,
            packing: str, max_pack_tokens: int | None, chunk: int, pad_id: int, sums: dict,
            tree_attention: str = "dense") -> bool:
    """Every op of `rows` (see `backward`); under FSDP one pack per pass, as many passes as the busiest process."""
    fsdp = bool(processes and processes.fsdp)
    ops = build(rows, packing, max_pack_tokens, recompute=fsdp)
    if not fsdp:
        return _run(model, ops, rows, weights, normaliser, importance_cap, chunk, sums, tree_attention)
    idle = ([sequence_pack([pad_id, pad_id], [(0, 1, 1)])], [Row("", "", [pad_id], [pad_id], 0.0)], [0.0])
    passes, finite = processes.passes(len(ops)), True
    for i in range(passes):
        processes.gradient_sync(model, last=i == passes - 1)
        if i < len(ops):
            finite = _run(model, [ops[i]], rows, weights, normaliser, importance_cap, chunk, sums,
                          tree_attention) and finite
        else:  # an idle pass: advantage 0, no gradient, but the collectives of a forward and a backward
            _run(model, *idle, normaliser, None, chunk, dict.fromkeys(sums, 0))
    return finite


def backward(model, rows: list[Row], advantages: list[float], pad_id: int, normaliser: float | None = None,
             processes=None, importance_cap: float | None = None, packing: str = "tree",
             max_pack_tokens: int | None = None, flat_row_metrics: bool = False, chunk: int = 256,
             skip_flat: bool = True, tree_attention: str = "auto", algorithm: RoleWiseGRPO = ROLE_WISE) -> dict:
    """Accumulate the gradient of `policy_loss` over the whole batch, one pack (`packing`) per forward pass.

    A row with advantage exactly 0 (or no completion) adds nothing to the gradient and is not back-propagated
    (the loss keeps its normaliser N, by default `algorithm.normaliser`: every process's rows); `flat_row_metrics`
    forwards those rows without gradient for the entropy and the log-prob gap (`skip_flat = False`
    back-propagates them anyway, at their full cost: how the update ran before, for benchmarks). Every pass
    back-propagates, even a non-finite one (the caller then skips the update). Under FSDP every process runs
    as many passes as the busiest, and tree packs are recomputed rather than deferred (`packing.tree`):
    each pass is then one forward and one backward on every process, in the same order. `tree_attention`: the
    kernel of a tree pack's masked attention (dense | flex | auto, `flex_tree.choose`); `flex` needs CUDA when
    gradients are computed. `tree_attention_flex_packs` counts the packs that ran FlexAttention.
    """
    if packing == "tree":
        flex_tree.check(tree_attention, next(model.parameters()).device, grad=torch.is_grad_enabled())
    rows = aligned(rows, importance_cap)  # behaviour log-probs token by token, or one clear error
    normaliser = normaliser or algorithm.normaliser(rows)  # N of `policy_loss` (every process's, when given)
    weights = [algorithm.weight(r, a) for r, a in zip(rows, advantages, strict=True)]  # A_i · c_i
    moves = [(a != 0.0 and bool(r.completion_ids)) or not skip_flat for r, a in zip(rows, advantages, strict=True)]
    trained = [i for i, m in enumerate(moves) if m]
    flat = [i for i, m in enumerate(moves) if not m]
    sums = dict.fromkeys((*_SUMS, "passes", "forward_tokens", "recomputed_tokens", "tree_attention_flex_packs"), 0)
    with fwd.tree_attention_on(model) if packing == "tree" else nullcontext():
        finite = _passes(model, [rows[i] for i in trained], [weights[i] for i in trained], normaliser, processes,
                         importance_cap, packing, max_pack_tokens, chunk, pad_id, sums, tree_attention)
        metrics = dict.fromkeys(sums, 0)
        if flat_row_metrics and (flat or processes and processes.fsdp):
            with torch.no_grad():
                _passes(model, [rows[i] for i in flat], [0.0] * len(flat), normaliser, processes, None, packing,
                        max_pack_tokens, chunk, pad_id, metrics, tree_attention)
    tokens = sums["tokens"] + metrics["tokens"]
    out = {"loss": sums["loss"] * normaliser / max(len(rows), 1), "tokens": sums["tokens"],
           "entropy": (sums["entropy_sum"] + metrics["entropy_sum"]) / max(tokens, 1),
           "packs": sums["passes"], "forward_tokens": sums["forward_tokens"],
           "recomputed_tokens": sums["recomputed_tokens"],
           "tree_attention_flex_packs": sums["tree_attention_flex_packs"] + metrics["tree_attention_flex_packs"],
           "rows_backpropagated": len(trained), "rows_skipped": len(flat), "finite": finite}
    measured = sums["behaviour_tokens"] + metrics["behaviour_tokens"]
    if measured:  # the sampler's log-probs against the trainer's, over the tokens that have them
        out.update(logprob_gap=(sums["logprob_gap_sum"] + metrics["logprob_gap_sum"]) / measured,
                   kl_estimate=(sums["kl_sum"] + metrics["kl_sum"]) / measured)
    missing = sums["behaviour_missing_tokens"] + metrics["behaviour_missing_tokens"]
    if missing:  # stop tokens a served backend appended without their log-probs (`aligned`)
        out["behaviour_missing_tokens"] = missing
    return out


def grpo_step(model, optimizer, rows: list[Row], advantages: list[float], pad_id: int,
              max_grad_norm: float = 1.0, processes=None, importance_cap: float | None = None,
              packing: str = "tree", max_pack_tokens: int | None = None, flat_row_metrics: bool = False,
              skip_flat: bool = True, tree_attention: str = "auto", algorithm: RoleWiseGRPO = ROLE_WISE) -> dict:
    """One on-policy update with `role_advantages(rows)`. A non-finite loss or gradient skips the step, and so
    does a batch whose every advantage is 0 (nothing back-propagated on any process: no weight moves, the
    optimiser's moments included).

    With data-parallel `processes` (`envace.training.distributed`), `rows` is this process's share
    and the gradients of all shares are summed before clipping (FSDP: reduce-scattered, and clipped
    by the global norm). `tree_attention`: a tree pack's attention kernel (`backward`).
    """
    optimizer.zero_grad(set_to_none=True)
    total = algorithm.normaliser(rows, processes)
    stats = backward(model, rows, advantages, pad_id, total, processes, importance_cap, packing, max_pack_tokens,
                     flat_row_metrics, skip_flat=skip_flat, tree_attention=tree_attention, algorithm=algorithm)
    adv = torch.tensor(advantages)
    adv_stats = {"adv_mean": adv.mean().item() if len(adv) else 0.0,
                 "adv_std": adv.std().item() if len(adv) > 1 else 0.0}
    flat = (processes.total(stats["rows_backpropagated"]) if processes else stats["rows_backpropagated"]) == 0
    if flat:
        stats.pop("finite")
        return {**stats, **adv_stats, "skipped": False, "updated": False, "grad_norm": 0.0}
    params = [p for p in model.parameters() if p.requires_grad]
    finite = processes.sum_gradients(params, stats.pop("finite")) if processes else stats.pop("finite")
    grad_norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm) if finite else None
    if hasattr(grad_norm, "full_tensor"):  # FSDP: a replicated DTensor, the same global norm everywhere
        grad_norm = grad_norm.full_tensor()
    if grad_norm is None or not torch.isfinite(grad_norm):
        optimizer.zero_grad(set_to_none=True)
        return {**stats, **adv_stats, "skipped": True, "updated": False, "grad_norm": float("nan")}
    optimizer.step()
    return {**stats, **adv_stats, "skipped": False, "updated": True, "grad_norm": grad_norm.item()}
