"""Private rehearsal's `memory = "select"`: the imagined attempts are scored by their imagined outcome and the best
one's first message is committed, with no summariser and no memory in the prompt (`envace/private/selection.py`)."""

import math

import pytest

from envace.build import build_engine
from envace.config import PrivateOptions, RehearserOptions, RolloutConfig
from envace.errors import UsageError
from envace.formats import render_tool_call
from envace.policy.backend import Generation
from envace.policy.scripted import ReferencePolicy
from envace.private.selection import verdict
from envace.record import score, write_step
from envace.store import Run, connect

WRONG = '<tool_call>\n{"name": "no_such_tool", "arguments": {}}\n</tool_call>'


class Unsteady(ReferencePolicy):
    """The reference policy, save for the imagined attempts at one parity of a backend call (`bad` = 0: attempts
    0, 2, …): they open each turn with a call to a tool that does not exist, then go on with the turn's other
    gold calls. Imagined attempts are the sampled ones (temperature > 0) whose prompts are identical: the attempts
    of one turn start from the same context."""

    def __init__(self, tokenizer, tasks, bad: int) -> None:
        super().__init__(tokenizer, tasks)
        self.bad = bad

    def generate(self, prompts, params):
        out = super().generate(prompts, params)
        for n, (prompt, gen) in enumerate(zip(prompts, out, strict=True)):
            if params.temperature > 0 and n % 2 == self.bad and prompts.count(prompt) > 1 and "<tool_call>" in gen.text:
                out[n] = Generation(self.tokenizer.encode(WRONG, add_special_tokens=False) + [self.end], WRONG, "stop")
        return out


def _engine(backend, bfcl, **private):
    config = RolloutConfig(batch_size=4, embedding=False, max_new_tokens=16, max_steps_per_turn=20,
                           rehearser=RehearserOptions(fewshot="other_tasks"),
                           private=PrivateOptions(mode="parallel", memory="select", max_steps=20, **private))
    return build_engine(backend, bfcl, config)


def _first_messages(ep) -> dict[int, str]:
    """Each turn's first committed caller message."""
    out: dict[int, str] = {}
    for g in ep.generations:
        if g.role == "caller":
            out.setdefault(g.turn, g.gen.text)
    return out


@pytest.mark.parametrize("select_by", ["judge", "checklist"])
@pytest.mark.parametrize("bad", [0, 1])
def test_select_commits_the_first_call_of_the_attempt_with_the_best_imagined_outcome(bfcl, tiny, select_by, bad,
                                                                                     tmp_path):
    tasks = bfcl.load_tasks("multi_turn_base", "test", limit=1)
    backend = Unsteady(tiny[1], tasks, bad)
    engine = _engine(backend, bfcl, budget=2, select_by=select_by, measure_change=True)
    (ep,) = engine.run_batch([(tasks[0], 0)])
    good = 1 - bad
    assert len(ep.memories) == len(tasks[0].user_turns)
    firsts = _first_messages(ep)
    for m in ep.memories:
        turn = m["turn"]
        attempts = [i for i in ep.imagined if i["turn"] == turn]
        assert [a["attempt"] % 2 for a in attempts] == [0, 1]
        gold = tasks[0].reference[turn]
        if not gold:  # nothing to call: both attempts alike, the first one chosen
            continue
        assert attempts[bad]["score"] < attempts[good]["score"] == 1.0
        assert m["selected_attempt"] == attempts[good]["attempt"] and m["selected_score"] == 1.0
        assert m["memory"] == "" and m["memory_kind"] == "select" and m["select_by"] == select_by
        assert firsts[turn] == render_tool_call(gold[0].call)  # the chosen attempt's first call, committed
        assert m["decision_changed"] is False  # the plain greedy policy would have made the same call
        if select_by == "judge":
            assert attempts[good]["judgement"] == "yes" and attempts[bad]["judgement"] == "no"
            assert attempts[good]["rehearser_tokens"] > 0
    text = backend.tokenizer.decode(ep.ids, skip_special_tokens=False)
    assert "<rehearsal_memory>" not in text  # no memory in the committed prompt
    assert not any("## Imagined attempt" in backend.tokenizer.decode(p) for p in backend.prompts)  # no summariser
    assert score(ep, "real")["success"] and ep.env.executions == len(ep.calls)
    # the choice is stored: the memories and imagined tables' columns
    run = Run.create(tmp_path, "rollout", {}, "scripted", "sel")
    write_step(run, 0, [ep], [score(ep, "real")], "s0")
    con = connect(tmp_path)
    stored = con.execute("SELECT m.turn, m.selected_attempt, i.score FROM memories m JOIN imagined i "
                         "ON i.episode_id = m.episode_id AND i.attempt = m.selected_attempt ORDER BY m.turn").fetchall()
    assert [(t, a) for t, a, _ in stored] == [(m["turn"], m["selected_attempt"]) for m in ep.memories]
    assert all(s == 1.0 for _, _, s in stored)


def test_select_breaks_ties_to_the_first_attempt(bfcl, reference_policy):
    tasks = bfcl.load_tasks("multi_turn_base", "test", limit=1)
    (ep,) = _engine(reference_policy(tasks), bfcl, budget=3).run_batch([(tasks[0], 0)])
    for m in ep.memories:  # every attempt replays the reference alike: all judged yes, the first one chosen
        attempts = [i for i in ep.imagined if i["turn"] == m["turn"]]
        assert [a["score"] for a in attempts] == [1.0, 1.0, 1.0]
        assert m["selected_attempt"] == attempts[0]["attempt"]
    assert score(ep, "real")["success"]


def test_a_judge_answer_scores_the_probability_of_yes(tiny):
    decode = tiny[1].decode
    yes, no = (tiny[1].encode(w, add_special_tokens=False) for w in ("yes", "no"))
    p = 0.8
    assert verdict(Generation(yes, "yes", "stop", [math.log(p)] * len(yes)), decode)[0] == pytest.approx(p)
    assert verdict(Generation(no, "No.", "stop", [math.log(p)] * len(no)), decode)[0] == pytest.approx(1 - p)
    assert verdict(Generation(yes, "yes", "stop"), decode) == (1.0, None)  # no log-probs: the answer alone
    assert verdict(Generation(no, "perhaps", "stop"), decode) == (0.5, "judge_unparsed")


def test_select_with_budget_zero_or_one_or_in_sequence_is_refused(tmp_path, capsys):
    with pytest.raises(UsageError, match="budget 0 has none"):
        PrivateOptions(mode="parallel", budget=0, memory="select")
    with pytest.raises(UsageError, match="budget 1 has nothing to choose from"):  # N = 1: nothing to select
        PrivateOptions(mode="parallel", budget=1, memory="select")
    with pytest.raises(UsageError, match="use mode parallel"):
        PrivateOptions(mode="sequential", budget=2, memory="select")
    from envace.cli import main

    config = tmp_path / "select.toml"
    config.write_text('[rollout]\nmodel = "tiny"\n[rollout.private]\nmode = "parallel"\nmemory = "select"\n')
    capsys.readouterr()
    assert main(["rollout", "--config", str(config), "--root", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "private.memory: select" in err[0] and "budget" in err[0]
    assert not list(tmp_path.glob("*/run.json"))  # refused before any run
