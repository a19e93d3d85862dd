"""HTML for the Inspector: an episode turn by turn, each call's real and rehearsed responses side by side
with the structural diff marked in place. Pure functions of `Workbench` query rows, so they are tested
without a server."""

from __future__ import annotations

import json
from html import escape
from typing import Any

import pandas as pd

from workbench.diff import json_diff

KIND_COLOURS = {"missing": "#fde2e1", "added": "#dff3e4", "type_changed": "#fff1c2", "value_changed": "#e3ecfb"}
KIND_LABELS = {"missing": "missing from the rehearsal", "added": "invented by the rehearser",
               "type_changed": "another JSON type", "value_changed": "another value"}
# Stored enum values as a reader says them.
AGREEMENT_LABELS = {"both_ok": "both succeeded", "both_error": "both failed", "false_error": "rehearsal invented a "
                    "failure", "missed_error": "rehearsal missed a failure", "no_rehearsal": "no usable rehearsal"}
ERROR_LABELS = {"json_decode_error": "the call's JSON does not parse", "unbalanced_tags": "unbalanced <tool_call> "
                "tags", "not_a_call": "a <tool_call> block with no call", "missing_name": "a call without a name",
                "bad_arguments": "arguments that are not an object", "missing_result": "no <execution_result>",
                "unclosed_result": "an unclosed <execution_result> (cut off?)", "several_results": "several results",
                "invalid_json": "a result that is not JSON", "empty_result": "an empty result",
                "too_long": "a result over 20,000 characters"}
SOURCE_LABELS = {"real": "the real environment", "rehearsed": "the rehearser", "gold": "the gold prefix (replayed)"}
_SIDE = "flex:1;min-width:0"  # two equal columns however long a response is
_WRAP = "white-space:pre-wrap;overflow-wrap:anywhere"
ROLE_COLOURS = {"caller": "#e8f0fe", "rehearser": "#fef3e2", "summariser": "#eef7ee"}


LONG_CHARS = 1200  # a message longer than this is folded to its first line (click to read it whole)


def message_html(text: str) -> str:
    """A message word for word, wrapped; a long one folded under its first line and its length, so a turn's
    calls and responses stay in view."""
    body = f'<pre style="{_WRAP}">{escape(text)}</pre>'
    if len(text) <= LONG_CHARS:
        return body
    first = escape(text.strip().splitlines()[0][:160]) if text.strip() else ""
    return f'<details class="long"><summary>{first} … ({len(text):,} characters)</summary>{body}</details>'


def _mark(inner: str, kind: str | None) -> str:
    if kind is None:
        return inner
    return f'<mark class="diff-{kind}" title="{kind}" style="background:{KIND_COLOURS[kind]}">{inner}</mark>'


def _json_html(value: Any, path: str, marks: dict[str, str], indent: int = 0) -> str:
    """Pretty-printed JSON with every node whose path is in `marks` highlighted by its change kind."""
    pad, inner_pad = "  " * indent, "  " * (indent + 1)
    if isinstance(value, dict) and value:
        items = [f'{inner_pad}{_mark(escape(json.dumps(k)), marks.get(f"{path}.{k}"))}: '
                 f'{_json_html(v, f"{path}.{k}", marks, indent + 1)}' for k, v in value.items()]
        body = "{\n" + ",\n".join(items) + f"\n{pad}}}"
    elif isinstance(value, list) and value:
        items = [f"{inner_pad}{_json_html(v, f'{path}[{i}]', marks, indent + 1)}" for i, v in enumerate(value)]
        body = "[\n" + ",\n".join(items) + f"\n{pad}]"
    else:
        body = escape(json.dumps(value, ensure_ascii=False))
    # a key-level mark already covers a missing/added key; mark the value for type and value changes
    kind = marks.get(path)
    return _mark(body, kind) if kind in ("type_changed", "value_changed") else body


def response_html(text: str | None, marks: dict[str, str]) -> str:
    if text is None:
        return '<em class="absent">none</em>'
    try:
        value = json.loads(text)
    except ValueError:
        return _mark(escape(text), marks.get("$"))
    return _json_html(value, "$", marks)


def _missing(value: Any) -> bool:
    """None, or a NaN: pandas turns a missing value into NaN when a column mixes rows with and without it."""
    return value is None or (isinstance(value, float) and pd.isna(value))


def _text(value: Any) -> str:
    return "" if _missing(value) else str(value)


def _score(value: Any) -> str:
    return "–" if _missing(value) else f"{float(value):.2f}"


def _label(labels: dict[str, str], value: Any) -> str:
    text = _text(value)
    return labels.get(text, text)


def _json_cell(value: Any, present: bool) -> str:
    """A side of the diff table: the value as JSON (`null` is a JSON null), or an absent key, said so."""
    if not present:
        return '<em class="absent">absent</em>'
    return escape(json.dumps(value, ensure_ascii=False)[:120])


def legend_html() -> str:
    """What the marks in the responses mean."""
    items = "".join(f'<span class="legend legend-{kind}" style="background:{colour};margin-right:10px;padding:0 3px">'
                    f"{escape(KIND_LABELS[kind])}</span>" for kind, colour in KIND_COLOURS.items())
    return f'<div class="diff-legend">marks: {items}</div>'


def _no_diff(error: Any) -> str:
    return f"malformed rehearsal: {escape(_label(ERROR_LABELS, error))}" if _text(error) else "no structural difference"


def pair_html(call: dict[str, Any]) -> str:
    """One call: name and arguments, then real | rehearsed side by side, the diff, and the scores."""
    header = (f'<div class="call-head"><code>{escape(str(call["name"]))}({escape(str(call["arguments"]))})</code>'
              f' <span class="fed">the caller saw the answer of {escape(_label(SOURCE_LABELS, call["source"]))}'
              "</span></div>")
    real, rehearsed = (None if _missing(call.get(k)) else call.get(k) for k in ("real_response", "rehearsed_response"))
    if real is None and rehearsed is None:  # one-sided call (a run, or a turn, not shadowed): the response it saw
        return (f'<div class="call">{header}<pre class="response {escape(str(call["source"]))}">'
                f'{response_html(call["response"], {})}</pre></div>')
    changes = json_diff(real, rehearsed) if real is not None and rehearsed is not None else []
    real_marks = {c.path: c.kind for c in changes if c.kind != "added"}
    rehearsed_marks = {c.at_rehearsed: c.kind for c in changes if c.kind != "missing"}
    error = call.get("rehearsal_error")
    rows = "".join(f'<tr style="background:{KIND_COLOURS[c.kind]}"><td><code>{escape(c.path)}</code></td>'
                   f"<td>{escape(KIND_LABELS[c.kind])}</td><td>{_json_cell(c.real, c.kind != 'added')}</td>"
                   f"<td>{_json_cell(c.rehearsed, c.kind != 'missing')}</td>"
                   f"<td>{'' if c.drift is None else f'{c.drift:+g}'}</td></tr>" for c in changes)
    diff = (f'<table class="diff"><tr><th>path</th><th>change</th><th>real</th><th>rehearsed</th><th>drift</th></tr>'
            f"{rows}</table>" if changes else
            f'<div class="diff-none">{_no_diff(error)}</div>')
    changed = call.get("decision_changed")
    scores = (f'<div class="scores">exact {_score(call.get("exact"))} · structure F1 {_score(call.get("structure_f1"))}'
              f' · value acc {_score(call.get("value_acc"))} · '
              f'{escape(_label(AGREEMENT_LABELS, call.get("error_agreement")))}'
              f' · embedding cos {_score(call.get("embed_cos"))}'
              f' · decision changed: {"–" if changed is None or pd.isna(changed) else ("yes" if changed else "no")}'
              "</div>")
    sides = (f'<div class="sides" style="display:flex;gap:8px"><div style="{_SIDE}"><b>real</b>'
             f'<pre class="response real" style="{_WRAP}">{response_html(real, real_marks)}</pre></div>'
             f'<div style="{_SIDE}"><b>rehearsed</b><pre class="response rehearsed" style="{_WRAP}">'
             f"{response_html(rehearsed, rehearsed_marks)}</pre></div></div>")
    return f'<div class="call">{header}{sides}{diff}{scores}</div>'


def _reward(row: dict[str, Any]) -> str:
    advantage = row.get("advantage")
    shown = f"reward {_score(row.get('reward'))}"
    return shown if advantage is None or pd.isna(advantage) else f"{shown} · advantage {float(advantage):+.3f}"


def private_html(turn: dict[str, pd.DataFrame]) -> str:
    """One privately rehearsed turn (`Workbench.rehearsed_turn`): the memory the committed turn saw (or why there
    was none), then each imagined attempt's transcript, folded."""
    memory = turn["memory"].to_dict("records")[0] if len(turn["memory"]) else {}
    kind, error = _text(memory.get("memory_kind")) or "memory", _text(memory.get("memory_error"))
    written = (f'<span class="error">no memory: {escape(error)}</span>' if error else
               f'<pre style="{_WRAP}">{escape(_text(memory.get("memory"))) or "(empty)"}</pre>')
    attempts = "".join(
        f'<details class="imagined"><summary>attempt {a["attempt"] + 1} · {a["n_calls"]} call(s) · '
        f'{escape(_text(a["termination"]))}</summary><pre style="{_WRAP}">{escape(_text(a["transcript"]))}</pre>'
        "</details>" for a in turn["imagined"].to_dict("records"))
    n = len(turn["imagined"])
    return (f'<details class="private" open><summary>private rehearsal before this turn: {n} imagined attempt'
            f'{"s" * (n != 1)} ({escape(_text(memory.get("mode")))}), then its {escape(kind)}</summary>'
            f'<div><b>{escape(kind)}</b> (added to the user message the policy then answered for real){written}</div>'
            f"{attempts}</details>")


def episode_html(steps: pd.DataFrame, calls: pd.DataFrame, roles: tuple[str, ...] = ("caller", "rehearser"),
                 episode_id: str = "", private: dict[int, dict[str, pd.DataFrame]] | None = None) -> str:
    """The episode aligned turn by turn: user message, what private rehearsal imagined and wrote down before the
    turn (`private`: turn → `Workbench.rehearsed_turn`), each caller message with its calls, each call's pair; the
    rehearser row that answered a call is shown under it with its reward, advantage and raw text (open when the
    rehearsal was malformed)."""
    opening = f'<div class="episode" data-episode="{escape(episode_id)}">'
    if steps.empty:
        return opening + "This episode has no stored generations.</div>"
    rehearser_rows = {(r["turn"], r["turn_step"], r["call_index"]): r for r in steps.to_dict("records")
                      if r["role"] == "rehearser"}
    calls_at: dict[tuple[int, int], list[dict[str, Any]]] = {}
    gold = []
    for call in calls.to_dict("records"):
        if call["source"] == "gold":
            gold.append(call)
        else:
            calls_at.setdefault((call["turn"], call["turn_step"]), []).append(call)
    parts: list[str] = [legend_html()]
    if gold:  # a turn episode: what was replayed before the turn the policy played
        turns = sorted({c["turn"] for c in gold})
        listing = "".join(f"<li>turn {c['turn'] + 1}: <code>{escape(str(c['name']))}({escape(str(c['arguments']))})"
                          f"</code> → {escape(_text(c['response'])[:120])}</li>" for c in gold)
        parts.append(f'<details class="gold-prefix"><summary>gold prefix: turns 1–{turns[-1] + 1} replayed from the '
                     f"reference ({len(gold)} calls), not generated</summary><ul>{listing}</ul></details>")
    for row in steps.to_dict("records"):
        if row["role"] != "caller":
            continue
        if row["turn_step"] == 0:
            parts.append(f'<h4>Turn {row["turn"] + 1}</h4><div class="user"><b>user</b> '
                         f'{message_html(_text(row["user_message"]))}</div>')
            if private and row["turn"] in private:
                parts.append(private_html(private[row["turn"]]))
        if "caller" in roles:
            error = (f' <span class="error">malformed: {escape(_label(ERROR_LABELS, row["parse_error"]))}</span>'
                     if _text(row["parse_error"]) else "")
            parts.append(f'<div class="caller" style="background:{ROLE_COLOURS["caller"]}"><b>caller</b> · step '
                         f'{row["turn_step"]} · {row["tokens"]} tokens · {_reward(row)}{error}'
                         f'{message_html(_text(row["completion_text"]))}</div>')
        for call in calls_at.get((row["turn"], row["turn_step"]), []):
            parts.append(pair_html(call))
            rehearsal = rehearser_rows.get((call["turn"], call["turn_step"], call["call_index"]))
            if rehearsal is not None and "rehearser" in roles:
                # what the rehearser wrote, word for word: a malformed rehearsal has no parsed response above
                malformed = _text(call.get("rehearsal_error"))
                parts.append(f'<div class="rehearser" style="background:{ROLE_COLOURS["rehearser"]}"><b>rehearser</b>'
                             f' · {rehearsal["tokens"]} tokens · {_reward(rehearsal)}'
                             f'<details class="rehearser-text"{" open" if malformed else ""}><summary>what it wrote'
                             f'</summary><pre style="{_WRAP}">{escape(_text(rehearsal["completion_text"]))}</pre>'
                             "</details></div>")
    return opening + "\n".join(parts) + "</div>"


def _shade(value: float, scale: float) -> str:
    """Red for negative, green for positive, white at 0; `scale` is the magnitude of full colour."""
    x = max(-1.0, min(1.0, value / scale)) if scale else 0.0
    r, g, b = (255, int(255 * (1 + x)), int(255 * (1 + x))) if x < 0 else (int(255 * (1 - x)), 255, int(255 * (1 - x)))
    return f"rgb({r},{g},{b})"


def tokens_html(steps: pd.DataFrame, tokenizer=None, colour: str = "logprob") -> str:
    """Every generation token by token, each in its role's frame: coloured by its stored log-probability (white =
    certain, red = unlikely) or by the advantage its row was trained with (green = reinforced, red = pushed
    down). Hover a token for its value. Without a tokenizer the generations are shown whole."""
    parts = []
    for row in steps.to_dict("records"):
        role = str(row["role"])
        logprobs = row.get("logprobs")
        logprobs = [] if logprobs is None or (isinstance(logprobs, float) and pd.isna(logprobs)) else list(logprobs)
        advantage = row.get("advantage")
        head = (f'<div class="gen-head"><b>{escape(role)}</b> · turn {row["turn"] + 1} step {row["turn_step"]}'
                f' · {_reward(row)}</div>')
        ids = row.get("completion_ids")
        if tokenizer is None or ids is None or len(ids) == 0:
            body = escape(_text(row["completion_text"]))
        else:
            spans = []
            for k, token in enumerate(ids):
                text = tokenizer.decode([int(token)])
                lp = float(logprobs[k]) if k < len(logprobs) else None
                if colour == "advantage":
                    shade = None if _missing(advantage) else _shade(float(advantage), 1.0)
                else:
                    shade = None if lp is None else _shade(lp, 5.0)
                tip = f"{token}: logprob {'–' if lp is None else f'{lp:.2f}'}"
                style = f' style="background:{shade}"' if shade else ""
                spans.append(f'<span class="tok" title="{escape(tip)}"{style}>{escape(text)}</span>')
            body = "".join(spans)
        parts.append(f'<div class="gen {escape(role)}" style="border-left:4px solid '
                     f'{ROLE_COLOURS.get(role, "#ccc")};padding-left:6px;margin:4px 0">{head}'
                     f'<pre style="white-space:pre-wrap;margin:0">{body}</pre></div>')
    return '<div class="tokens">' + "".join(parts) + "</div>"


def empty_state(root: str) -> str:
    return (f"### No runs under `{root}` yet\n"
            f"Fill the store with `envace rollout --env bfcl --limit 3 --mode real+shadow --root {root}` "
            f"(or `make demo`), or start a job in the **Launch** tab; this page picks it up as it writes.")


def warnings_md(warnings: list[str]) -> str:
    if not warnings:
        return ""
    shown = "\n".join(f"- {escape(w)}" for w in warnings[:20])
    more = f"\n- … and {len(warnings) - 20} more" if len(warnings) > 20 else ""
    return f"⚠️ **{len(warnings)} file(s) skipped**\n{shown}{more}"
