"""The private-rehearsal ladder (`envace private-ladder`, `envace/private/ladder.py`): each rung's memory, the
real environment left as it was, the paired table written and resumed, and the refusals."""

import json
import pickle
from dataclasses import replace

import pytest

from envace import units
from envace.build import build_engine
from envace.cli import main
from envace.config import PrivateOptions, RehearserOptions, RolloutConfig
from envace.errors import UsageError
from envace.formats import render_execution_result
from envace.private import ladder
from envace.private.memory import attempt_lines
from envace.store import connect

TINY_CONFIG = """[rollout]
model = "tiny"
mode = "real"
limit = 1
max_new_tokens = 4
max_steps_per_turn = 1
embedding = false
[rollout.rehearser]
fewshot = "none"
max_new_tokens = 4
[rollout.private]
max_steps = 1
memory_tokens = 4
"""


def _turns(bfcl, tokenizer, limit: int | None = None):
    """The 1-call test turns of BFCL multi_turn_base, as the study evaluates them (after their gold prefix)."""
    cfg = RolloutConfig(model="tiny", unit="turn", max_turn_calls=1, max_new_tokens=1024, limit=limit)
    return units.select(cfg, bfcl, tokenizer)[1]


def _engine(backend, bfcl, rung: str, memory: str = "transcript", budget: int = 1, **rollout):
    config = RolloutConfig(mode="real+shadow", batch_size=4, embedding=False, max_new_tokens=64,
                           max_steps_per_turn="auto", rehearser=RehearserOptions(fewshot="other_tasks"),
                           private=PrivateOptions(mode="parallel", budget=budget, memory=memory, max_steps=4,
                                                  memory_tokens=400, measure_change=True), **rollout)
    return build_engine(backend, bfcl, config, private_hook=ladder.hook(rung))


def _opened(engine, tasks):
    """Episodes started as the engine starts them (gold prefix replayed in the real environment), turn left open."""
    episodes = [engine.start(t, 0) for t in tasks]
    assert all(ep.open_turn for ep in episodes)
    return episodes


def _gold_texts(task, turns) -> set[str]:
    """Every argument object and real answer of the gold calls of `turns` of `task`, as a memory would show them."""
    out = set()
    for k in turns:
        for step in task.reference[k] if k < len(task.reference) else []:
            out.add(json.dumps(step.call.arguments, ensure_ascii=False))
            out.add(" ".join(step.result.content.split()))
    return {t for t in out if len(t) > 8}


def _leaks(text: str, own: set[str], others: set[str]) -> list[str]:
    """The other turns' gold texts found in `text` (each as far as a memory line shows it) that the turn's own gold
    does not also hold."""
    found = []
    for other in others:
        shown = other[:50]
        if any(shown in mine for mine in own):
            continue
        if shown in " ".join(text.split()):
            found.append(shown)
    return found


@pytest.mark.parametrize("memory", ["transcript", "summary"])
def test_a_reference_memory_holds_its_own_turns_gold_and_no_other_turns_or_tasks(bfcl, tiny, reference_policy,
                                                                                 memory):
    """The leak guard: every 1-call test turn's reference memory (and, for a summary, the summariser's whole prompt)
    against the gold of every other turn of every test task, its own task's earlier turns included."""
    every = bfcl.load_tasks("multi_turn_base", "test")
    turns = _turns(bfcl, tiny[1])
    assert len(turns) >= 117  # the study's 117, and any whose gold message its token budget leaves out
    policy = reference_policy(turns)
    engine = _engine(policy, bfcl, "reference", memory)
    hook = engine.before_turn
    all_gold = {(t.uid, k): _gold_texts(t, [k]) for t in every for k in range(len(t.reference))}
    checked = 0
    for start in range(0, len(turns), 39):
        batch = turns[start:start + 39]
        episodes = _opened(engine, batch)
        policy.prompts.clear()
        written = hook.write(engine, episodes)
        prompts = [text for text in map(policy.tokenizer.decode, policy.prompts) if "## Imagined attempt" in text]
        assert len(prompts) == (len(batch) if memory == "summary" else 0)
        for n, (ep, (text, _, _)) in enumerate(zip(episodes, written, strict=True)):
            uid, k = units.source_uid(ep.task), ep.turn
            own = all_gold[(uid, k)]
            others = set().union(*(texts for key, texts in all_gold.items() if key != (uid, k)))
            seen = prompts[n] if memory == "summary" else text
            assert own and any(t[:50] in " ".join(seen.split()) for t in own), ep.task.uid  # its own gold is there
            assert _leaks(seen, own, others) == [], ep.task.uid
            checked += 1
    assert checked == len(turns)
    # the check catches a leak: the memory of another turn's gold, read as this turn's
    a, b = turns[0], next(t for t in turns if units.source_uid(t) != units.source_uid(turns[0]))
    foreign = ladder.gold_steps(_opened(engine, [b])[0])
    lines = attempt_lines([{"name": s.call.name, "arguments": json.dumps(s.call.arguments), "response":
                            s.result.content, "is_error": False} for s in foreign], [], "completed")
    own = all_gold[(units.source_uid(a), a.start_turn)]
    others = set().union(*(v for key, v in all_gold.items() if key != (units.source_uid(a), a.start_turn)))
    assert _leaks("\n".join(lines), own, others)


def _state(env) -> bytes:
    return pickle.dumps(env.instances)


def test_the_real_rung_plays_on_a_copy_and_leaves_the_real_environment_as_it_was(bfcl, tiny, reference_policy):
    turns = _turns(bfcl, tiny[1])
    engine = _engine(reference_policy(turns), bfcl, "real")
    episodes = _opened(engine, turns[:24])
    before = [(_state(ep.env), ep.env.executions) for ep in episodes]
    hook, worlds = engine.before_turn, []
    inner = hook._sub_engine
    hook._sub_engine = lambda eng: (sub := inner(eng), worlds.append(sub.world))[0]
    memories = hook.memories(engine, episodes)
    assert [(_state(ep.env), ep.env.executions) for ep in episodes] == before  # untouched, not even called
    (world,) = worlds
    played = [hook._attempts[ep.episode_id][0] for ep in episodes]
    assert all(a.env is None for a in played)  # the attempt holds no environment; its copy answered it
    assert all(len(a.calls) >= 1 and all(c["source"] == "real" for c in a.calls) for a in played)
    # the calls did change the copies: had they reached the real environments, these would differ now
    moved = [ep for ep, a in zip(episodes, played, strict=True) if _state(world.envs[a.episode_id]) != _state(ep.env)]
    assert len(moved) >= 5
    for ep, memory in zip(episodes, memories, strict=True):
        row = ep.memories[-1]
        assert row["rung"] == "real" and row["decision_changed"] is not None
        calls = json.loads(row["imagined_calls"])
        gold = ladder.gold_steps(ep)
        assert calls[0]["name"] == gold[0].call.name  # the scripted caller played its gold call, for real
        assert row["fidelity"] == 1.0 and row["fidelity_pairs"] == len(calls)
        assert gold[0].call.name in memory  # the transcript memory of the real answers


def test_the_rehearsed_rung_scores_its_answers_against_the_same_calls_run_on_a_copy(bfcl, tiny, reference_policy):
    turns = _turns(bfcl, tiny[1], limit=None)[:8]
    exact = _engine(reference_policy(turns), bfcl, "rehearsed")  # the scripted rehearser answers with the gold's
    episodes = _opened(exact, turns)
    before = [_state(ep.env) for ep in episodes]
    exact.before_turn.memories(exact, episodes)
    assert [_state(ep.env) for ep in episodes] == before
    rows = [ep.memories[-1] for ep in episodes]
    assert all(r["rung"] == "rehearsed" and r["fidelity_pairs"] >= 1 and r["fidelity"] == 1.0 for r in rows)
    wrong = render_execution_result({"imagined": "nothing like the real answer"})
    drifting = _engine(reference_policy(turns, rehearsal=wrong), bfcl, "rehearsed")
    episodes = _opened(drifting, turns)
    drifting.before_turn.memories(drifting, episodes)
    assert all(ep.memories[-1]["fidelity"] < 1.0 for ep in episodes)
    assert all("nothing like the real answer" in ep.memories[-1]["memory"] for ep in episodes)


def test_the_real_and_rehearsed_rungs_imagine_the_same_first_call(bfcl, tiny, reference_policy):
    """Same caller, prompts and seed: the first imagined message is the same whatever was sampled before."""
    turns = _turns(bfcl, tiny[1])[:4]
    first = {}
    for rung, calls_before in (("real", 0), ("rehearsed", 5)):
        engine = _engine(reference_policy(turns), bfcl, rung)
        engine.sampler.calls = calls_before  # another history of calls before this batch
        episodes = _opened(engine, turns)
        engine.before_turn.memories(engine, episodes)
        first[rung] = [json.loads(ep.memories[-1]["imagined_calls"])[:1] for ep in episodes]
        assert engine.before_turn._seed == ladder.batch_seed(0, episodes)
    assert first["real"] == first["rehearsed"]


def test_an_empty_memory_is_the_block_alone(bfcl, tiny, reference_policy):
    turns = _turns(bfcl, tiny[1])[:2]
    engine = _engine(reference_policy(turns), bfcl, "empty")
    (ep,) = engine.run_batch([(turns[0], 0)])
    text = engine.sampler.tokenizer.decode(ep.ids, skip_special_tokens=False)
    assert "<rehearsal_memory>\n \n</rehearsal_memory>" in text
    assert ep.memories[0]["rung"] == "empty" and ep.memories[0]["decision_changed"] is False  # the oracle ignores it


@pytest.mark.heavy
def test_a_tiny_ladder_writes_its_table_and_resumes_without_replaying_done_cells(tmp_path, capsys):
    config = tmp_path / "ladder.toml"
    config.write_text(TINY_CONFIG)
    args = ["private-ladder", "--name", "lad", "--models", "tiny=tiny", "--config", str(config),
            "--root", str(tmp_path), "--budget", "2"]  # select needs N >= 2 to choose from
    assert main(args) == 0
    con = connect(tmp_path)
    # the rehearser's temperature is unset: run.json says what it sampled at (the engine's: greedy for the
    # committed turns, the attempts' 1.0 inside private rehearsal)
    sampling = json.loads((tmp_path / "lad-tiny-rehearsed-s0" / "run.json").read_text())["sampling"]
    assert sampling == {"caller": 0.0, "rehearser": 0.0, "private_attempts": 1.0, "private_rehearser": 1.0}
    names = {"lad-tiny-none", "lad-tiny-empty", "lad-tiny-reference", "lad-tiny-real-s0", "lad-tiny-rehearsed-s0",
             "lad-tiny-select-s0"}
    assert {r[0] for r in con.execute("SELECT run_id FROM runs WHERE run_id LIKE 'lad-%'").fetchall()} == names
    table = con.execute("SELECT label, rung, vs, pairs, mde, holm_mcnemar_p FROM ladder WHERE run_id = 'lad' "
                        "ORDER BY vs, rung").fetchall()
    assert [(r[1], r[2]) for r in table] == [
        ("empty", "N = 0"), ("real", "N = 0"), ("reference", "N = 0"), ("rehearsed", "N = 0"), ("select", "N = 0"),
        ("empty", "rehearsed"), ("real", "rehearsed"), ("reference", "rehearsed"), ("select", "rehearsed")]
    assert all(r[3] == 1 for r in table)
    turns = con.execute("SELECT rung, count(*), count(decision_changed) FROM ladder_turns WHERE run_id = 'lad' "
                        "GROUP BY rung ORDER BY rung").fetchall()
    assert [r[0] for r in turns] == ["empty", "real", "reference", "rehearsed", "select"]
    assert all(n > 0 and measured == n for _, n, measured in turns)  # every turn's change measured
    rungs = con.execute("SELECT DISTINCT rung FROM memories WHERE run_id LIKE 'lad-%' ORDER BY rung").fetchall()
    assert [r[0] for r in rungs] == ["empty", "real", "reference", "rehearsed", "select"]
    assert (tmp_path / "lad" / "ladder.csv").read_text().count("\n") == 10
    assert (tmp_path / "lad" / "diagnosis.csv").read_text().count("\n") == 6
    out = capsys.readouterr().out
    assert "private-rehearsal ladder: each rung against N = 0" in out and "family of this table's 18 tests" in out
    # killed in the real rung's cell: a re-run keeps the five finished cells and plays that one again
    meta = tmp_path / "lad-tiny-real-s0" / "run.json"
    meta.write_text(json.dumps({**json.loads(meta.read_text()), "status": "running", "pid": 999_999_999}))
    assert main(args) == 0
    out = capsys.readouterr().out
    assert out.count("done already, kept") == 5 and "cell 4/6 lad-tiny-real-s0\n" in out
    assert out.count("eval 1 bfcl") == 1  # one cell played
    assert main(["show", "lad", "--root", str(tmp_path)]) == 0
    shown = capsys.readouterr().out
    assert "rehearsed" in shown and "fidelity" in shown and "MDE" in shown


def test_a_rung_without_state_copy_and_a_run_without_weights_are_one_line_refusals(tmp_path, capsys):
    config = tmp_path / "ladder.toml"
    config.write_text(TINY_CONFIG)
    base = ["private-ladder", "--name", "lad", "--config", str(config), "--root", str(tmp_path)]
    # the example shop cannot copy its state: the real rung is refused by name, before any run exists
    assert main(base + ["--models", "tiny=tiny", "--env", "envace.envs.example:benchmark"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "rung real" in err and "ShopEnv" in err and "cannot copy its state" in err
    assert not (tmp_path / "lad").exists()
    assert main(base + ["--models", "tiny=tiny", "--env", "envace.envs.example:benchmark",
                        "--rungs", "empty,reference,rehearsed", "--limit", "1"]) == 0  # without it, the shop plays
    capsys.readouterr()
    # a training run that saved no checkpoint (still running, or SFT not reached) is no model
    run = tmp_path / "unfinished"
    (run / "metrics").mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({"run_id": "unfinished", "kind": "train", "status": "running"}))
    assert main([*base[:2], "lad2", *base[3:], "--models", f"sft={run}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "holds no checkpoint" in err and "sft=" in err
    assert main([*base[:2], "lad2", *base[3:], "--models", f"sft={run / 'metrics'}"]) == 2  # a folder, no weights
    assert "no config.json" in capsys.readouterr().err
    assert not (tmp_path / "lad2").exists()
    for bad in (["--rungs", "empty,vibes"], ["--budget", "0"], ["--mode", "rehearse"], ["--models", "tiny"],
                ["--private-temperature", "-1"], ["--rehearser-temperature", "-0.5"],
                ["--rungs", "select"], ["--rungs", "select", "--budget", "1"]):  # N = 1: nothing to select
        assert main([*base[:2], "lad3", *base[3:], "--models", "tiny=tiny", *bad]) == 2, bad
        assert capsys.readouterr().err.strip().count("\n") == 0


def test_select_is_a_rung_once_private_rehearsal_has_it(bfcl, tiny, reference_policy):
    if not ladder.select_available():
        with pytest.raises(UsageError, match="select"):
            ladder.parse_rungs("rehearsed,select")
        return
    assert ladder.parse_rungs("select,rehearsed") == ["rehearsed", "select"]
    with pytest.raises(UsageError, match="N = 1 has nothing to choose from"):
        ladder.base_config(RolloutConfig(model="tiny"), ["select"])
    two = RolloutConfig(model="tiny", private=PrivateOptions(budget=2))
    base = ladder.base_config(two, ["select"])
    assert ladder.cell_config(ladder.Cell("m", "tiny", "select", 0), base, [0]).private.memory == "select"
    turns = _turns(bfcl, tiny[1])[:4]
    engine = _engine(reference_policy(turns), bfcl, "select", memory="select", budget=2)
    episodes = _opened(engine, turns)
    before = [_state(ep.env) for ep in episodes]
    assert engine.before_turn.memories(engine, episodes) == [""] * len(episodes)  # no memory: a chosen message
    assert [_state(ep.env) for ep in episodes] == before
    for ep in episodes:
        row = ep.memories[-1]
        assert row["rung"] == "select" and row["selected_attempt"] is not None and ep.chosen is not None
        assert row["fidelity_pairs"] >= 1 and row["fidelity"] == 1.0  # the scripted rehearser answers as the gold's


def test_the_ladder_pairs_each_rung_with_n0_and_with_the_rehearsed_memory():
    grid = ladder.cells({"sft": "a", "envace": "b"}, ["empty", "reference", "rehearsed"], [0, 1], greedy=True)
    names = [c.run_name("L") for c in grid if c.label == "sft"]
    assert names == ["L-sft-none", "L-sft-empty", "L-sft-reference", "L-sft-rehearsed-s0", "L-sft-rehearsed-s1"]
    # a greedy rung runs once and serves both seeds; a sampled one is paired seed by seed
    assert ladder._pairs(grid, "L", "sft", "none", "rehearsed", [0, 1]) == [
        ("L-sft-none", "L-sft-rehearsed-s0"), ("L-sft-none", "L-sft-rehearsed-s1")]
    assert ladder._pairs(grid, "L", "sft", "none", "empty", [0, 1]) == [("L-sft-none", "L-sft-empty")]
    sampled = ladder.cells({"sft": "a"}, ["empty"], [0, 1], greedy=False)
    assert [c.run_name("L") for c in sampled] == ["L-sft-none-s0", "L-sft-none-s1", "L-sft-empty-s0", "L-sft-empty-s1"]
    assert replace(ladder.base_config(RolloutConfig(model="tiny"), ["rehearsed"]).private, measure_change=False) == \
        PrivateOptions(mode="parallel", budget=1)
