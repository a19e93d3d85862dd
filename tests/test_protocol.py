"""The protocol's contracts beyond one environment: tasks found by uid and group, graded scores stored (old stores
still read), each benchmark's failure convention, and SFT rows of a conversation played against a scripted user."""

from __future__ import annotations

from dataclasses import replace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from envace.build import build_engine
from envace.config import RehearserOptions, RolloutConfig
from envace.engine.examples import ExampleBank
from envace.engine.rehearser import as_result
from envace.envs import example, registry
from envace.envs.benchmark import json_error
from envace.errors import UsageError
from envace.fidelity import real_error
from envace.formats import parse_execution_result
from envace.policy.scripted import ReferencePolicy
from envace.record import score
from envace.store import SCHEMAS, Run, connect
from envace.types import ToolResult, task_group

SPEC = "envace.envs.example:benchmark"
SHOP = registry.get(SPEC)


def test_the_scripted_policy_finds_its_task_by_uid_when_openings_are_the_same(tiny):
    first, milk = example._task(0), example._task(5)
    twin = replace(milk, uid="shop/twin", user_turns=list(first.user_turns))  # first's words, milk's reference
    cfg = RolloutConfig(env=SPEC, category="groceries", model="tiny", mode="real", embedding=False)
    episodes = build_engine(ReferencePolicy(tiny[1], [first, twin]), SHOP, cfg).run_batch([(first, 0), (twin, 0)])
    assert [score(ep, "real")["success"] for ep in episodes] == [True, True]
    assert [c["name"] for c in episodes[1].calls] == ["add_to_cart", "checkout"]
    assert '"milk"' in episodes[1].calls[0]["arguments"]


def test_the_example_bank_keeps_a_group_apart_and_reads_only_protocol_fields():
    train = SHOP.load_tasks("groceries", "train")
    first, twin = train[0], train[1]
    assert task_group(first) == task_group(twin) == "shop/apples" and "entry" not in first.payload
    bank = ExampleBank(train)
    call = first.reference[0][0].call
    shown = bank.for_call(first, call, RehearserOptions(fewshot="other_tasks"))
    assert shown and all('{"cart": {"apple": 2}}' != e.content for e in shown)  # the twin's answer never grounds it
    demo = bank.demonstration(first)
    assert demo and demo[0]["content"] not in twin.user_turns


def test_graded_scores_are_stored_and_shards_without_their_columns_still_read(tmp_path):
    run = Run.create(tmp_path, "rollout", {}, "tiny", "old")
    old = pa.schema([f for f in SCHEMAS["episodes"] if f.name not in ("score_value", "score_parts")])
    (run.path / "episodes").mkdir()
    pq.write_table(pa.Table.from_pylist([{"run_id": "old", "step": 0, "episode_id": "a", "success": True}],
                                        schema=old), run.path / "episodes" / "batch-00000.parquet")
    assert connect(tmp_path).execute("SELECT success, score_value, score_parts FROM episodes").fetchall() == [
        (True, None, None)]
    run.write("episodes", "batch-00001", [{"run_id": "old", "step": 1, "episode_id": "b", "success": False,
                                           "score_value": 0.5, "score_parts": '{"lines": 0.5}'}])
    rows = connect(tmp_path).execute("SELECT episode_id, score_value, score_parts FROM episodes ORDER BY 1").fetchall()
    assert rows == [("a", None, None), ("b", 0.5, '{"lines": 0.5}')]


def test_each_benchmark_says_how_its_results_fail(tiny):
    from envace.envs.tau2.env import result_is_error

    text = parse_execution_result('<execution_result>\n"Error: flight HAT001 not found"\n</execution_result>')
    assert as_result(text, result_is_error).is_error and as_result(text, result_is_error).error_kind == "TOOL_ERROR"
    assert not as_result(text).is_error  # not a failure where failures are `{"error": …}` objects
    refused = parse_execution_result('<execution_result>\n{"error": "INVALID_PARAMETERS"}\n</execution_result>')
    assert as_result(refused, lambda _: False).error_kind == "INVALID_PARAMETERS"  # the workbench's own refusals
    assert real_error(ToolResult('{"error": "sold out"}'), json_error)  # an unflagged real failure still counts
    assert not real_error(ToolResult("Error: x"), json_error) and real_error(ToolResult("Error: x"), result_is_error)
    hook = replace(SHOP, result_is_error=lambda content: content.startswith("SORRY"))
    cfg = RolloutConfig(env=SPEC, category="groceries", model="tiny", mode="real+shadow", embedding=False)
    engine = build_engine(ReferencePolicy(tiny[1], []), hook, cfg)  # the shadow's error agreement uses the hook
    assert engine.world.is_error("SORRY, closed") and not engine.world.is_error('{"error": "x"}')


def test_sft_rows_of_a_conversation_play_the_reference_against_the_scripted_user(tiny):
    from envace.training.rows import reference_rows

    tau2 = registry.get("tau2")
    (retail,) = tau2.load_tasks("retail", "train", 1)
    assert len(retail.simulated_user.script) == 2 and "###STOP###" in retail.simulated_user.script[-1]
    rows = reference_rows([retail], tau2, tiny[1], RehearserOptions())
    calls = len(retail.reference[0])
    assert [r.role for r in rows].count("caller") == calls + 1  # every gold call, then the closing answer
    assert [r.role for r in rows].count("rehearser") == calls and {r.role for r in rows} <= {
        "caller", "rehearser", "summariser"}
    opening = tiny[1].decode(rows[0].prompt_ids)
    assert retail.simulated_user.script[0] in opening and "No live customer" not in opening
    (telecom,) = tau2.load_tasks("telecom", "train", 1)
    with pytest.raises(UsageError, match="simulated user has no script"):
        reference_rows([telecom], tau2, tiny[1], RehearserOptions())
