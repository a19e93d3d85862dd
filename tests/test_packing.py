"""Packing strategies against each other: `tree` and `chain` must give `row`'s log-probs, loss and gradients.

The reference is every row's own forward pass (`row`). Tolerance: the largest gradient difference relative to
the gradient's norm, 1e-5 (fp32; the tree sums a shared token's gradient in another order).
"""

import copy
import random

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from envace.training import forward as fwd
from envace.training.grpo import Row, backward, grpo_step
from envace.training.packing import build
from envace.training.packing.tree import BudgetError, Restore, tree_tokens

TOL = 1e-5


def _toks(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(5, 2900) for _ in range(n)]


def _grads(model, rows, advantages, **kw):
    model = copy.deepcopy(model)
    model.train()
    stats = backward(model, rows, advantages, 0, **kw)
    return stats, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _gap(grads, reference) -> float:
    norm = torch.sqrt(sum((g.double() ** 2).sum() for g in reference.values())).item()
    return max((grads[n] - g).abs().max().item() for n, g in reference.items()) / norm


def _own_logprobs(model, row: Row) -> list[float]:
    ids = torch.tensor([row.prompt_ids + row.completion_ids])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), -1)
    return [logp[t, ids[0, t + 1]].item() for t in range(len(row.prompt_ids) - 1, ids.shape[1] - 1)]


def _shared_root(rng):  # one prompt, G = 4 branches (two with the same first tokens)
    prompt, lead = _toks(rng, 30), _toks(rng, 3)
    return [Row("A", "caller", prompt, (lead if g < 2 else []) + _toks(rng, 4 + g), float(g % 2)) for g in range(4)]


def _caller_chains(rng):  # G episodes, each a chain of caller messages with tool results between
    prompt, rows = _toks(rng, 25), []
    for g in range(3):
        context = list(prompt)
        for _ in range(3):
            completion = _toks(rng, 3)
            rows.append(Row("A", "caller", list(context), completion, float(g)))
            context += completion + _toks(rng, 4)
    return rows


def _rehearsers(rng):  # rehearsals of different calls: only the system prompt is shared
    system = _toks(rng, 20)
    return [Row("A", "rehearser", system + _toks(rng, 6), _toks(rng, 5), float(k % 2)) for k in range(4)]


def _prefix_of_another(rng):  # a row whose whole sequence is a prefix of another's prompt, and one inside a completion
    a = Row("A", "caller", _toks(rng, 10), _toks(rng, 5), 1.0)
    b = Row("A", "caller", a.prompt_ids + a.completion_ids + _toks(rng, 3), _toks(rng, 4), 0.0)
    c = Row("A", "caller", a.prompt_ids + a.completion_ids[:2], a.completion_ids[2:4], 0.5)
    return [a, b, c]


def _nothing_shared(rng):
    return [Row("B", "caller", _toks(rng, 8 + k), _toks(rng, 3), float(k)) for k in range(3)]


CASES = {"shared root": _shared_root, "caller chains": _caller_chains, "rehearsers": _rehearsers,
         "prefix of another": _prefix_of_another, "nothing shared": _nothing_shared}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("budget", ["auto", "longest row", "whole tree", "recompute"])
def test_tree_gradients_equal_per_row_ones_on_hand_built_trees(tiny, case, budget):
    model, _ = tiny
    rng = random.Random(7)
    rows = CASES[case](rng) + _nothing_shared(rng)[:1]
    advantages = [rng.uniform(-1, 1) for _ in rows]
    longest = max(len(r.prompt_ids) + len(r.completion_ids) for r in rows)
    kw = {"auto": {}, "longest row": {"max_pack_tokens": longest}, "whole tree": {"max_pack_tokens": 10_000},
          "recompute": {"max_pack_tokens": longest, "processes": _Recompute()}}[budget]
    ref_stats, reference = _grads(model, rows, advantages, packing="row")
    stats, grads = _grads(model, rows, advantages, packing="tree", **kw)
    assert _gap(grads, reference) <= TOL
    assert stats["loss"] == pytest.approx(ref_stats["loss"], rel=1e-5)
    assert stats["entropy"] == pytest.approx(ref_stats["entropy"], rel=1e-5)
    assert stats["tokens"] == ref_stats["tokens"] == sum(len(r.completion_ids) for r in rows)
    if budget != "recompute":  # every shared token forwarded once, whatever the budget
        assert stats["forward_tokens"] == tree_tokens(rows)
    chain_stats, chained = _grads(model, rows, advantages, packing="chain")
    assert _gap(chained, reference) <= TOL and chain_stats["loss"] == pytest.approx(ref_stats["loss"], rel=1e-5)


class _Recompute:
    """Processes as FSDP presents them to `backward` (one process): packs recomputed, one per pass."""

    fsdp = True

    def passes(self, count):
        return count + 1  # a busier peer: one idle pass too

    def gradient_sync(self, model, last):
        pass


def test_a_small_budget_defers_segments_and_a_row_over_it_is_one_clear_error(tiny):
    rng = random.Random(1)
    rows = _shared_root(rng) + _caller_chains(rng)
    longest = max(len(r.prompt_ids) + len(r.completion_ids) for r in rows)
    ops = build(rows, "tree", longest)
    assert any(isinstance(op, Restore) for op in ops)  # the shared prompt is forwarded once and its backward deferred
    deferred = {op.tree.record: i for i, op in enumerate(ops)
                if not isinstance(op, Restore) and op.tree.record is not None}
    restored = {op.segment: i for i, op in enumerate(ops) if isinstance(op, Restore)}
    assert deferred.keys() == restored.keys() and all(deferred[s] < restored[s] for s in deferred)
    (whole,) = build(rows, "tree", 10_000)  # a larger budget: one pass, its two trees attended apart
    assert len(whole.tree.blocks) == 2 and len(ops) > 1
    with pytest.raises(BudgetError, match=rf"is {longest} tokens .* budget of {longest - 1} tokens"):
        build(rows, "tree", longest - 1)


def test_tree_logprobs_are_each_rows_own(tiny):
    model, _ = tiny
    rng = random.Random(3)
    rows = _shared_root(rng) + _prefix_of_another(rng) + _rehearsers(rng)
    got: dict[tuple[int, int], float] = {}
    leaves: dict = {}
    with torch.no_grad(), fwd.tree_attention_on(model):
        for op in build(rows, "tree", max(len(r.prompt_ids) + len(r.completion_ids) for r in rows)):
            if isinstance(op, Restore):
                continue
            out = fwd.forward(model, op, leaves)
            if out.recorded is not None:
                leaves[op.tree.record] = fwd.leaves_of(out.recorded)
            for r, t, n in zip(op.entry_row, op.entry_token, op.entry_node, strict=True):
                got[(r, t)] = out.logp[n].item()
    for i, row in enumerate(rows):
        assert [got[(i, t)] for t in range(len(row.completion_ids))] == pytest.approx(_own_logprobs(model, row),
                                                                                     abs=1e-5)


@st.composite
def _row_sets(draw):
    """Rows drawn from a few shared stems, so prefixes are shared at random depths (and sometimes whole rows)."""
    rng = random.Random(draw(st.integers(0, 10**6)))
    stems = [_toks(rng, rng.randrange(1, 12)) for _ in range(draw(st.integers(1, 3)))]
    rows = []
    for _ in range(draw(st.integers(1, 8))):
        stem = rng.choice(stems)
        prompt = stem[: rng.randrange(1, len(stem) + 1)] + _toks(rng, rng.randrange(0, 4))
        completion = _toks(rng, rng.randrange(0, 5))
        rows.append(Row("A", rng.choice(["caller", "rehearser"]), prompt, completion, 0.0,
                        [rng.uniform(-6, 0) for _ in completion] if rng.random() < 0.5 else None))
        if rng.random() < 0.3:
            rows.append(rows[-1])  # an identical row: every token shared
    advantages = [rng.choice([0.0, rng.uniform(-1, 1)]) for _ in rows]
    slack = draw(st.integers(0, 40))
    return rows, advantages, slack


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(_row_sets())
def test_tree_gradients_equal_per_row_ones_on_random_row_sets(tiny, drawn):
    model, _ = tiny
    rows, advantages, slack = drawn
    if not any(advantages):
        advantages = [1.0] * len(rows)
    budget = max(len(r.prompt_ids) + len(r.completion_ids) for r in rows) + slack
    ref_stats, reference = _grads(model, rows, advantages, packing="row", importance_cap=2.0)
    stats, grads = _grads(model, rows, advantages, packing="tree", max_pack_tokens=budget, importance_cap=2.0)
    if not reference:
        assert not grads
        return
    assert _gap(grads, reference) <= TOL
    assert stats["loss"] == pytest.approx(ref_stats["loss"], rel=1e-4, abs=1e-7)
    assert stats.get("logprob_gap", 0.0) == pytest.approx(ref_stats.get("logprob_gap", 0.0), rel=1e-4, abs=1e-6)


def test_rows_with_advantage_zero_are_skipped_without_changing_the_gradient(tiny):
    model, _ = tiny
    rng = random.Random(5)
    rows = _shared_root(rng) + _rehearsers(rng)
    advantages = [0.0 if i % 3 == 0 else rng.uniform(-1, 1) for i in range(len(rows))]
    full_stats, full = _grads(model, rows, advantages, packing="tree", skip_flat=False)
    stats, skipped = _grads(model, rows, advantages, packing="tree")
    assert _gap(skipped, full) <= TOL
    assert stats["rows_skipped"] == advantages.count(0.0) and stats["rows_backpropagated"] == len(rows) - 3
    assert stats["forward_tokens"] < full_stats["forward_tokens"]
    assert stats["loss"] == pytest.approx(full_stats["loss"], rel=1e-5)  # normalised by every row
    measured, _ = _grads(model, rows, advantages, packing="tree", flat_row_metrics=True)
    assert measured["entropy"] == pytest.approx(full_stats["entropy"], rel=1e-5)  # flat rows measured, no gradient
    assert abs(stats["entropy"] - full_stats["entropy"]) > 1e-6  # without them: the trained rows alone


def test_a_step_whose_every_advantage_is_zero_does_no_backward_and_changes_no_weight(tiny, monkeypatch):
    model, tok = copy.deepcopy(tiny[0]), tiny[1]
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    rows = _shared_root(random.Random(2))
    grpo_step(model, optimizer, rows, [1.0, -1.0, 0.5, -0.5], tok.pad_token_id)  # moments are now non-zero
    before = copy.deepcopy(model.state_dict())
    moments = copy.deepcopy(optimizer.state_dict())
    calls = []
    real = torch.autograd.backward
    monkeypatch.setattr(torch.autograd, "backward", lambda *a, **k: calls.append(1) or real(*a, **k))
    stats = grpo_step(model, optimizer, rows, [0.0] * len(rows), tok.pad_token_id)
    assert calls == [] and stats["packs"] == 0 and not stats["updated"] and not stats["skipped"]
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())
    assert optimizer.state_dict()["state"].keys() == moments["state"].keys()
    assert all(torch.equal(v, optimizer.state_dict()["state"][k]["exp_avg"])
               for k, v in ((k, s["exp_avg"]) for k, s in moments["state"].items()))


def test_the_head_projects_only_scored_positions_a_chunk_at_a_time_at_qwen3s_vocabulary():
    """Qwen3's 151,936-token vocabulary: the head sees at most `chunk` hidden states at once, forward or backward."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=151_936, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True))
    model.train()
    seen: list[int] = []
    model.get_output_embeddings().register_forward_hook(lambda m, inp, out: seen.append(inp[0].shape[-2]))
    rng = random.Random(0)
    prompt = [rng.randrange(151_936) for _ in range(300)]
    rows = [Row("A", "caller", prompt, [rng.randrange(151_936) for _ in range(40)], 0.0) for _ in range(3)]
    stats = backward(model, rows, [1.0, -1.0, 0.5], 0, chunk=16)
    assert stats["tokens"] == 120
    head_rows = [n for n in seen if n > 1]  # the model's own head call keeps one position (logits_to_keep = 1)
    assert max(head_rows) <= 16 and sum(head_rows) == 2 * 120  # each scored token once forward, once recomputed


def test_tree_packing_on_qwen3_and_with_gradient_checkpointing():
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from envace.policy.models import add_lora

    torch.manual_seed(0)
    model = Qwen3ForCausalLM(Qwen3Config(vocab_size=2900, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                         tie_word_embeddings=True))
    rng = random.Random(4)
    rows = _shared_root(rng) + _caller_chains(rng)
    advantages = [rng.uniform(-1, 1) for _ in rows]
    longest = max(len(r.prompt_ids) + len(r.completion_ids) for r in rows)
    _, reference = _grads(model, rows, advantages, packing="row")
    _, grads = _grads(model, rows, advantages, packing="tree", max_pack_tokens=longest)
    assert _gap(grads, reference) <= TOL
    checkpointed = copy.deepcopy(model)
    checkpointed.activation_checkpointing_enable()
    checkpointed.enable_input_require_grads()
    lora = add_lora(copy.deepcopy(model), 4)
    lora_ckpt = add_lora(checkpointed, 4)
    lora_ckpt.load_state_dict(lora.state_dict())
    _, plain = _grads(lora, rows, advantages, packing="row")
    _, ckpt = _grads(lora_ckpt, rows, advantages, packing="tree", max_pack_tokens=longest)
    assert _gap({n.replace("base_model.model.", ""): g for n, g in ckpt.items()},
                {n.replace("base_model.model.", ""): g for n, g in plain.items()}) <= TOL


def test_generation_after_a_tree_update_uses_plain_attention_again(tiny):
    from envace.policy.backend import SamplingParams
    from envace.policy.hf import HFBackend

    model, tok = copy.deepcopy(tiny[0]), tiny[1]
    backend = HFBackend(model, tok, prefix_cache=False)
    prompt = tok.encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
    (before,) = backend.generate([prompt], SamplingParams(max_new_tokens=6, temperature=0.0))
    backward(model, _shared_root(random.Random(0)), [1.0, -1.0, 0.5, -0.5], tok.pad_token_id)
    assert model.config._attn_implementation != fwd.TREE_ATTENTION
    (after,) = backend.generate([prompt], SamplingParams(max_new_tokens=6, temperature=0.0))
    assert after.ids == before.ids


def test_packing_outside_the_three_names_and_a_row_over_the_budget_are_one_line_each(tmp_path, capsys):
    from envace.cli import main

    root = str(tmp_path / "runs")
    assert main(["train", "experiments/smoke.toml", "--root", root, "--set", 'packing.strategy="zip"']) == 2
    err = capsys.readouterr().err.strip()
    assert "packing" in err and "zip" in err and len(err.splitlines()) == 1 and "Traceback" not in err
    assert main(["train", "experiments/smoke.toml", "--root", root, "--set", "packing.max_tokens=0"]) == 2
    capsys.readouterr()
    # SFT's reference rows are far longer than 64 tokens: refused before the first step, nothing stored half
    assert main(["train", "experiments/smoke.toml", "--root", root, "--run-name", "small",
                 "--set", "packing.max_tokens=64"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "packing.max_tokens" in err and "budget of 64 tokens" in err, err
    assert not list((tmp_path / "runs" / "small").glob("*/*.parquet"))


@pytest.mark.heavy
def test_bench_train_times_the_same_rows_three_ways_and_again_from_the_stored_run(tmp_path, capsys):
    from envace.bench.train import bench_train, stored_step_rows
    from envace.cli import main
    from envace.config import load_toml

    root = str(tmp_path / "runs")
    train = load_toml("experiments/bfcl_turns_cpu.toml")["train"]
    played = bench_train(model="tiny", limit=2, group_size=2, root=root, train=train, sft_tasks=1)
    grpo = played["grpo"]
    assert {"tree", "chain", "row", "tree, A = 0 skipped"} <= set(grpo)
    for arm in ("tree", "chain"):  # the same gradient as every row's own pass
        assert grpo[arm]["grad_gap"] <= TOL
    assert grpo["tree"]["forward_tokens"] < grpo["chain"]["forward_tokens"] <= grpo["row"]["tokens"]
    assert played["sft"]["tree"]["forward_tokens"] < played["sft"]["chain"]["forward_tokens"]
    (run,) = [p.name for p in (tmp_path / "runs").iterdir() if p.name.startswith("bench-train-")]
    (rows, advantages), = stored_step_rows(root, run, 1)
    assert len(rows) == grpo["row"]["rows"] and tree_tokens(rows) == grpo["tree"]["forward_tokens"]
    again = bench_train(model="tiny", limit=2, group_size=2, root=root, train=train, from_run=run)
    assert again["grpo"]["tree"]["forward_tokens"] == grpo["tree"]["forward_tokens"]
    capsys.readouterr()
    assert main(["bench", "train", "--model", "tiny", "--steps", "0", "--root", root]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--sft-tasks" in err
