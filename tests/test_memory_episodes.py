"""GRPO's memory episodes (`grpo.memory_episodes`, `envace/training/memory_episodes.py`): the last k episodes of
each group privately rehearse before their committed turns, whose trained caller rows then read the memory."""

from __future__ import annotations

import pytest

from envace.cli import main
from envace.store import connect

BLOCK = "<rehearsal_memory>"


@pytest.mark.parametrize("loop", ["lockstep", "per_episode"])
def test_the_last_episode_of_each_group_reads_a_memory_in_the_rows_grpo_trains(tmp_path, scripted_updates, tiny, loop):
    """smoke.toml's GRPO (2 steps, 2 tasks a step) in groups of 3, the scripted policy playing every role (its
    summary says what it saw: "1 attempt(s)"), in lock-step and with each episode on its own thread: every turn of
    each group's episode #2, and only of those, is privately rehearsed once and opens with the memory; the caller
    rows the update gets carry the block exactly where the store says a memory episode's caller spoke."""
    tok = tiny[1]
    root = tmp_path / "runs"
    assert main(["train", "experiments/smoke.toml", "--root", str(root), "--run-name", "m", "--set", "sft.tasks=0",
                 "--set", "rollout.group_size=3", "--set", "grpo.memory_episodes=1",
                 "--set", f'rollout.episode_loop="{loop}"']) == 0
    con = connect(root)
    episodes = con.execute("SELECT episode_id, n_turns FROM episodes WHERE phase = 'grpo'").fetchall()
    assert {e[-1] for e, _ in episodes} == {"0", "1", "2"}
    memories = con.execute("SELECT episode_id, count(*), min(memory), max(memory), max(budget) FROM memories "
                           "GROUP BY episode_id").fetchall()
    # one memory per turn the episode opened: its turns played, and the one the step limit cut, if any
    opened = {e: n for e, n, *_ in memories}
    assert set(opened) == {e for e, _ in episodes if e.endswith("#2")}
    assert all(turns <= opened[e] <= turns + 1 for e, turns in episodes if e in opened), (opened, episodes)
    assert {(low, high, budget) for _, _, low, high, budget in memories} == {("1 attempt(s)", "1 attempt(s)", 1)}
    assert con.execute("SELECT count(*) FROM imagined").fetchall()[0][0] >= len(memories)  # the attempts, stored
    for step, used in enumerate(scripted_updates):
        callers = [r for r, _ in used if r.role == "caller"]
        reading = sum(BLOCK in tok.decode(r.prompt_ids, skip_special_tokens=False) for r in callers)
        spoke = con.execute("SELECT count(*) FILTER (WHERE episode_id LIKE '%#2'), count(*) FROM generations "
                            "WHERE step = ? AND role = 'caller' AND advantage IS NOT NULL", [step]).fetchall()[0]
        assert (reading, len(callers)) == spoke and reading > 0, (step, reading, len(callers), spoke)
    assert any(r.role == "rehearser" for used in scripted_updates for r, _ in used)  # the rehearser trains as before


@pytest.mark.parametrize("settings, message", [
    (["grpo.memory_episodes=4"], "at most a group's 2 episodes"),
    (["grpo.memory_episodes=-1"], "memory_episodes"),
    (["rollout.category=\"memory_kv\"", "grpo.variant=\"real_env\"", "grpo.memory_episodes=1"],
     "grpo.memory_episodes: mode: bfcl memory_kv opens each task on what the policy wrote"),
])
def test_bad_memory_episodes_are_one_line_before_a_run_folder(tmp_path, capsys, settings, message):
    root = tmp_path / "runs"
    sets = [arg for s in settings for arg in ("--set", s)]
    assert main(["train", "experiments/smoke.toml", "--root", str(root), "--run-name", "bad", *sets]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert not (root / "bad").exists()
