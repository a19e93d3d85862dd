"""Every view on a store written by the real default model: what users open, not what scripts write.

The scripted stores (`store` fixture) make precise assertions; this one only asks that nothing breaks on
real output (malformed rehearsals, episodes without a single call, long prompts, a simulated user).
"""

import subprocess
import sys

import pytest

pytestmark = pytest.mark.heavy

RUNS = ("demo", "train", "sw", "sw-base-none-0", "sw-base-parallel-1", "world-model", "tau2")


def test_the_store_has_every_kind_of_run(real_store):
    from workbench import Workbench

    wb = Workbench(real_store)
    assert set(RUNS) <= set(wb.runs()["run_id"]) and wb.warnings == []
    assert set(wb.runs().set_index("run_id").loc[list(RUNS), "kind"]) == {"rollout", "train", "sweep", "eval",
                                                                          "world-model"}
    assert len(wb.world_model("world-model")) == 2  # its one gold call's tool, and the `all` row
    phases = set(wb.sql("SELECT DISTINCT phase FROM episodes WHERE run_id = 'train'")["phase"])
    assert phases == {"grpo", "eval"}


def test_every_episode_of_every_run_renders(real_store):
    from html import escape

    from apps.render import LONG_CHARS, episode_html, message_html, tokens_html
    from workbench import Workbench

    wb = Workbench(real_store)
    opened = 0
    for run in wb.runs()["run_id"]:
        for episode in wb.episodes(run)["episode_id"]:
            steps, calls = wb.steps(run, episode), wb.calls(run, episode)
            html = episode_html(steps, calls) + tokens_html(steps)
            assert "nan" not in html.replace("nano", "")  # a missing value is never shown as NaN
            for text in steps.loc[steps["role"] == "caller", "completion_text"]:  # every caller message, whole;
                assert escape(text) in html  # a long one folded under its first line
                assert (f"({len(text):,} characters)</summary>" in html) == (len(text) > LONG_CHARS)
            opened += 1
    assert opened >= 8
    long = "first line of a long message\n" + "x <y> " * LONG_CHARS  # as a rambling caller writes
    assert message_html(long).startswith('<details class="long"><summary>first line of a long message …')
    assert escape(long) in message_html(long) and "<details" not in message_html(long[:LONG_CHARS])


def test_a_privately_rehearsed_episode_shows_its_memory_and_imagined_attempts_in_its_turn(real_store):
    from html import escape

    from apps.render import episode_html
    from workbench import Workbench

    wb = Workbench(real_store)
    shown = 0
    for run in sorted(wb.runs_with("memories")):
        turns = wb.rehearsed_turns(run)
        for episode, rows in turns.groupby("episode_id"):
            private = wb.private_turns(run, episode)
            assert sorted(private) == sorted(int(t) for t in rows["turn"])
            html = episode_html(wb.steps(run, episode), wb.calls(run, episode), episode_id=episode, private=private)
            assert html.count('<details class="private"') == len(private)
            for turn in private.values():
                assert html.count('<details class="imagined">') >= len(turn["imagined"]) > 0
                for transcript in turn["imagined"]["transcript"]:
                    assert escape(transcript) in html  # every imagined attempt, word for word
                memory = turn["memory"].iloc[0]
                assert (f"no memory: {escape(memory['memory_error'])}" if memory["memory_error"] else
                        escape(memory["memory"]) or "(empty)") in html
            shown += 1
    assert shown  # the sweep's N = 1 cell: its episode rehearsed each turn


@pytest.mark.parametrize("run", RUNS)
def test_show_and_fidelity_work_on_every_kind_of_run(real_store, run):
    for command in ("show", "fidelity"):
        done = subprocess.run([sys.executable, "-m", "envace.cli", command, run, "--root", str(real_store)],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
        assert run in done.stdout


def test_every_dashboard_draws(real_store):
    from workbench import Workbench, figures

    wb = Workbench(real_store)
    for run in (None, *RUNS):
        figures.fidelity_bars(wb.fidelity_by_tool(run))
        figures.calibration(wb.calibration(run))
    figures.fidelity_over_training(wb.fidelity_over_training("train"))
    figures.training_curves(wb.training("train"))
    figures.budget_curves(wb.sweep("sw"))
    assert not wb.training("train").empty and not wb.sweep("sw").empty
