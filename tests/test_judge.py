"""The optional rubric judge (`envace/judge.py`, `envace judge`): prompt, parsing, windows, and the stored rows."""

from __future__ import annotations

import re

import pytest

from envace.cli import main
from envace.engine.sampler import Sampler
from envace.envs import registry
from envace.envs.vitabench.data import load_task
from envace.judge import (
    TOO_LONG,
    Item,
    caveat,
    judge,
    judge_prompt,
    parse_verdicts,
    share,
    transcript,
    windows,
)
from envace.policy.backend import Generation, SamplingParams
from envace.store import connect

ROLLOUT = ["rollout", "--env", "vitabench", "--category", "delivery_solo", "--model", "tiny", "--limit", "1",
           "--max-new-tokens", "8", "--max-steps-per-turn", "2"]


class ScriptedJudge:
    """A judge backend that answers a known pattern: rubric k is `yes` when k is odd, `no` when even, and left
    unanswered when k is a multiple of 3; `answers` replaces that with fixed texts, one per call."""

    max_context: int | None = None

    def __init__(self, tokenizer, answers: list[str] | None = None) -> None:
        self.tokenizer, self.answers = tokenizer, answers
        self.end = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.calls = 0
        self.prompts: list[str] = []

    @staticmethod
    def expected(k: int) -> bool | None:  # k counted from 1, as the prompt numbers rubrics
        return None if k % 3 == 0 else bool(k % 2)

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        assert params.temperature == 0.0  # the judge is greedy
        out = []
        for prompt in prompts:
            text = self.tokenizer.decode(prompt, skip_special_tokens=False)
            self.prompts.append(text)
            if self.answers is not None:
                reply = self.answers[min(self.calls, len(self.answers) - 1)]
            else:
                n = int(re.search(r"Answer with exactly (\d+) lines", text).group(1))
                reply = "\n".join(f"{k}: {'yes' if self.expected(k) else 'no'}" for k in range(1, n + 1)
                                  if self.expected(k) is not None)
            out.append(Generation(self.tokenizer.encode(reply, add_special_tokens=False) + [self.end], reply, "stop"))
        self.calls += 1
        return out


# -- rubrics, transcript and prompt ------------------------------------------------------------------------------

def test_vitabench_rubrics_are_deduplicated_and_other_benchmarks_have_none():
    benchmark = registry.get("vitabench")
    task = load_task("delivery", "10711001")  # its state and overall rubrics are the same five strings
    criteria = task.payload["task"]["evaluation_criteria"]
    raw = [r for s in criteria["expected_states"] for r in s["state_rubrics"]] + criteria["overall_rubrics"]
    assert len(raw) == 10 and benchmark.rubrics(task) == list(dict.fromkeys(raw)) and len(benchmark.rubrics(task)) == 5
    assert "Current time: 2025-06-21 11:20:00 (Saturday)" in benchmark.judge_context(task)
    assert registry.get("bfcl").rubrics is None and registry.get("tau2").rubrics is None


def _conversation_rows():
    call = '<tool_call>\n{"name": "search_stores", "arguments": {"keyword": "rice noodles", "n": 3}}\n</tool_call>'
    generations = [
        {"turn": 0, "turn_step": 0, "role": "user", "user_message": None, "completion_text": "I want mild noodles."},
        {"turn": 0, "turn_step": 0, "role": "caller", "user_message": "I want mild noodles.",
         "completion_text": "<think>search first</think>Let me look." + call},
        {"turn": 0, "turn_step": 1, "role": "caller", "user_message": None, "completion_text": "Store A has them."},
        {"turn": 1, "turn_step": 0, "role": "user", "user_message": None, "completion_text": "Great. ###STOP###"},
    ]
    calls = [{"turn": 0, "turn_step": 0, "call_index": 0, "name": "search_stores",
              "arguments": '{"keyword": "rice noodles", "n": 3}', "response": "Store A: rice noodles, 4.8 stars"}]
    return generations, calls


def test_transcript_follows_the_official_form():
    generations, calls = _conversation_rows()
    messages = transcript(generations, calls, "Hello, how can I help you?")
    assert messages == [
        {"role": "assistant", "content": "Hello, how can I help you?"},
        {"role": "user", "content": "I want mild noodles."},
        {"role": "assistant", "content": "Let me look. search_stores(keyword='rice noodles', n=3)"},
        {"role": "tool", "content": "Store A: rice noodles, 4.8 stars"},
        {"role": "assistant", "content": "Store A has them."},
        {"role": "user", "content": "Great. ###STOP###"},
    ]
    solo = [dict(g, role="caller") for g in generations if g["role"] == "caller"]
    assert transcript(solo, calls)[0] == {"role": "user", "content": "I want mild noodles."}  # the opening
    empty = [{"turn": 0, "turn_step": 0, "role": "caller", "user_message": "", "completion_text": "\n\n"}]
    assert transcript(empty, []) == []  # empty messages are skipped


def test_prompt_holds_every_rubric_once_and_the_whole_window():
    benchmark = registry.get("vitabench")
    task = load_task("delivery", "10711001")
    rubrics = benchmark.rubrics(task)
    generations, calls = _conversation_rows()
    messages = transcript(generations, calls, task.simulated_user.greeting)
    chat = judge_prompt(rubrics, messages, windows(len(messages))[0], [None, True, None, None, False],
                        benchmark.judge_context(task))
    text = chat[-1]["content"]
    for k, rubric in enumerate(rubrics, 1):
        assert text.count(rubric) == 1 and f"{k}. [" in text
    assert "2. [met]" in text and "1. [not met]" in text
    for content in ("[2] user: I want mild noodles.", "search_stores(keyword='rice noodles', n=3)",
                    "[4] tool: Store A: rice noodles, 4.8 stars", "[6] user: Great. ###STOP###",
                    "User instruction: It's pouring rain", "Answer with exactly 5 lines"):
        assert content in text


def test_windows_are_ten_messages_overlapping_by_two():
    assert windows(0) == [range(0, 0)] and windows(10) == [range(0, 10)]
    assert windows(11) == [range(0, 10), range(8, 11)]
    assert windows(26) == [range(0, 10), range(8, 18), range(16, 26)]
    for n in range(1, 60):
        ws = windows(n)
        assert set().union(*map(set, ws)) == set(range(n))
        assert all(len(w) <= 10 for w in ws) and all(b.start == a.stop - 2 for a, b in zip(ws, ws[1:], strict=False))


# -- parsing -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ("1: yes\n2: no\n3: yes", [True, False, True]),
    ("[1] Yes, the order was placed.\n**2.** Not met\n- 3) true", [True, False, True]),
    ("Rubric 1 - met\nRubric 2: unmet\n3 = FALSE", [True, False, False]),
    ("1: yes\n2: no", [True, False, None]),                       # partial: the last is missing
    ("<think>1: no</think>\n1: yes\n3: no", [True, None, False]),  # thinking is not an answer
    ("1: yes\n1: no\n1: yes\n2: yes", [None, True, None]),         # contradicted: no verdict
    ("[true, false]", [True, False, None]),
    ('[{"rubric_idx": 2, "rubric": "x", "justification": "y", "meetExpectation": true},'
     ' {"rubric_idx": "1", "meetExpectation": false}]', [False, True, None]),
    ("1: maybe\n2: The assistant did it\n3: yes", [None, None, True]),
])
def test_parse_verdicts(text, expected):
    assert parse_verdicts(text, 3) == expected


@pytest.mark.parametrize("text", [
    "", "no idea", None, 42, b"1: yes", "[" * 100_000 + "]" * 100_000, "[1, 0, 1]", "[{}]", "{\"a\": 1}",
    "0: yes\n4: yes\n99999999999999999999: yes\n-1: yes", "12345: yes", "1:" + " yes" * 100_000,
    "__import__('os').system('echo pwned')", "1: " + "\x00\ud800" * 10,
    '[{"rubric_idx": 1e400, "meetExpectation": true}]', '[{"rubric_idx": true, "meetExpectation": true}]',
    "[" + "1: yes\n" * 10 + "]",
])
def test_malformed_and_hostile_answers_never_raise(text):
    verdicts = parse_verdicts(text, 3)
    assert len(verdicts) == 3 and all(v in (True, False, None) for v in verdicts)
    assert parse_verdicts(text, 0) == []


def test_share_counts_an_unparsed_verdict_as_not_met():
    assert share([True, False, None, True]) == 0.5 and share([]) is None
    assert caveat("m") == "rubric judge: m, a local substitute for the official LLM judge; not comparable with " \
                          "published numbers"


def test_rubric_states_carry_over_windows(tiny):
    """Window 1 meets rubrics 1 and 2; window 2 undoes 1 and says nothing parseable of 2 or 3."""
    backend = ScriptedJudge(tiny[1], ["1: yes\n2: yes", "1: no\n2: perhaps"])
    messages = [{"role": "user" if i % 2 else "assistant", "content": f"message {i}"} for i in range(12)]
    [result] = judge(Sampler(backend), [Item("t", ["a", "b", "c"], messages)], max_new_tokens=8)
    assert result.verdicts == [False, True, None] and backend.calls == 2
    assert "[window 1 of 2]\n1: yes" in result.raw and "[window 2 of 2]\n1: no" in result.raw
    assert "1. [met] a" in backend.prompts[1] and "[12] user: message 11" in backend.prompts[1]
    backend.max_context = 10  # no window fits: no verdicts, no crash, no backend call
    [result] = judge(Sampler(backend), [Item("t", ["a"], messages)], max_new_tokens=8)
    assert result.verdicts == [None] and TOO_LONG in result.raw and backend.calls == 2


# -- `envace judge` end to end -----------------------------------------------------------------------------------

def test_judge_a_stored_vitabench_run(tmp_path, tiny, monkeypatch, capsys):
    root = str(tmp_path)
    assert main([*ROLLOUT, "--root", root, "--run-name", "vb"]) == 0
    scripted = ScriptedJudge(tiny[1])
    monkeypatch.setattr("envace.policy.specs.check_model_spec", lambda spec: None)
    monkeypatch.setattr("envace.policy.load_backend", lambda spec, *a, **k: scripted)
    capsys.readouterr()
    for _ in range(2):  # a re-run rewrites its own shard
        assert main(["judge", "vb", "--root", root, "--model", "scripted"]) == 0
    out = capsys.readouterr().out
    con = connect(root)
    [(uid,)] = con.execute("SELECT task_uid FROM episodes WHERE run_id = 'vb'").fetchall()
    rubrics = registry.get("vitabench").rubrics(load_task("delivery_solo", uid.rsplit("/", 1)[1]))
    rows = con.execute("SELECT rubric_index, rubric, verdict, judge_model, judge_text, episode_id FROM judgements "
                       "ORDER BY rubric_index").fetchall()
    assert [r[0] for r in rows] == list(range(len(rubrics))) and [r[1] for r in rows] == rubrics
    expected = [ScriptedJudge.expected(k) for k in range(1, len(rubrics) + 1)]
    assert [r[2] for r in rows] == expected
    assert {r[3] for r in rows} == {"scripted"} and rows[0][4].startswith("1: yes\n2: no")
    assert "User instruction:" in scripted.prompts[0] and "[1] user: [No live user" in scripted.prompts[0]
    assert len(list((tmp_path / "vb" / "judgements").glob("*.parquet"))) == 1
    met = sum(v is True for v in expected)
    assert caveat("scripted") in out and f"{met / len(rubrics):.3f}" in out and rows[0][5] in out
    assert main(["show", "vb", "--root", root]) == 0
    shown = capsys.readouterr().out
    assert "rubric judge" in shown and caveat("scripted") in shown and f"{met / len(rubrics):.3f}" in shown

    monkeypatch.undo()  # the real tiny model as judge: its verdicts are whatever it writes, most likely none
    assert main(["judge", "vb", "--root", root, "--model", "tiny", "--max-new-tokens", "8", "--limit", "1"]) == 0
    assert caveat("tiny") in capsys.readouterr().out
    tiny_rows = connect(root).execute("SELECT verdict FROM judgements WHERE judge_model = 'tiny'").fetchall()
    assert len(tiny_rows) == len(rubrics) and all(v in (True, False, None) for (v,) in tiny_rows)
    assert len(list((tmp_path / "vb" / "judgements").glob("*.parquet"))) == 2  # one shard per judge model

    assert main(["rollout", "--model", "tiny", "--limit", "1", "--max-new-tokens", "4", "--max-steps-per-turn", "1",
                 "--root", root, "--run-name", "bf"]) == 0
    capsys.readouterr()
    for args, message in ((["judge", "bf"], "plays bfcl, which has no rubrics to judge"),
                          (["judge", "missing"], "no run 'missing'"),
                          (["judge", "vb", "--limit", "0"], "--limit: must be at least 1, got 0"),
                          (["judge", "vb", "--max-new-tokens", "x"], "--max-new-tokens: expected an integer"),
                          (["judge", "vb", "--model", "/no/such/model"], "does not exist")):
        assert main([*args, "--root", root]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error:") and message in err[0], err
