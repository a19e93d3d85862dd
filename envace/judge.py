"""Optional rubric judging: a model scores an episode's transcript against its benchmark's rubrics.

For benchmarks whose official verdict is an LLM reading natural-language rubrics (`Benchmark.rubrics`;
VitaBench), this follows the official evaluator (VitaBench TOOLS.md §6) as closely as a small local judge
allows:
- The transcript (`transcript`): the agent's greeting in a conversation, then the user's, the assistant's and
  the tools' messages in order, empty ones skipped; an assistant's tool calls are appended to its text as
  `name(arg='value', ...)` and their results are messages of role `tool`.
- Sliding windows of 10 messages overlapping by 2 (`windows`), judged in order. Each window's prompt shows the
  task's context (`Benchmark.judge_context`: VitaBench's time and the user's full instruction), every rubric
  with its state so far, the window as `[n] role: content` lines, and the official rules (an order counts only
  when a tool call placed it; strict on quantities and times, lenient on the wording of notes and addresses).
- The judge answers one line per rubric, `<number>: yes` or `<number>: no`; the official judge's JSON list of
  `{rubric_idx, meetExpectation}` objects, and a JSON list of booleans, are read too (`parse_verdicts`). Model
  text is parsed, never evaluated; whatever it writes, a rubric it answers unclearly gets no verdict from it.
  A window's verdict replaces the rubric's state (the judge may set it back to not met when the assistant
  undoes it); an unanswered rubric keeps its state, and one never answered stays `None`.
Differences: upstream's judge is a large hosted model that writes a justification per rubric; here it is
whatever model `envace judge --model` names, greedy, without justifications, and a message is cut to
`MESSAGE_CHARS` characters (further when a prompt would not fit the judge's context).

The share of rubrics met (`share`; `None` counts as not met, as every rubric starts "not met" upstream) is the
episode's `rubric_judge` sub-score, stored in the `judgements` table, never in the official score.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from envace.engine.prompts import ChatRenderer
from envace.engine.sampler import Sampler
from envace.formats import parse_tool_calls, strip_thinking

SUBSCORE = "rubric_judge"
WINDOW, OVERLAP = 10, 2  # the official judge's sliding windows: 10 messages, the last 2 seen again
MESSAGE_CHARS = 1500
_SHORTER = (600, 250)  # message cuts tried in turn when a window's prompt would not fit the judge's context
_PARSED_CHARS = 20_000  # the judge's answer is read up to here
TOO_LONG = "(not judged: the window's prompt does not fit the judge's context)"

JUDGE_SYSTEM = """You are a strict evaluator. You read part of a conversation between a user and the assistant of a \
service app, with the assistant's tool calls and their results, and decide for each rubric whether the assistant \
has met it."""

RULES = """Rules:
- A rubric is met only when the conversation shows the assistant achieved it. An order, booking or reservation \
counts only when the assistant called the tool that makes it and the tool reported success; saying it would do \
so is not enough.
- Be strict about products, stores, quantities, dates and times. Be lenient about the wording of notes and \
addresses.
- A rubric marked met before these messages stays met unless the assistant undoes it here (cancels, changes)."""


def caveat(model: str) -> str:
    """The line printed beside every rubric-judge number."""
    return (f"rubric judge: {model}, a local substitute for the official LLM judge; "
            "not comparable with published numbers")


def share(verdicts: list[bool | None]) -> float | None:
    """The `rubric_judge` sub-score: rubrics met over rubrics (an unparsed verdict is not met); None without any."""
    return sum(v is True for v in verdicts) / len(verdicts) if verdicts else None


# -- the transcript ----------------------------------------------------------------------------------------------

def render_call(name: str, arguments: str) -> str:
    """`name(arg='value', ...)`, the official transcript's form of a tool call (arguments as stored: JSON)."""
    try:
        args = json.loads(arguments)
    except (TypeError, ValueError, RecursionError):
        return f"{name}({arguments})"
    if not isinstance(args, dict):
        return f"{name}({arguments})"
    return f"{name}({', '.join(f'{k}={v!r}' for k, v in args.items())})"


def _cut(text: str, chars: int) -> str:
    return text if len(text) <= chars else text[:chars] + " …[cut]"


def transcript(generations: list[dict[str, Any]], calls: list[dict[str, Any]], greeting: str | None = None,
               chars: int = MESSAGE_CHARS) -> list[dict[str, str]]:
    """One episode's messages from its stored rows: `generations` (caller and user rows: turn, turn_step, role,
    user_message, completion_text) and `calls` (turn, turn_step, call_index, name, arguments, response).

    Within a turn the simulated user writes first (its `user` rows), then the caller's messages follow step by
    step, each with its calls and their fed-back responses. A turn without a user row (a solo or scripted episode)
    opens with the user text the caller was given (`user_message` of its first message).
    """
    messages: list[dict[str, str]] = []

    def add(role: str, text: Any) -> None:
        text = text.strip() if isinstance(text, str) else ""
        if text:
            messages.append({"role": role, "content": _cut(text, chars)})

    add("assistant", greeting)
    turns = sorted({g["turn"] for g in generations} | {c["turn"] for c in calls})
    for turn in turns:
        users = [g for g in generations if g["turn"] == turn and g["role"] == "user"]
        callers = {g["turn_step"]: g for g in generations if g["turn"] == turn and g["role"] == "caller"}
        for g in users:
            add("user", strip_thinking(g["completion_text"] or ""))
        if not users and 0 in callers:
            add("user", callers[0].get("user_message"))
        at_turn = [c for c in calls if c["turn"] == turn]
        for step in sorted(set(callers) | {c["turn_step"] for c in at_turn}):
            made = sorted((c for c in at_turn if c["turn_step"] == step), key=lambda c: c["call_index"])
            text = strip_thinking(callers[step]["completion_text"] or "") if step in callers else ""
            if made:  # the calls were parsed from this text: the judge reads them in the official form
                text = parse_tool_calls(text).text
            add("assistant", " ".join(t for t in [text.strip(), *(render_call(c["name"], c["arguments"])
                                                                  for c in made)] if t))
            for c in made:
                add("tool", c["response"])
    return messages


def windows(n: int, size: int = WINDOW, overlap: int = OVERLAP) -> list[range]:
    """The official windows over n messages: `size` messages each, every one after the first starting `overlap`
    messages before the previous one's end; n <= size is one window (n = 0: one empty window)."""
    step = size - overlap
    return [range(start, min(start + size, n)) for start in range(0, max(n - overlap, 1), step)]


# -- the prompt and the verdicts ---------------------------------------------------------------------------------

def judge_prompt(rubrics: list[str], messages: list[dict[str, str]], window: range,
                 states: list[bool | None], context: str = "") -> list[dict[str, str]]:
    """The chat messages asking for one window's verdicts (see the module docstring)."""
    n = len(rubrics)
    shown = "\n".join(f"{k}. [{'met' if state else 'not met'}] {rubric}"
                      for k, (rubric, state) in enumerate(zip(rubrics, states, strict=True), 1))
    lines = "\n".join(f"[{i + 1}] {messages[i]['role']}: {messages[i]['content']}" for i in window)
    where = f"messages {window.start + 1}-{window.stop} of {len(messages)}" if len(window) else "no messages"
    parts = [f"## Task\n{context}" if context else "",
             f"## Rubrics (state so far)\n{shown}",
             f"## Conversation ({where})\n{lines or '(empty)'}",
             RULES,
             f"Answer with exactly {n} lines, one per rubric in order, each `<number>: yes` if the rubric is met "
             f"or `<number>: no` if it is not (from `1: ` to `{n}: `), and nothing else."]
    return [{"role": "system", "content": JUDGE_SYSTEM},
            {"role": "user", "content": "\n\n".join(p for p in parts if p)}]


_YES, _NO = {"yes", "true", "met", "pass", "passed"}, {"no", "false", "unmet", "fail", "failed"}
_LINE = re.compile(r"\s*[\[(#*\-]*\s*(?:rubric\s*)?(\d{1,4})(?!\d)\s*[\]).:=*\-]*\s*(.*)", re.IGNORECASE)


def _word(text: str) -> bool | None:
    """The verdict a line's answer starts with: yes / no (and synonyms); anything else is none."""
    words = re.findall(r"[a-z]+", text.lower())[:2]
    if words[:2] == ["not", "met"]:
        return False
    if words and words[0] in _YES:
        return True
    if words and words[0] in _NO:
        return False
    return None


def _from_json(text: str, n: int) -> list[bool | None]:
    """Verdicts from a JSON list in the text: booleans in rubric order, or the official objects."""
    out: list[bool | None] = [None] * n
    start, end = text.find("["), text.rfind("]")
    if start < 0 or end <= start:
        return out
    try:
        value = json.loads(text[start:end + 1])
    except (ValueError, RecursionError):
        return out
    if not isinstance(value, list):
        return out
    if value and all(type(v) is bool for v in value):
        return value[:n] + out[len(value):]
    answers = []
    for item in value:
        if not isinstance(item, dict) or type(item.get("meetExpectation")) is not bool:
            continue
        index = item.get("rubric_idx")
        if isinstance(index, str) and index.strip().isdigit() and len(index.strip()) <= 4:
            index = int(index)
        if type(index) is int:
            answers.append((index - 1, item["meetExpectation"]))
    return _collect(answers, n)


def _collect(answers: list[tuple[int, bool]], n: int) -> list[bool | None]:
    """(rubric index, verdict) answers as one verdict per rubric: out of range ignored, contradictions none."""
    out: list[bool | None] = [None] * n
    contradicted: set[int] = set()
    for index, verdict in answers:
        if not 0 <= index < n or index in contradicted:
            continue
        if out[index] is not None and out[index] != verdict:
            out[index] = None
            contradicted.add(index)
        else:
            out[index] = verdict
    return out


def parse_verdicts(text: Any, n: int) -> list[bool | None]:
    """The judge's verdict per rubric (n of them): True, False, or None when missing, unclear or contradicted.

    Lines `<number>: yes|no` (with `[1]`, `1.`, `Rubric 1 -`, markdown and `met` / `not met` / `true` / `false`
    read as well); otherwise a JSON list of booleans or of `{rubric_idx, meetExpectation}` objects. A number
    answered twice differently, or out of range, gives nothing. Never raises, whatever `text` is.
    """
    if n <= 0:
        return []
    if not isinstance(text, str):
        return [None] * n
    text = strip_thinking(text[:_PARSED_CHARS])
    answers = []
    for line in text.splitlines():
        match = _LINE.match(line)
        verdict = _word(match.group(2)) if match else None
        if verdict is not None:
            answers.append((int(match.group(1)) - 1, verdict))
    return _collect(answers, n) if answers else _from_json(text, n)


# -- judging -----------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Item:
    """One episode to judge: its task's uid, rubrics and context, and its transcript."""

    uid: str
    rubrics: list[str]
    messages: list[dict[str, str]]
    context: str = ""


@dataclass(frozen=True)
class Judgement:
    """Per rubric, the verdict (None: never answered in a parseable way), and the judge's text of every window."""

    verdicts: list[bool | None]
    raw: str


def _fitting(renderer: ChatRenderer, item: Item, window: range, states: list[bool | None],
             max_context: int | None, max_new_tokens: int) -> list[int] | None:
    """The window's prompt ids, with messages cut shorter until it fits the judge's context (None: never)."""
    messages = item.messages
    for chars in (None, *_SHORTER):
        if chars is not None:
            messages = [{**m, "content": _cut(m["content"], chars)} for m in item.messages]
        ids = renderer.messages(judge_prompt(item.rubrics, messages, window, states, item.context))
        if max_context is None or len(ids) + max_new_tokens <= max_context:
            return ids
    return None


def judge(sampler: Sampler, items: list[Item], max_new_tokens: int = 256,
          progress: Callable[[int, int], None] | None = None) -> list[Judgement]:
    """Judge every item, window after window, greedily: round r judges window r of every item in one backend
    call. `progress(done, total)` is told after each round, in windows."""
    renderer = ChatRenderer(sampler.tokenizer)
    max_context = getattr(sampler.backend, "max_context", None)
    plans = [windows(len(item.messages)) if item.rubrics else [] for item in items]
    states: list[list[bool | None]] = [[None] * len(item.rubrics) for item in items]
    raws: list[list[str]] = [[] for _ in items]
    total, done = sum(len(p) for p in plans), 0
    for r in range(max((len(p) for p in plans), default=0)):
        asked, prompts = [], []
        for i, plan in enumerate(plans):
            if r >= len(plan):
                continue
            ids = _fitting(renderer, items[i], plan[r], states[i], max_context, max_new_tokens)
            if ids is None:
                raws[i].append(TOO_LONG)
            else:
                asked.append(i)
                prompts.append(ids)
            done += 1
        gens = sampler(prompts, max_new_tokens, greedy=True, tasks=[items[i].uid for i in asked]) if prompts else []
        for i, gen in zip(asked, gens, strict=True):
            raws[i].append(gen.text)
            for k, verdict in enumerate(parse_verdicts(gen.text, len(items[i].rubrics))):
                if verdict is not None:
                    states[i][k] = verdict
        if progress is not None:
            progress(done, total)
    return [Judgement(state, raw[0] if len(raw) == 1 else "\n\n".join(
        f"[window {k} of {len(raw)}]\n{text}" for k, text in enumerate(raw, 1)))
        for state, raw in zip(states, raws, strict=True)]
