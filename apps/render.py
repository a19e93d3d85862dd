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
_SIDE = "flex:1;min-width:0"  # two equal columns however long a response is
_WRAP = "white-space:pre-wrap;overflow-wrap:anywhere"
ROLE_COLOURS = {"caller": "#e8f0fe", "rehearser": "#fef3e2", "summariser": "#eef7ee"}


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


def pair_html(call: dict[str, Any]) -> str:
    """One call: name and arguments, then real | rehearsed side by side, the diff, and the scores."""
    header = (f'<div class="call-head"><code>{escape(str(call["name"]))}({escape(str(call["arguments"]))})</code>'
              f' <span class="fed">caller saw: {escape(str(call["source"]))}</span></div>')
    real, rehearsed = call.get("real_response"), call.get("rehearsed_response")
    if real is None and rehearsed is None:  # one-sided run: only the response the caller saw
        return (f'<div class="call">{header}<pre class="response {escape(str(call["source"]))}">'
                f'{response_html(call["response"], {})}</pre></div>')
    changes = json_diff(real, rehearsed) if real is not None and rehearsed is not None else []
    real_marks = {c.path: c.kind for c in changes if c.kind != "added"}
    rehearsed_marks = {c.path: c.kind for c in changes if c.kind != "missing"}
    error = call.get("rehearsal_error")
    rows = "".join(f'<tr style="background:{KIND_COLOURS[c.kind]}"><td><code>{escape(c.path)}</code></td>'
                   f"<td>{c.kind}</td><td>{escape(json.dumps(c.real, ensure_ascii=False)[:120])}</td>"
                   f"<td>{escape(json.dumps(c.rehearsed, ensure_ascii=False)[:120])}</td>"
                   f"<td>{'' if c.drift is None else f'{c.drift:+g}'}</td></tr>" for c in changes)
    diff = (f'<table class="diff"><tr><th>path</th><th>change</th><th>real</th><th>rehearsed</th><th>drift</th></tr>'
            f"{rows}</table>" if changes else
            f'<div class="diff-none">{"malformed rehearsal: " + escape(error) if error else "no structural difference"}'
            "</div>")
    changed = call.get("decision_changed")
    scores = (f'<div class="scores">exact {_score(call.get("exact"))} · structure F1 {_score(call.get("structure_f1"))}'
              f' · value acc {_score(call.get("value_acc"))} · errors {escape(str(call.get("error_agreement")))}'
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


def episode_html(steps: pd.DataFrame, calls: pd.DataFrame, roles: tuple[str, ...] = ("caller", "rehearser"),
                 episode_id: str = "") -> str:
    """The episode aligned turn by turn: user message, each caller message with its calls, each call's
    pair; the rehearser row that answered a call is shown under it with its reward and advantage."""
    opening = f'<div class="episode" data-episode="{escape(episode_id)}">'
    if steps.empty:
        return opening + "This episode has no stored generations.</div>"
    rehearser_rows = {(r["turn"], r["turn_step"], r["call_index"]): r for r in steps.to_dict("records")
                      if r["role"] == "rehearser"}
    calls_at: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for call in calls.to_dict("records"):
        calls_at.setdefault((call["turn"], call["turn_step"]), []).append(call)
    parts: list[str] = []
    for row in steps.to_dict("records"):
        if row["role"] != "caller":
            continue
        if row["turn_step"] == 0:
            parts.append(f'<h4>Turn {row["turn"] + 1}</h4><div class="user"><b>user</b> '
                         f'{escape(_text(row["user_message"]))}</div>')
        if "caller" in roles:
            error = (f' <span class="error">parse error: {escape(_text(row["parse_error"]))}</span>'
                     if _text(row["parse_error"]) else "")
            parts.append(f'<div class="caller" style="background:{ROLE_COLOURS["caller"]}"><b>caller</b> · step '
                         f'{row["turn_step"]} · {row["tokens"]} tokens · {_reward(row)}{error}'
                         f'<pre>{escape(_text(row["completion_text"]))}</pre></div>')
        for call in calls_at.get((row["turn"], row["turn_step"]), []):
            parts.append(pair_html(call))
            rehearsal = rehearser_rows.get((call["turn"], call["turn_step"], call["call_index"]))
            if rehearsal is not None and "rehearser" in roles:
                parts.append(f'<div class="rehearser" style="background:{ROLE_COLOURS["rehearser"]}"><b>rehearser</b>'
                             f' · {rehearsal["tokens"]} tokens · {_reward(rehearsal)}</div>')
    return opening + "\n".join(parts) + "</div>"


def tokens_html(steps: pd.DataFrame) -> str:
    """Every generation coloured by role; the mean log-probability of its tokens when stored."""
    parts = []
    for row in steps.to_dict("records"):
        logprobs = row.get("logprobs")
        mean = (f" · mean logprob {sum(logprobs) / len(logprobs):.2f}"
                if logprobs is not None and len(logprobs) else "")
        parts.append(f'<span class="gen {row["role"]}" style="background:{ROLE_COLOURS.get(row["role"], "#eee")}" '
                     f'title="{row["role"]} · turn {row["turn"]} step {row["turn_step"]}{mean}">'
                     f'{escape(str(row["completion_text"]))}</span>')
    return '<pre class="tokens" style="white-space:pre-wrap">' + "".join(parts) + "</pre>"


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
