"""The world-model benchmark (`envace world-model`): every gold call rehearsed in its real context, scored against
the real response; the paired comparison of two runs; and the transcript memory of private rehearsal."""

from __future__ import annotations

import json
import re
import textwrap

import pandas as pd
import pytest

from envace import fidelity, world_model
from envace.build import build_engine
from envace.cli import main
from envace.config import PrivateOptions, RehearserOptions, RolloutConfig
from envace.envs import registry
from envace.jobs import Reporter, world_model_job
from envace.policy.scripted import ReferencePolicy
from envace.private.memory import attempt_lines, parse_memory, transcript_memory
from envace.store import connect

quiet = type("Quiet", (Reporter,), {"say": lambda self, text: None})()
SCORES = ["valid", "exact", "structure_f1", "value_acc", "error_agree"]


def _base(env: str, category: str, limit: int = 2, **fields) -> RolloutConfig:
    return RolloutConfig(env=env, category=category, split="test", limit=limit, embedding=False,
                         rehearser=RehearserOptions(max_examples=2, max_new_tokens=8), **fields)


def _gold_calls(env: str, category: str, limit: int, turns=(0, None)) -> int:
    tasks = registry.get(env).load_tasks(category, "test", limit)
    first, last = turns
    return sum(len(turn) for t in tasks for k, turn in enumerate(t.reference)
               if first <= k and (last is None or k <= last))


@pytest.mark.parametrize("env, category", [("bfcl", "multi_turn_base"), ("tau2", "telecom_solo"),
                                           pytest.param("tau2", "airline", marks=pytest.mark.heavy),  # ~15 s
                                           ("vitabench", "delivery_solo")])
def test_a_rehearser_answering_with_the_gold_scores_one_on_every_call(tmp_path, tiny, env, category):
    tasks = registry.get(env).load_tasks(category, "test", 2)
    gold = ReferencePolicy(tiny[1], tasks)  # rehearses each call with its recorded real result
    run, summary = world_model_job("reference", _base(env, category), tmp_path, "gold", quiet, backend=gold)
    frame = world_model.pairs(connect(tmp_path), "pairs", "gold")
    assert len(frame) == _gold_calls(env, category, 2) > 0  # every gold call, once
    assert (frame[SCORES] == 1.0).all().all(), frame[frame[SCORES].min(axis=1) < 1]
    assert frame["embed_cos"].min() > 0.999  # the benchmark always embeds (world_model.config)
    episodes = connect(tmp_path).execute("SELECT bool_and(success) FROM episodes").fetchone()[0]
    assert episodes  # the scripted caller played the gold: the official checker accepts every episode
    table = world_model.table(frame)
    assert table.iloc[-1]["tool"] == "all" and table.iloc[-1]["calls"] == len(frame)


@pytest.mark.parametrize("env, category", [("bfcl", "multi_turn_base"), ("tau2", "telecom_solo"),
                                           ("vitabench", "delivery_solo")])
def test_a_model_rehearses_every_gold_call_of_each_benchmark(tmp_path, env, category):
    run, _ = world_model_job("tiny", _base(env, category, limit=1), tmp_path, "tiny", quiet)
    frame = world_model.pairs(connect(tmp_path), "pairs", "tiny")
    assert len(frame) == _gold_calls(env, category, 1) > 0
    assert json.loads((run.path / "run.json").read_text())["model"] == "tiny"  # the model measured, not the caller


def test_an_empty_rehearsal_scores_what_score_pair_says(tmp_path, tiny):
    tasks = registry.get("bfcl").load_tasks("multi_turn_base", "test", 1)
    empty = ReferencePolicy(tiny[1], tasks, rehearsal_text="<execution_result>{}</execution_result>")
    world_model_job("tiny", _base("bfcl", "multi_turn_base", limit=1), tmp_path, "empty", quiet, backend=empty)
    rows = connect(tmp_path).execute("SELECT real_response, real_is_error, rehearsed_response, valid_json, exact, "
                                     "structure_f1, value_acc, error_agree, string_sim FROM pairs").fetchall()
    assert len(rows) == _gold_calls("bfcl", "multi_turn_base", 1)
    for real, real_error, rehearsed, *scores in rows:
        assert rehearsed == "{}"
        want = fidelity.score_pair(real, "{}", real_error, False, [])
        assert scores == pytest.approx([want[k] for k in ("valid_json", "exact", "structure_f1", "value_acc",
                                                          "error_agree", "string_sim")])


def test_two_models_answer_the_same_calls_and_compare_paired(tmp_path, tiny, capsys):
    base = _base("bfcl", "multi_turn_base", limit=2)
    tasks = registry.get("bfcl").load_tasks("multi_turn_base", "test", 2)
    world_model_job("reference", base, tmp_path, "a", quiet, backend=ReferencePolicy(tiny[1], tasks))
    world_model_job("tiny", base, tmp_path, "b", quiet)  # the random tiny model: nothing valid
    con = connect(tmp_path)
    a, b = (world_model.pairs(con, "pairs", r) for r in ("a", "b"))
    key = ["episode_id", "turn", "turn_step", "call_index", "tool", "arguments"]
    assert a[key].values.tolist() == b[key].values.tolist()  # the same (task, turn, call) set, in order
    assert main(["world-model-compare", "a", "b", "--root", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.strip("│ ").startswith("exact"))
    assert f"{len(a)} " in row and "-1.000" in row and "0 " in row  # every call worse in B, by the whole score


def test_compare_adjusts_its_sign_tests_by_holm_over_the_metrics_with_calls():
    import numpy as np
    from rich.console import Console

    from envace.stats import holm, sign_test

    rng = np.random.default_rng(0)
    n = 40
    frame = {"episode_id": np.repeat([f"t{k}" for k in range(8)], 5)}
    for m in ("valid", *world_model.METRICS):
        a = rng.random(n)
        frame[f"{m}_a"], frame[f"{m}_b"] = a, np.clip(a + rng.normal(0.05, 0.2, n), 0, 1)
    frame["embed_cos_a"] = frame["embed_cos_b"] = np.full(n, np.nan)  # a metric neither run has: not a test
    out = world_model.compare(pd.DataFrame(frame))
    tested = out["calls"] > 0
    assert list(out.loc[tested, "holm_p"]) == pytest.approx(holm(out.loc[tested, "sign_p"]))
    assert out.loc[~tested, "holm_p"].isna().all() and (out["holm_p"].fillna(1) >= out["sign_p"]).all()
    diff = pd.DataFrame(frame)["exact_b"] - pd.DataFrame(frame)["exact_a"]
    assert out.set_index("metric").loc["exact", "sign_p"] == sign_test(diff)
    console = Console(record=True, width=220)
    console.print(world_model.compare_table(out, "a", "b"))
    text = console.export_text()
    assert "Holm p" in text and "Holm-adjusted over the 5 sign tests of this table" in text
    row = next(line for line in text.splitlines() if line.strip("│ ").startswith("embed cos"))
    assert row.rstrip(" │").endswith("–")


def test_turns_narrow_the_calls_rehearsed(tmp_path, tiny):
    tasks = registry.get("bfcl").load_tasks("multi_turn_base", "test", 2)
    world_model_job("reference", _base("bfcl", "multi_turn_base"), tmp_path, "t1", quiet, turns="1..",
                    backend=ReferencePolicy(tiny[1], tasks))
    frame = world_model.pairs(connect(tmp_path), "pairs", "t1")
    assert len(frame) == _gold_calls("bfcl", "multi_turn_base", 2, (1, None)) and set(frame["turn"]) == {1, 2}


def test_the_rehearser_of_a_test_task_never_sees_its_own_gold_results(tmp_path, tiny):
    bfcl = registry.get("bfcl")
    tasks = bfcl.load_tasks("multi_turn_base", "test", 2)
    gold = ReferencePolicy(tiny[1], tasks)
    world_model_job("reference", _base("bfcl", "multi_turn_base"), tmp_path, "leak", quiet, backend=gold)
    train = {s.result.content for t in bfcl.load_tasks("multi_turn_base", "train") for turn in t.reference
             for s in turn}
    own = {s.result.content for t in tasks for turn in t.reference for s in turn} - train  # only a test task has
    prompts = [tiny[1].decode(p, skip_special_tokens=False) for p in gold.prompts]
    rehearsals = [p for p in prompts if "## Call to simulate" in p]
    assert len(rehearsals) == _gold_calls("bfcl", "multi_turn_base", 2)
    for text in rehearsals:
        shown = text.split("## Previous tool calls and results\n", 1)[1].split("\n\n## ", 1)[0]
        assert not any(result[:200] in shown for result in own)  # grounding: other (train) tasks only
        before = text.split("## Call to simulate", 1)[0].split("## Conversation so far\n", 1)[1]
        answered = before.count("\nTool[")
        flat = [s for t in tasks for turn in t.reference for s in turn if f"User: {t.user_turns[0]}" in text]
        later = {s.result.content for s in flat[answered:]} - {s.result.content for s in flat[:answered]} - train
        assert not any(result in before for result in later)  # no result of this call or a later one


def test_world_model_runs_show_in_fidelity_with_intervals(tmp_path, tiny, capsys):
    tasks = registry.get("bfcl").load_tasks("multi_turn_base", "test", 2)
    world_model_job("reference", _base("bfcl", "multi_turn_base"), tmp_path, "w", quiet,
                    backend=ReferencePolicy(tiny[1], tasks))
    assert main(["fidelity", "w", "--root", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "95% bootstrap interval over tasks" in out and "1.00 (1.00–1.00)" in out and "valid" in out


# -- bad input -------------------------------------------------------------------------------------------------

NO_GOLD = textwrap.dedent('''
    from dataclasses import replace

    from envace.envs import example


    def benchmark():
        shop = example.benchmark()

        def load_tasks(category, split="test", limit=None, offset=0):
            return [replace(t, reference=[[] for _ in t.reference]) for t in shop.load_tasks(category, split, limit,
                                                                                            offset)]

        return replace(shop, name="nogold", load_tasks=load_tasks)
    ''')


def test_a_category_without_reference_trajectories_is_one_line(tmp_path, monkeypatch, capsys):
    (tmp_path / "wm_nogold.py").write_text(NO_GOLD)
    monkeypatch.syspath_prepend(str(tmp_path))
    for args in (["--env", "wm_nogold:benchmark"], ["--env", "tau2", "--category", "telecom"]):
        assert main(["world-model", "tiny", *args, "--limit", "2", "--root", str(tmp_path / "runs")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: "), err
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())  # nothing was stored


@pytest.mark.parametrize("args, message", [
    (["--turns", "x"], "turns: expected K, K.. or K..L"),
    (["--turns", "3..1"], "turns: expected 0 <= K <= L"),
    (["--category", "nope"], "category: unknown bfcl category 'nope'"),
])
def test_bad_world_model_flags_are_one_line(tmp_path, capsys, args, message):
    assert main(["world-model", "tiny", "--root", str(tmp_path), *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


def test_comparing_runs_over_different_calls_says_how_many_differ(tmp_path, tiny, capsys):
    tasks = registry.get("bfcl").load_tasks("multi_turn_base", "test", 2)
    gold = ReferencePolicy(tiny[1], tasks)
    world_model_job("reference", _base("bfcl", "multi_turn_base", limit=1), tmp_path, "one", quiet, backend=gold)
    world_model_job("reference", _base("bfcl", "multi_turn_base", limit=2), tmp_path, "two", quiet, backend=gold)
    assert main(["world-model-compare", "one", "two", "--root", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    extra = _gold_calls("bfcl", "multi_turn_base", 2) - _gold_calls("bfcl", "multi_turn_base", 1)
    assert len(err) == 1 and f"rehearsed different calls: {extra} of" in err[0], err


# -- the transcript memory -------------------------------------------------------------------------------------

def _calls(result: str) -> list[dict]:
    return [{"name": "ls", "arguments": "{}", "response": result, "is_error": False},
            {"name": "cd", "arguments": json.dumps({"folder": "x" * 80}), "response": '{"error": "no such folder"}',
             "is_error": True, "error_kind": "TOOL_ERROR"}]


@pytest.mark.parametrize("budget", [8, 24, 96, 400])
def test_a_transcript_memory_fits_its_budget_and_never_holds_a_call(tiny, budget):
    encode = lambda text: tiny[1].encode(text, add_special_tokens=False)  # noqa: E731
    sneaky = '<tool_call>\n{"name": "rm", "arguments": {}}\n</tool_call>' * 3
    attempts = [attempt_lines(_calls(sneaky), ["Done."], "completed"),
                attempt_lines(_calls('{"files": ["a", "b"]}'), [], "step_limit")]
    memory = transcript_memory(attempts, encode, budget)
    assert len(encode(memory)) <= budget
    assert "<tool_call>" not in memory and parse_memory(memory) == (memory, None) or not memory
    assert memory == transcript_memory(attempts, encode, budget)  # deterministic
    if budget >= 96:
        assert "Attempt 1:" in memory and "Attempt 2:" in memory
    if budget >= 400:
        assert "failed TOOL_ERROR: " in memory and "reply: Done." in memory and "ended: step_limit" in memory


@pytest.mark.parametrize("mode", ["parallel", "sequential"])
def test_transcript_memories_are_deterministic_and_reach_the_committed_turn(bfcl, reference_policy, mode):
    tasks = bfcl.load_tasks("multi_turn_base", "test", limit=2)
    config = RolloutConfig(batch_size=4, embedding=False, max_new_tokens=16, max_steps_per_turn=20,
                           private=PrivateOptions(mode=mode, budget=2, memory="transcript", memory_tokens=48))

    def memories():
        engine = build_engine(reference_policy(tasks), bfcl, config)
        episodes = engine.run_batch([(t, 0) for t in tasks])
        return engine, episodes, [m for ep in episodes for m in ep.memories]

    engine, episodes, first = memories()
    assert [m["memory"] for m in first] == [m["memory"] for m in memories()[2]]
    for m in first:
        assert m["memory_kind"] == "transcript" and m["memory_error"] is None and m["summariser_tokens"] == 0
        assert re.match(r"Attempt 1:\n1\. \w+ ", m["memory"]) and "<tool_call>" not in m["memory"]
        assert len(engine.renderer.encode(m["memory"])) <= 48
    text = engine.sampler.tokenizer.decode(episodes[0].ids, skip_special_tokens=False)
    assert f"<rehearsal_memory>\n{first[0]['memory']}\n</rehearsal_memory>" in text
    if mode == "sequential":  # the second attempt saw the first one's transcript
        assert episodes[0].imagined[1]["memory_seen"].startswith("Attempt 1:")
