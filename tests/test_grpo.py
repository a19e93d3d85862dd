import pytest
import torch

from envace.training.grpo import Row, backward, grpo_step, role_advantages
from envace.training.packing import build
from envace.training.packing.chain import chains
from envace.training.packing.tree import tree_tokens


def test_role_advantages_on_a_hand_built_batch():
    # task A: trajectory 1 (reward 1.0) has 2 caller rows and 3 rehearser rows; trajectory 2 (reward 0.0)
    # has 1 caller row and 1 rehearser row. Task B: one trajectory, one caller row (reward 0.5).
    rows = ([Row("A", "caller", [1], [2], 1.0)] * 2 + [Row("A", "rehearser", [1], [2], 1.0)] * 3
            + [Row("A", "caller", [1], [2], 0.0), Row("A", "rehearser", [1], [2], 0.0)]
            + [Row("B", "caller", [1], [2], 0.5)])
    adv = role_advantages(rows)
    caller_mean, rehearser_mean = 2 / 3, 3 / 4  # pooled over rows, not over trajectories
    expected = ([1 - caller_mean] * 2 + [1 - rehearser_mean] * 3 + [0 - caller_mean, 0 - rehearser_mean] + [0.0])
    assert adv == pytest.approx(expected)
    scaled = role_advantages(rows, scale_by_std=True)
    assert scaled[0] == pytest.approx((1 - caller_mean) / (torch.tensor([1.0, 1.0, 0.0]).std().item() + 1e-6))


def _own_logprobs(model, row: Row) -> list[torch.Tensor]:
    ids = torch.tensor([row.prompt_ids + row.completion_ids])
    logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), -1)
    return [logp[t, ids[0, t + 1]] for t in range(len(row.prompt_ids) - 1, ids.shape[1] - 1)]


def test_each_pack_scores_exactly_each_rows_completion(tiny):
    from envace.training import forward as fwd

    model, tok = tiny
    first = Row("A", "caller", [1, 5, 7, 9, 4], [9, 11], 1.0)
    second = Row("A", "caller", first.prompt_ids + first.completion_ids + [3, 3], [12, 13, 14], 1.0)
    other = Row("A", "rehearser", [1, 4], [8, 3, 2, 6], 0.0)
    rows = [first, second, other]
    chain, alone = sorted(build(rows, "chain"), key=lambda pk: -len(pk.entry_row))
    # One sequence for the episode's two caller rows; the tool-result tokens [3, 3] between are nobody's.
    assert chain.ids == second.prompt_ids + second.completion_ids and chain.entry_row == [0, 0, 1, 1, 1]
    assert [chain.ids[chain.src[n] + 1] for n in chain.entry_node] == first.completion_ids + second.completion_ids
    with torch.no_grad():
        for pk in (chain, alone):
            out = fwd.forward(model, pk, {})
            for index in set(pk.entry_row):  # each row's entries hold its own tokens' log-probs
                got = [out.logp[n].item() for r, n in zip(pk.entry_row, pk.entry_node, strict=True) if r == index]
                assert got == pytest.approx([x.item() for x in _own_logprobs(model, rows[index])], abs=1e-4)


def test_packing_joins_an_episodes_caller_rows_and_keeps_the_loss(tiny):
    model, tok = tiny
    a1 = Row("A", "caller", [1, 5, 7], [9, 11], 1.0)
    a2 = Row("A", "caller", [1, 5, 7, 9, 11, 4, 4], [12, 2], 1.0)
    r1 = Row("A", "rehearser", [1, 4, 6], [8, 3], 1.0)
    b1 = Row("B", "caller", [1, 5, 7], [10], 0.0)  # same prompt, different completion: its own pack
    rows = [a2, r1, b1, a1]
    assert sorted(sorted(g) for g in chains(rows)) == [[0, 3], [1], [2]]
    advantages = [0.5, -1.0, 2.0, 0.25]
    expected = sum(-adv * torch.stack(_own_logprobs(model, row)).mean().item()
                   for row, adv in zip(rows, advantages, strict=True)) / len(rows)
    forwarded = {}
    for packing in ("chain", "tree", "row"):
        model.zero_grad()
        stats = backward(model, rows, advantages, tok.pad_token_id, packing=packing)
        assert stats["loss"] == pytest.approx(expected, rel=1e-4)
        assert stats["tokens"] == 7, packing
        forwarded[packing] = stats["forward_tokens"]
    assert forwarded == {"row": 9 + 5 + 5 + 4, "chain": 9 + 5 + 4, "tree": 9 + 1 + 4} == {**forwarded,
                                                                              "tree": tree_tokens(rows)}


def test_a_trivial_reward_rises_on_the_tiny_model():
    """Reward = share of generated tokens from a fixed quarter of the vocabulary: GRPO must push it up."""
    from envace.policy.backend import SamplingParams
    from envace.policy.hf import HFBackend
    from envace.policy.tiny import build_tiny

    model, tok = build_tiny(seed=3)
    target = set(range(len(tok) // 4))
    backend = HFBackend(model, tok, prefix_cache=False)
    prompts = [tok.encode(f"<|im_start|>user\nsay {w}<|im_end|>\n<|im_start|>assistant\n",
                          add_special_tokens=False) for w in ("a", "b")]
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-2)

    def sample(step):
        model.eval()
        gens = backend.generate([p for p in prompts for _ in range(8)],
                                SamplingParams(max_new_tokens=8, temperature=1.0, seed=step))
        return [Row(f"t{i // 8}", "caller", prompts[i // 8], g.ids,
                    sum(t in target for t in g.ids) / max(len(g.ids), 1)) for i, g in enumerate(gens)]

    first = sum(r.reward for r in sample(0)) / 16
    for step in range(15):
        rows = sample(step + 1)
        model.train()
        stats = grpo_step(model, optimizer, rows, role_advantages(rows), tok.pad_token_id)
        assert not stats["skipped"]
    last = sum(r.reward for r in sample(100)) / 16
    assert last > first + 0.15, (first, last)


def test_non_finite_loss_skips_the_step(tiny):
    model, tok = tiny

    class Broken(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = model

        def get_output_embeddings(self):
            return self.inner.get_output_embeddings()

        def forward(self, **kw):
            out = self.inner(**kw)
            out.hidden_states = tuple(h * float("nan") for h in out.hidden_states)
            return out

    broken = Broken()
    before = [p.detach().clone() for p in model.parameters()]
    rows = [Row("A", "caller", [1, 2], [3], 1.0), Row("A", "caller", [1, 2], [4], 0.0)]
    stats = grpo_step(broken, torch.optim.AdamW(model.parameters()), rows, role_advantages(rows), tok.pad_token_id)
    assert stats["skipped"]
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_gradients_of_shares_sum_to_the_whole_batch(tiny):
    """Data parallelism's premise: shares normalised by the global row count add up to the full gradient."""
    model, tok = tiny
    rows = [Row("A", "caller", [1, 5, 7], [9, 11], 1.0), Row("A", "caller", [1, 5, 7, 9, 11, 4], [12], 1.0),
            Row("B", "rehearser", [1, 4, 6], [8, 3], 0.0), Row("B", "caller", [2, 5], [10, 2, 2], 0.0)]
    advantages = [0.5, 0.5, -1.0, 0.25]

    def grads(shares):
        model.zero_grad()
        for share in shares:
            backward(model, [rows[i] for i in share], [advantages[i] for i in share], tok.pad_token_id,
                     normaliser=len(rows))
        return [p.grad.clone() for p in model.parameters() if p.grad is not None]

    whole, split = grads([[0, 1, 2, 3]]), grads([[0, 1], [2, 3]])
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(whole, split, strict=True))


def test_gradient_checkpointing_gives_the_same_gradients():
    import copy

    from envace.policy.models import add_lora
    from envace.policy.tiny import build_tiny

    base, tok = build_tiny(seed=2)
    plain = add_lora(copy.deepcopy(base), 4)
    checkpointed = copy.deepcopy(base)
    checkpointed.activation_checkpointing_enable()
    checkpointed.enable_input_require_grads()
    checkpointed = add_lora(checkpointed, 4)
    checkpointed.load_state_dict(plain.state_dict())
    rows = [Row("A", "caller", [1, 5, 7, 9], [9, 11, 4], 1.0), Row("A", "caller", [1, 5, 7, 9, 9, 11, 4, 3], [2], 1.0)]
    for model in (plain, checkpointed):
        model.train()
        backward(model, rows, [0.7, -0.3], tok.pad_token_id)
    grads = [(n, p.grad) for n, p in plain.named_parameters() if p.requires_grad]
    other = dict((n, p.grad) for n, p in checkpointed.named_parameters() if p.requires_grad)
    assert grads and all(torch.allclose(g, other[n], atol=1e-6) for n, g in grads)


def test_signal_groups_counts_the_groups_whose_rewards_differ():
    from envace.training.grpo import signal_groups

    rows = [Row("A", "caller", [1], [2], 1.0), Row("A", "caller", [1], [3], 0.0),  # A/caller: signal
            Row("B", "caller", [1], [2], 0.5), Row("B", "caller", [1], [3], 0.5),  # B/caller: none
            Row("A", "rehearser", [1], [2], 1.0), Row("A", "rehearser", [1], [2], 1.0),  # A/rehearser: none
            Row("B", "rehearser", [1], [2], 0.2)]  # a group of one: no spread
    assert signal_groups(rows) == {"caller": 0.5, "rehearser": 0.0}
    assert all(a == 0 for r, a in zip(rows, role_advantages(rows), strict=True) if r.task_uid == "B")


@pytest.mark.parametrize("name", ["role_grpo", "token_mean", "sft"])
def test_each_algorithm_takes_the_gradient_of_its_own_formula(tiny, name):
    """role_grpo averages each row's tokens, then the rows; token_mean (Dr. GRPO / DAPO) weighs every token of the
    batch alike; SFT is the NLL (advantage 1). `backward` with each object against its formula, differentiated
    directly on each row's own log-probs."""
    from envace.training.algorithms import ALGORITHMS, SFT

    model, tok = tiny
    algorithm = SFT if name == "sft" else ALGORITHMS[name]()
    rows = [Row("A", "caller", [1, 5, 7], [9, 11], 1.0), Row("A", "caller", [1, 5, 7], [10, 12, 13, 14, 2], 0.0)]
    advantages = algorithm.advantages(rows) if name == "sft" else [0.5, -0.5]
    params = [p for p in model.parameters() if p.requires_grad]
    model.zero_grad()
    backward(model, rows, advantages, tok.pad_token_id, algorithm=algorithm)
    got = [p.grad.clone() for p in params]
    model.zero_grad()
    logps = [torch.stack(_own_logprobs(model, row)) for row in rows]
    if name == "token_mean":
        loss = -sum(a * lp.sum() for a, lp in zip(advantages, logps, strict=True)) / sum(len(lp) for lp in logps)
    else:
        loss = -sum(a * lp.mean() for a, lp in zip(advantages, logps, strict=True)) / len(rows)
    loss.backward()
    for g, p in zip(got, params, strict=True):
        assert torch.allclose(g, p.grad, atol=1e-6, rtol=1e-4)
    if name == "role_grpo":  # the two formulas differ on rows of unequal length: the test tells them apart
        model.zero_grad()
        backward(model, rows, advantages, tok.pad_token_id, algorithm=ALGORITHMS["token_mean"]())
        assert not all(torch.allclose(g, p.grad, atol=1e-6, rtol=1e-4) for g, p in zip(got, params, strict=True))


def _grads_of(model, rows, advantages, **kw):
    model.zero_grad()
    stats = backward(model, rows, advantages, 0, **kw)
    return stats, [p.grad.clone() for p in model.parameters() if p.grad is not None]


def test_behaviour_one_token_short_is_aligned_on_its_prefix(tiny):
    """A served backend that appends the stop token itself leaves the behaviour log-probs one short: the prefix is
    still token by token (its importance weights e^Δ apply), and only the stop token goes without one (weight 1,
    counted). Reference: the same row with the stop token's behaviour log-prob set to the trainer's own (Δ = 0)."""
    model, _ = tiny
    row = Row("A", "caller", [1, 5, 7, 9], [9, 11, 12, 4], 1.0)
    with torch.no_grad():
        own = [t.item() for t in _own_logprobs(model, row)]
    prefix = [o - 0.5 for o in own[:-1]]  # e^0.5 ≈ 1.65 per token, under the cap of 2
    reference = Row("A", "caller", row.prompt_ids, row.completion_ids, 1.0, prefix + [own[-1]])
    short = Row("A", "caller", row.prompt_ids, row.completion_ids, 1.0, prefix)
    unweighted = Row("A", "caller", row.prompt_ids, row.completion_ids, 1.0)
    stats, got = _grads_of(model, [short], [1.0], importance_cap=2.0)
    _, want = _grads_of(model, [reference], [1.0], importance_cap=2.0)
    _, plain = _grads_of(model, [unweighted], [1.0], importance_cap=2.0)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(got, want, strict=True))
    assert not all(torch.allclose(a, b, atol=1e-6) for a, b in zip(got, plain, strict=True))  # not every weight 1
    assert stats["logprob_gap"] == pytest.approx(0.5, abs=1e-4) and stats["behaviour_missing_tokens"] == 1


@pytest.mark.parametrize("extra", [[-1.0], [], [-1.0, -2.0]], ids=["one-long", "two-short", "three-long"])
def test_behaviour_of_another_length_is_refused_naming_the_row(tiny, extra):
    model, _ = tiny
    completion = [9, 11, 12]
    behaviour = ([-1.0] * len(completion) + extra) if extra else [-1.0]  # two short when extra is []
    rows = [Row("A", "caller", [1, 5], [9], 1.0, [-1.0]),
            Row("task-7", "rehearser", [1, 5], completion, 0.0, behaviour)]
    with pytest.raises(ValueError, match=rf"row 1 \(task task-7, rehearser\): {len(behaviour)} behaviour log-probs "
                                         rf"for {len(completion)} completion tokens"):
        backward(model, rows, [1.0, -1.0], 0)


def test_importance_sampling_refuses_rows_sampled_away_from_the_learners_distribution(tiny):
    """The behaviour log-probs and the learner's log π are both of the model's raw distribution (temperature 1, no
    top-p), so truncated importance sampling is exact only on tokens sampled from it: a row sampled at another
    temperature or top-p is refused, not weighted against the wrong distribution. Without importance sampling the
    log-probs only measure the engines' gap, and such rows train."""
    from envace.errors import UsageError

    model, _ = tiny
    ok = Row("A", "caller", [1, 5], [9, 11], 1.0, [-1.0, -1.0], temperature=1.0, top_p=1.0)
    warm = Row("A", "caller", [1, 5], [9, 12], 0.0, [-1.0, -1.0], temperature=0.7, top_p=1.0)
    nucleus = Row("B", "rehearser", [1, 5], [9, 12], 0.0, [-1.0, -1.0], temperature=1.0, top_p=0.9)
    backward(model, [ok], [1.0], 0, importance_cap=2.0)
    with pytest.raises(UsageError, match=r"row 1 \(task A, caller\) was sampled at temperature 0.7"):
        backward(model, [ok, warm], [1.0, -1.0], 0, importance_cap=2.0)
    with pytest.raises(UsageError, match=r"row 0 \(task B, rehearser\) was sampled at .*top_p 0.9"):
        backward(model, [nucleus], [1.0], 0, importance_cap=2.0)
    stats = backward(model, [ok, warm, nucleus], [1.0, -1.0, 0.5], 0)
    assert stats["rows_backpropagated"] == 3
