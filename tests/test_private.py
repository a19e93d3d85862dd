import pytest

from envace.build import build_engine
from envace.config import PrivateOptions, RehearserOptions, RolloutConfig
from envace.errors import UsageError
from envace.private.memory import parse_memory
from envace.record import score


def _engine(backend, bfcl, steps: int = 20, **private):
    # The scripted oracle needs BFCL's step budget; the tiny model writes 16-token nonsense, a step at a time.
    config = RolloutConfig(batch_size=4, embedding=False, max_new_tokens=16, max_steps_per_turn=steps,
                           rehearser=RehearserOptions(fewshot="other_tasks"), private=PrivateOptions(**private))
    return build_engine(backend, bfcl, config)


def test_budget_zero_is_exactly_the_plain_policy(bfcl, tiny_backend):
    tasks = bfcl.load_tasks("multi_turn_base", "test", limit=2)
    plain = _engine(tiny_backend, bfcl, steps=1).run_batch([(t, 0) for t in tasks])
    tiny_backend.clear_caches()
    zero = _engine(tiny_backend, bfcl, steps=1, mode="parallel", budget=0).run_batch([(t, 0) for t in tasks])
    assert [ep.ids for ep in zero] == [ep.ids for ep in plain]
    assert not any(ep.memories or ep.imagined for ep in zero)


@pytest.mark.parametrize("mode", ["parallel", "sequential"])
def test_no_real_call_during_rehearsal_and_the_memory_reaches_the_committed_prompt(bfcl, reference_policy, mode):
    tasks = bfcl.load_tasks("multi_turn_base", "test", limit=2)
    executions = []
    engine = _engine(reference_policy(tasks), bfcl, mode=mode, budget=2)
    memories = engine.before_turn.memories

    def counting(eng, episodes):  # real executions before and after the rehearsal phase must match
        before = [ep.env.executions for ep in episodes]
        out = memories(eng, episodes)
        executions.append([ep.env.executions - b for ep, b in zip(episodes, before, strict=True)])
        return out

    engine.before_turn.memories = counting
    episodes = engine.run_batch([(t, 0) for t in tasks])
    assert executions and all(n == 0 for step in executions for n in step)
    for ep in episodes:
        assert ep.env.executions == len(ep.calls)  # only committed calls reached the environment
        assert len(ep.memories) == len(ep.task.user_turns)  # one memory per rehearsed turn
        assert sum(i["n_calls"] for i in ep.imagined) > 0  # the attempts did call tools, in imagination
        text = bfcl_text(engine, ep)
        for memory in ep.memories:
            assert f"<rehearsal_memory>\n{memory['memory']}\n</rehearsal_memory>" in text
    assert all(score(ep, "real")["success"] for ep in episodes)  # the oracle still succeeds for real


def bfcl_text(engine, ep):
    return engine.sampler.tokenizer.decode(ep.ids, skip_special_tokens=False)


def test_sequential_attempts_see_the_memory_of_earlier_ones(bfcl, reference_policy):
    tasks = bfcl.load_tasks("multi_turn_base", "test", limit=1)
    (ep,) = _engine(reference_policy(tasks), bfcl, mode="sequential", budget=3).run_batch([(tasks[0], 0)])
    first_turn = [i for i in ep.imagined if i["turn"] == 0]
    assert [i["memory_seen"] for i in first_turn] == ["", "1 attempt(s)", "[1 attempt(s)] + 1 attempt(s)"]
    assert ep.memories[0]["memory"] == "[[1 attempt(s)] + 1 attempt(s)] + 1 attempt(s)"
    parallel = _engine(reference_policy(tasks), bfcl, mode="parallel", budget=3).run_batch([(tasks[0], 0)])[0]
    assert parallel.memories[0]["memory"] == "3 attempt(s)"  # one summary of three independent attempts


def test_cost_counters_add_up(bfcl, reference_policy):
    tasks = bfcl.load_tasks("multi_turn_base", "test", limit=2)
    engine = _engine(reference_policy(tasks), bfcl, mode="parallel", budget=2, measure_change=True)
    for ep in engine.run_batch([(t, 0) for t in tasks]):
        row = score(ep, "real")
        for m in ep.memories:
            imagined = [i for i in ep.imagined if i["turn"] == m["turn"]]
            assert len(imagined) == 2
            assert m["caller_tokens"] == sum(i["caller_tokens"] for i in imagined) > 0
            assert m["rehearser_tokens"] == sum(i["rehearser_tokens"] for i in imagined)
            assert m["imagined_steps"] == sum(i["n_steps"] for i in imagined)
            assert m["summariser_tokens"] > 0 and m["decision_changed"] is not None
        assert row["private_tokens"] == sum(m["caller_tokens"] + m["rehearser_tokens"] + m["summariser_tokens"]
                                            for m in ep.memories)


def test_episode_scope_rehearses_the_whole_script_once(bfcl, reference_policy):
    tasks = bfcl.load_tasks("multi_turn_base", "test", limit=1)
    (ep,) = _engine(reference_policy(tasks), bfcl, mode="parallel", budget=1, scope="episode").run_batch(
        [(tasks[0], 0)])
    assert [m["turn"] for m in ep.memories] == [0]
    assert ep.imagined[0]["transcript"].count("User: ") == len(tasks[0].user_turns) - 1  # later turns imagined too


def test_an_unusable_memory_is_recorded_and_the_turn_goes_on_without_one(bfcl, tiny_backend):
    assert parse_memory("") == ("", "empty_memory")
    assert parse_memory('<tool_call>\n{"name": "ls", "arguments": {}}\n</tool_call>')[1] == "tool_call_in_memory"
    assert parse_memory("<memory> call ls first </memory>") == ("call ls first", None)
    tasks = bfcl.load_tasks("multi_turn_base", "test", limit=1)
    engine = _engine(tiny_backend, bfcl, steps=1, mode="parallel", budget=1, memory_tokens=4, max_steps=1)
    (ep,) = engine.run_batch([(tasks[0], 0)])
    assert ep.termination is not None and ep.memories
    for m in ep.memories:
        assert (m["memory"] == "") == (m["memory_error"] is not None)


def test_an_imagined_attempt_has_no_environment_only_the_tools(bfcl, reference_policy):
    """Imagined attempts play in a rehearsed world and carry the tools' schemas, never an environment."""
    tasks = bfcl.load_tasks("multi_turn_base", "test", limit=1)
    engine = _engine(reference_policy(tasks), bfcl, mode="parallel", budget=1)
    seen = []
    play = engine.before_turn._sub_engine

    def recording(eng):
        sub = play(eng)
        inner = sub.play
        sub.play = lambda episodes: (seen.extend(episodes), inner(episodes))[1]
        return sub

    engine.before_turn._sub_engine = recording
    (ep,) = engine.run_batch([(tasks[0], 0)])
    assert seen and all(a.env is None and a.tools == ep.tools for a in seen)
    assert type(engine.before_turn._sub_engine(engine).world).__name__ == "RehearsedWorld"


def test_bad_private_options_are_clear_errors():
    for bad in ({"budget": -1}, {"mode": "beam"}, {"scope": "life"}):
        with pytest.raises(UsageError):
            RolloutConfig(model="tiny", private=PrivateOptions(**bad))
    with pytest.raises(UsageError, match="leakage"):  # test tasks' own results would leak
        RolloutConfig(model="tiny", private=PrivateOptions(mode="parallel", budget=1),
                      rehearser=RehearserOptions(fewshot="reference"))


def test_sweep_writes_one_table_and_resumes_without_redoing_cells(tmp_path, capsys):
    import json

    from envace.cli import main
    from envace.store import connect

    config = tmp_path / "sweep.toml"
    config.write_text('[rollout]\nmodel = "tiny"\nlimit = 1\nmax_new_tokens = 4\nmax_steps_per_turn = 1\n'
                      'embedding = false\n[rollout.rehearser]\nfewshot = "none"\nmax_new_tokens = 4\n'
                      '[rollout.private]\nmax_steps = 1\nmemory_tokens = 4\n')
    args = ["sweep", "--name", "sw", "--models", "base=tiny", "--budgets", "0,1", "--modes", "parallel,sequential",
            "--config", str(config), "--root", str(tmp_path)]
    assert main(args) == 0
    con = connect(tmp_path)
    cells = con.execute("SELECT mode, budget, episodes FROM sweep ORDER BY mode").fetchall()
    assert cells == [("none", 0, 1), ("parallel", 1, 1), ("sequential", 1, 1)]
    assert con.execute("SELECT count(*) FROM memories").fetchall()[0][0] >= 2  # the N = 1 cells rehearsed
    meta = tmp_path / "sw-base-sequential-1" / "run.json"
    data = json.loads(meta.read_text())
    meta.write_text(json.dumps({**data, "status": "running", "pid": 999_999_999}))  # as if killed mid-cell
    capsys.readouterr()
    # a reader polling the cell while it is redone sees the old run or the new one, never a missing folder
    import threading

    seen, done = [], threading.Event()

    def read():
        while not done.is_set():
            try:
                seen.append(json.loads(meta.read_text())["status"])
            except FileNotFoundError:
                seen.append("missing")

    reader = threading.Thread(target=read)
    reader.start()
    try:
        assert main(args) == 0
    finally:
        done.set()
        reader.join()
    assert "missing" not in seen and seen[0] == "running" and seen[-1] == "completed"
    assert not list((tmp_path / ".staging").iterdir())  # the old cell is gone once swapped out
    out = capsys.readouterr().out
    assert out.count("done already, kept") == 2 and "cell 3/3 sw-base-sequential-1\n" in out
    # each N = 1 cell against N = 0, paired by turn, its two cells' tests Holm-adjusted together
    assert "against N = 0, paired by turn" in out and "adjusted over the family of this table's 4 tests" in out
    assert (tmp_path / "sw" / "sweep.csv").read_text().count("\n") == 4
    assert main(args[:-2] + ["--budgets", "-1", "--root", str(tmp_path)]) == 2
