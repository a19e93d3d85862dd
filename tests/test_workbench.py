import json
import time

import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from envace.errors import UsageError
from workbench import Workbench, json_diff

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=20)


@given(json_values)
def test_a_response_has_no_diff_with_itself(value):
    text = json.dumps(value)
    assert json_diff(text, text) == []


@given(st.dictionaries(st.text(min_size=1, max_size=5), json_values, min_size=1, max_size=5), st.data())
def test_a_dropped_key_is_missing_and_an_invented_one_added(real, data):
    key = data.draw(st.sampled_from(sorted(real)))
    rehearsed = {k: v for k, v in real.items() if k != key}
    rehearsed["\u00a7invented"] = 1
    changes = json_diff(json.dumps(real), json.dumps(rehearsed))
    assert {(c.path, c.kind) for c in changes} == {(f"$.{key}", "missing"), ("$.\u00a7invented", "added")}


def test_type_changes_and_numeric_drift():
    changes = json_diff('{"balance": 10.5, "ok": true, "items": [1, 2]}',
                        '{"balance": 12, "ok": "yes", "items": [1]}')
    by_path = {c.path: c for c in changes}
    assert by_path["$.balance"].kind == "value_changed" and by_path["$.balance"].drift == pytest.approx(1.5)
    assert by_path["$.ok"].kind == "type_changed"
    assert by_path["$.items[1]"].kind == "missing"
    assert [c.kind for c in json_diff("not json", "also not json")] == ["value_changed"]


def test_queries_over_a_real_store(store):
    wb = Workbench(store)
    assert {"scripted", "shadow", "trained", "sw"} <= set(wb.runs()["run_id"])
    episodes = wb.episodes("shadow")
    assert len(episodes) == 2 and list(episodes["checklist"]) == sorted(episodes["checklist"], reverse=True)
    first = episodes["episode_id"][0]
    steps = wb.steps("shadow", first)
    assert set(steps["role"]) <= {"caller", "rehearser"} and len(steps) >= 1
    calls = wb.calls("shadow", first)
    assert {"real_response", "rehearsed_response"} <= set(calls.columns)
    assert len(wb.episodes(success=True)) + len(wb.episodes(success=False)) == len(wb.episodes())
    training = wb.training("trained")
    assert {"caller"} <= set(training["role"]) and (training["step"] >= 0).all()
    with pytest.raises(UsageError):
        wb.episodes("../etc")  # run ids are validated: no path tricks
    with pytest.raises(UsageError):
        wb.sql("DROP VIEW episodes")
    assert wb.sql("SELECT count(*) AS n FROM generations")["n"][0] > 0


def test_export_and_figures(store, tmp_path):
    from workbench.figures import budget_curves, fidelity_bars, training_curves

    wb = Workbench(store)
    for suffix in (".parquet", ".csv", ".jsonl"):
        assert wb.export(wb.episodes(), tmp_path / f"e{suffix}").stat().st_size > 0
    with pytest.raises(UsageError):
        wb.export(wb.episodes(), tmp_path / "e.xlsx")
    fig = training_curves(wb.training("trained"))
    assert {t.name for t in fig.data} >= {"caller"}
    # against tokens trained on: each point's x is the run's running sum of its steps' tokens
    long = wb.training("trained")
    tokens = long[(long["name"] == "tokens") & (long["role"] == "all")].sort_values("step")["value"].cumsum()
    fig = training_curves(long, ("loss",), x="tokens")
    assert fig.layout.xaxis.title.text == "tokens trained on"
    assert sorted({x for t in fig.data for x in t.x}) == pytest.approx(sorted(set(tokens)))
    sweep = pd.DataFrame({"label": ["base"] * 3, "mode": ["none", "parallel", "sequential"], "budget": [0, 2, 2],
                          "checklist": [0.1, 0.2, 0.05], "private_tokens_per_episode": [0, 300, 280]})
    names = [t.name for t in budget_curves(sweep).data]
    assert names == ["base · parallel", "base · parallel · tokens", "base · sequential", "base · sequential · tokens"]
    assert len(fidelity_bars(wb.fidelity_by_tool()).data) == 4


def test_filters_sort_and_the_rows_reward_and_advantage(store):
    wb = Workbench(store)
    high, low = wb.episodes("scripted", fidelity="high"), wb.episodes("scripted", fidelity="low")
    assert len(high) == 1 and len(low) == 1 and high["fidelity"][0] > low["fidelity"][0]
    assert wb.episodes("scripted", tool="no_such_tool").empty
    assert len(wb.episodes("scripted", tool=wb.calls("scripted", high["episode_id"][0])["name"][0])) >= 1
    with pytest.raises(UsageError):
        wb.episodes("scripted", fidelity="great")
    assert wb.steps("scripted", high["episode_id"][0])["advantage"].isna().all()  # a rollout has no groups
    assert wb.error_kinds("broken") == ["TOOL_NOT_AVAILABLE"] and wb.error_kinds("scripted") == []
    assert len(wb.episodes("broken", error_kind="TOOL_NOT_AVAILABLE")) == 1
    assert wb.episodes("scripted", error_kind="TOOL_NOT_AVAILABLE").empty
    trained = wb.episodes("trained")
    steps = pd.concat([wb.steps("trained", e) for e in trained["episode_id"]])
    assert steps["advantage"].notna().all()
    # the stored advantages are the trainer's own: centred per (step, task, role) over the trained rows
    rows = wb.sql("SELECT g.step, e.task_uid, g.role, g.advantage FROM generations g JOIN episodes e "
                  "USING (run_id, step, episode_id) WHERE g.run_id = 'trained' AND e.phase = 'grpo' "
                  "AND g.advantage IS NOT NULL")
    # trained: back-propagated by the update (a row with advantage 0 adds nothing and is skipped)
    assert len(rows) == len(steps) and (steps["trained"] == (steps["advantage"] != 0)).all()
    assert rows.groupby(["step", "task_uid", "role"])["advantage"].sum().abs().max() < 1e-9
    over = wb.fidelity_over_training("trained")
    assert set(over["source"]) <= {"eval", "train"}
    assert set(wb.calibration("scripted")["episode_id"]) == set(wb.episodes("scripted")["episode_id"])


def test_corrupt_shards_are_skipped_with_a_warning(store, tmp_path):
    import shutil

    root = tmp_path / "runs"
    shutil.copytree(store / "scripted", root / "scripted")
    good = sorted((root / "scripted" / "generations").glob("*.parquet"))[0]
    half = good.read_bytes()[: good.stat().st_size // 2]
    (root / "scripted" / "generations" / "batch-90000.parquet").write_bytes(half)
    (root / "scripted" / "pairs" / "batch-90001.parquet").write_text("not parquet")
    (root / "broken").mkdir()
    (root / "broken" / "run.json").write_text("{ half")
    wb = Workbench(root)
    assert len(wb.warnings) == 3 and any("batch-90000" in w for w in wb.warnings)
    assert any("broken" in w for w in wb.warnings)
    assert len(wb.episodes("scripted")) == 2 and not wb.calls("scripted", wb.episodes()["episode_id"][0]).empty
    assert list(wb.runs()["run_id"]) == ["scripted"]


def test_an_empty_store_answers_every_query_with_nothing(tmp_path):
    from apps.render import empty_state

    wb = Workbench(tmp_path / "nothing-yet")
    assert wb.runs().empty and wb.episodes().empty and wb.fidelity_by_tool().empty and wb.sweep().empty
    assert wb.warnings == [] and "envace rollout" in empty_state(str(wb.root))


@pytest.mark.heavy
def test_launch_runs_in_the_background_and_stops_cleanly(tmp_path):
    from workbench import launch

    root = tmp_path / "runs"
    handle = launch("experiments/smoke.toml", root=root, name="bg")
    assert handle.status() == "running"  # launch returned before the job finished
    assert handle.wait(300) == "finished", handle.log_tail()
    assert "GRPO step 2/2" in handle.log_tail()
    wb = Workbench(root)
    assert list(wb.runs()["run_id"]) == ["bg"] and not wb.training("bg").empty
    # minutes of work if left alone (a job that can finish between the poll and the signal would read "finished")
    long = launch(kind="rollout", root=root, name="long", args=["--model", "tiny", "--limit", "50", "--group-size",
                                                                "4", "--max-new-tokens", "32"])
    deadline = time.time() + 120
    while not (root / "long" / "run.json").exists() and time.time() < deadline:
        time.sleep(0.2)
    assert long.stop() == "stopped"
    wb.refresh()
    assert wb.runs().set_index("run_id").loc["long", "status"] == "interrupted"
    with pytest.raises(UsageError):
        launch(kind="deploy", root=root)
    with pytest.raises(UsageError):
        launch("experiments/nope.toml", root=root)


def test_lists_are_aligned_by_their_common_items_not_by_index():
    def kinds(real, rehearsed):
        return [(c.path, c.kind, c.at_rehearsed) for c in json_diff(json.dumps(real), json.dumps(rehearsed))]

    assert kinds({"content": ["a", "b", "c"]}, {"content": ["b", "c"]}) == [("$.content[0]", "missing", "$.content[0]")]
    assert kinds(["b", "c"], ["a", "b", "c"]) == [("$[0]", "added", "$[0]")]
    assert kinds([1, 2, 3], [1, 5, 3]) == [("$[1]", "value_changed", "$[1]")]
    # a changed item after a dropped one: found at its own place on each side
    changed = json_diff(json.dumps(["x", {"n": 1}]), json.dumps([{"n": 2}]))
    assert [(c.kind, c.path, c.at_rehearsed) for c in changed] == [("missing", "$[0]", "$[0]"),
                                                                    ("value_changed", "$[1].n", "$[0].n")]
    assert json_diff(json.dumps(["a", "b", "c"]), json.dumps(["c", "b", "a"])) != []  # order still counts


@pytest.mark.parametrize("kind", ["train", "rollout", "eval", "sweep"])
def test_the_launch_form_of_every_shipped_config_resolves_unchanged(kind, tmp_path):
    """The Launch tab's form (every field, the file's value else the default) builds the config it shows:
    a field the job refuses (the trainer's own rollout fields) never reaches the form."""
    from pathlib import Path

    from workbench.launch import _job_config, config_fields, resolve, write_config

    configs = sorted(Path("experiments").glob("*.toml"))
    table = "train" if kind == "train" else "rollout"
    from envace.config import load_toml

    configs = [c for c in configs if table in load_toml(c)]
    assert configs
    for config in configs:
        rows = config_fields(config, kind)
        assert rows and not any(r["field"] == "rollout.batch_size" for r in rows if kind == "train")
        try:
            cfg = resolve(kind, {r["field"]: r["value"] for r in rows})
            written = write_config(kind, cfg, tmp_path / f"{config.stem}.toml")  # what the launched job reads
            cls, table = _job_config(kind)
            assert cls.from_dict(load_toml(written)[table]) == cfg
        except UsageError as exc:  # a GPU recipe's model is not on this machine: the only refusal allowed
            assert "in the local HF cache" in str(exc), (config, exc)


@pytest.mark.heavy
def test_a_screen_names_the_units_whose_rewards_differ(tmp_path):
    """`unit_rewards` per unit, and `experiments/screen_units.py` printing the units with spread as `grpo.units`."""
    import subprocess
    import sys

    from envace.store import Run

    run = Run.create(tmp_path, "rollout", {}, "tiny", "screen")
    scores = {"bfcl/a@t0": [0.0, 0.5, 0.0], "bfcl/a@t1": [0.0, 0.0, 0.0], "bfcl/b@t2": [1.0, 1.0, 1.0],
              "bfcl/c@t1": [0.25, 0.0, 0.25]}
    run.write("episodes", "batch-00000", [
        {"run_id": "screen", "step": 0, "phase": "rollout", "episode_id": f"{uid}/{k}", "task_uid": uid,
         "success": False, "checklist": score} for uid, values in scores.items() for k, score in enumerate(values)])
    run.update(status="completed")
    units = Workbench(tmp_path).unit_rewards("screen").set_index("task_uid")
    assert list(units["episodes"]) == [3, 3, 3, 3] and list(units["hits"]) == [1, 0, 3, 2]
    assert list(units.index[units["spread"]]) == ["bfcl/a@t0", "bfcl/c@t1"]  # all-equal, even all-1, is no signal
    assert units.loc["bfcl/c@t1", "mean"] == pytest.approx(0.5 / 3)
    script = [sys.executable, "experiments/screen_units.py", "--root", str(tmp_path)]
    done = subprocess.run([*script, "screen"], capture_output=True, text=True, check=True)
    assert json.loads(done.stdout) == ["bfcl/a@t0", "bfcl/c@t1"]
    assert "bfcl/a@t0: 1/3 scored" in done.stderr
    missing = subprocess.run([*script, "nope"], capture_output=True, text=True)
    assert missing.returncode == 2 and missing.stderr.strip() == f"error: no run named 'nope' in {tmp_path}"
    flat = Run.create(tmp_path, "rollout", {}, "tiny", "flat")
    flat.write("episodes", "batch-00000", [{"run_id": "flat", "step": 0, "episode_id": str(k), "task_uid": "bfcl/a@t1",
                                            "success": False, "checklist": 0.0} for k in range(4)])
    none = subprocess.run([*script, "flat"], capture_output=True, text=True)
    assert none.returncode == 2 and none.stderr.strip().splitlines()[-1].startswith("error: screen 'flat': none of")


def test_the_episode_timeline_has_a_lane_per_slot_of_each_actor():
    """Episodes that say which actor played them (`episodes.actor`) are packed into that actor's slots in start
    order: an actor's lanes are the episodes it had in flight at once, no two bars of a lane overlap, and a slot
    left empty shows as a gap; older runs (no actor) keep a lane per episode of its step."""
    import pandas as pd

    from workbench.figures import episode_timeline, lanes

    spans = pd.DataFrame({"step": [0, 0, 0, 0, 1, 1], "episode_id": list("abcdef"),
                          "start_s": [0.0, 0.0, 1.0, 2.0, 3.0, 3.5], "end_s": [1.5, 1.0, 2.5, 3.0, 4.0, 5.0],
                          "wait_s": [0.0] * 6, "actor": [0, 0, 0, 1, 0, 1]})
    lane = lanes(spans)
    assert lane.tolist() == ["actor 0 · slot 1", "actor 0 · slot 0", "actor 0 · slot 0", "actor 1 · slot 0",
                             "actor 0 · slot 0", "actor 1 · slot 0"]
    for _, same in spans.assign(lane=lane).groupby("lane"):
        ordered = same.sort_values("start_s")
        assert (ordered["start_s"].iloc[1:].to_numpy() >= ordered["end_s"].iloc[:-1].to_numpy()).all()
    fig = episode_timeline(spans)
    assert list(fig.layout.yaxis.categoryarray) == ["actor 0 · slot 0", "actor 0 · slot 1", "actor 1 · slot 0"]
    assert lanes(spans.assign(actor=None)).tolist() == ["0", "1", "2", "3", "0", "1"]


def test_the_episode_timeline_shows_slot_time_idle_where_the_run_stored_it():
    """The panel beside the lanes: the actors' slot-time idle per step (`actor_slot_idle`) where the run has it,
    else the episodes' own wait share (which cannot see an empty slot), each titled for what it is."""
    import pandas as pd

    from workbench.figures import episode_timeline

    spans = pd.DataFrame({"step": [0, 0, 1], "episode_id": list("abc"), "start_s": [0.0, 0.0, 2.0],
                          "end_s": [1.0, 2.0, 3.0], "wait_s": [0.0, 0.0, 0.0], "actor": [0, 1, 0]})
    fig = episode_timeline(spans, pd.Series([0.25, 0.5], index=[0, 1]))
    panel = [t for t in fig.data if t.name == "idle share"][0]
    assert list(panel.y) == [0.25, 0.5] and "slot-time idle" in fig.layout.annotations[1].text
    fig = episode_timeline(spans)
    panel = [t for t in fig.data if t.name == "idle share"][0]
    assert list(panel.y) == [0.0, 0.0] and "wait share" in fig.layout.annotations[1].text
