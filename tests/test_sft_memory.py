"""Memory-aware SFT (`[train.sft] memory`): caller rows whose turn's user message carries a rehearsal memory, the
gold call as target, from train tasks only (`envace/training/memory_rows.py`)."""

import re

import pytest

from envace.config import RehearserOptions, TrainConfig
from envace.engine.examples import ExampleBank
from envace.engine.prompts import reference_memory
from envace.errors import UsageError
from envace.formats import render_tool_call
from envace.training.memory_rows import memory_rows
from envace.training.rows import reference_rows
from envace.training.setup import Policy
from envace.training.sft import sft_rows

BLOCK = re.compile(r"\n\n<rehearsal_memory>\n(.*?)\n</rehearsal_memory>", re.DOTALL)


def _text(tok, ids):
    return tok.decode(ids, skip_special_tokens=False)


def _policy(bfcl, tiny, model=None):
    train = bfcl.load_tasks("multi_turn_base", "train")
    return Policy(model, tiny[1], bfcl, train, ExampleBank(train))


def test_reference_memory_rows_copy_every_caller_row_with_its_turns_gold_memory(bfcl, tiny):
    tok = tiny[1]
    tasks = bfcl.load_tasks("multi_turn_base", "train", limit=2)
    plain = [r for r in reference_rows(tasks, bfcl, tok, RehearserOptions()) if r.role == "caller"]
    rows = memory_rows(tasks, bfcl, tok, RehearserOptions())
    assert len(rows) == len(plain) and {r.role for r in rows} == {"caller"}
    by_task = {t.uid: t for t in tasks}
    unmarked = []
    for row in rows:
        prompt = _text(tok, row.prompt_ids)
        memories = BLOCK.findall(prompt)
        assert len(memories) == 1  # the turn's own user message, and no other, carries a memory
        users = prompt.split("<|im_start|>user\n")
        turn = sum(not u.startswith("<tool_response>") for u in users[1:]) - 1  # user turns before, from 0
        task = by_task[row.task_uid]
        assert memories[0] == reference_memory(task.reference[turn])  # this turn's gold, nothing else
        assert BLOCK.search(next(u for u in reversed(users) if not u.startswith("<tool_response>")))  # its turn's
        target = _text(tok, row.completion_ids).removesuffix("<|im_end|>")
        gold = [render_tool_call(s.call) for s in task.reference[turn]]
        assert target in gold or target == "Done."  # the gold call (or the turn's closing answer)
        unmarked.append((row.task_uid, BLOCK.sub("", prompt), target))
    # the same rows as the plain set's callers, save for the memory
    assert sorted(unmarked) == sorted((r.task_uid, _text(tok, r.prompt_ids),
                                       _text(tok, r.completion_ids).removesuffix("<|im_end|>")) for r in plain)


def test_memory_rows_refuse_a_test_task(bfcl, tiny):
    test = bfcl.load_tasks("multi_turn_base", "test", limit=1)
    with pytest.raises(ValueError, match="train-split tasks only"):
        memory_rows(test, bfcl, tiny[1], RehearserOptions())
    train = bfcl.load_tasks("multi_turn_base", "train", limit=1)
    with pytest.raises(ValueError, match="train-split tasks only"):  # one test task among train tasks is enough
        memory_rows(train + test, bfcl, tiny[1], RehearserOptions())


def _same(a, b):
    return [(r.task_uid, r.role, r.prompt_ids, r.completion_ids, r.reward) for r in a] == \
        [(r.task_uid, r.role, r.prompt_ids, r.completion_ids, r.reward) for r in b]


def test_sft_rows_add_memory_rows_with_the_flag_and_are_unchanged_without(bfcl, tiny):
    policy = _policy(bfcl, tiny)
    plain_cfg = TrainConfig(model="tiny", sft={"tasks": 2})
    plain = sft_rows(plain_cfg, policy)
    before = [r for r in reference_rows(policy.train_tasks[:2], bfcl, tiny[1], plain_cfg.rollout.rehearser,
                                        plain_cfg.rollout.caller_demo, policy.bank, plain_cfg.rollout.tool_docs)
              if r.role in plain_cfg.trained_roles or r.role == "summariser"]
    assert _same(plain, before)  # sft.memory = none: the rows as they were
    assert not any("<rehearsal_memory>" in _text(tiny[1], r.prompt_ids) for r in plain)
    aware = sft_rows(TrainConfig(model="tiny", sft={"tasks": 2, "memory": "reference"}), policy)
    assert _same(aware[: len(plain)], plain)  # the plain rows first, unchanged
    added = aware[len(plain):]
    assert len(added) == sum(r.role == "caller" for r in plain)
    gold = {render_tool_call(s.call) for t in policy.train_tasks[:2] for turn in t.reference for s in turn}
    called = [r for r in added if _text(tiny[1], r.completion_ids).removesuffix("<|im_end|>") in gold]
    assert called and all("<rehearsal_memory>" in _text(tiny[1], r.prompt_ids) for r in added)


def test_rehearsed_memories_come_from_the_models_own_imagined_attempts(bfcl, tiny):
    policy = _policy(bfcl, tiny, model=tiny[0])
    cfg = TrainConfig(model="tiny", sft={"tasks": 1, "memory": "rehearsed"},
                      rollout={"max_new_tokens": 8, "caller_demo": True})
    rows = sft_rows(cfg, policy)
    again = sft_rows(cfg, policy)
    assert _same(rows, again)  # drawn from the seed and the weights before SFT: a resumed warm-up rebuilds them
    plain = sft_rows(TrainConfig(model="tiny", sft={"tasks": 1}, rollout={"max_new_tokens": 8, "caller_demo": True}),
                     policy)
    added = rows[len(plain):]
    assert _same(rows[: len(plain)], plain) and len(added) == sum(r.role == "caller" for r in plain)
    task = policy.train_tasks[0]
    gold = {render_tool_call(s.call) for turn in task.reference for s in turn} | {"Done."}
    for r in added:
        (memory,) = BLOCK.findall(_text(tiny[1], r.prompt_ids))
        assert memory  # the random tiny model's attempt, as a perfect summariser writes it up
        assert _text(tiny[1], r.completion_ids).removesuffix("<|im_end|>") in gold  # the target stays gold


def test_bad_sft_memory_settings_are_refused():
    with pytest.raises(UsageError, match="sft.memory: unknown choice"):
        TrainConfig(model="tiny", sft={"memory": "gold"})
    with pytest.raises(UsageError, match="fsdp shards"):
        TrainConfig(model="tiny", distributed={"fsdp": True}, sft={"memory": "rehearsed"})
