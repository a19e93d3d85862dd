"""The pipeline model (`envace.bench.pipeline`, `envace bench pipeline`): its schedules on hand-built steps, and
the command on the committed fixture store."""

from __future__ import annotations

from pathlib import Path

import pytest

from envace.bench.pipeline import Costs, Schedule, simulate
from envace.errors import UsageError

FIXTURE = Path(__file__).with_name("fixtures") / "golden" / "store"
COSTS = Costs(decode_s=0.01, batch_s=0.002, prefill_s=0.0001, tool_s=0.05, update_s_per_token=0.001, update_s=0.2,
              publish_s=0.1)


def steps(*episodes, n: int = 1, group: int = 1):
    """`n` identical steps whose episodes (lists of requests) are grouped `group` to a group."""
    eps = [tuple(e) for e in episodes]
    return [[eps[i:i + group] for i in range(0, len(eps), group)] for _ in range(n)]


def test_sync_step_of_one_episode_is_generation_plus_update_plus_publish():
    episode = [(100, 20), (30, 5)]
    r = simulate(steps(episode), COSTS, Schedule())
    generation = sum(p * COSTS.prefill_s + n * COSTS.decode_s + COSTS.tool_s for p, n in episode)
    update = COSTS.update_s + 25 * COSTS.update_s_per_token
    assert r.step_s == [pytest.approx(generation + update + COSTS.publish_s)]


def test_per_episode_never_slower_than_lock_step_and_faster_when_lengths_differ():
    same = steps([(10, 8)] * 3, [(10, 8)] * 3, [(10, 8)] * 3, n=2)
    differ = steps([(10, 40)], [(10, 4)] * 6, [(10, 8), (10, 30), (10, 2)], n=2)
    for work in (same, differ):
        lock = simulate(work, COSTS, Schedule()).mean_s
        free = simulate(work, COSTS, Schedule(per_episode=True)).mean_s
        assert free <= lock + 1e-9
    lock, free = (simulate(differ, COSTS, Schedule(per_episode=p)) for p in (False, True))
    assert free.mean_s < lock.mean_s and free.idle_share < lock.idle_share


def test_staleness_one_overlaps_generation_and_update():
    costs = Costs(decode_s=0.01, update_s=1.5, publish_s=0.0)
    work = steps([(0, 100)], n=10)  # generation 1.0 s, update 1.5 s
    sync = simulate(work, costs, Schedule())
    ahead = simulate(work, costs, Schedule(staleness=1))
    assert sync.steady_s(1) == pytest.approx(2.5)
    assert ahead.steady_s(2) == pytest.approx(max(1.0, 1.5))
    gen_bound = simulate(work, Costs(decode_s=0.03, update_s=1.0), Schedule(staleness=1))
    assert gen_bound.steady_s(2) == pytest.approx(3.0)


def test_a_slow_actor_is_given_fewer_chunks_by_the_scheduler():
    work = steps(*([[(0, 10)]] * 16), n=3, group=1)
    r = simulate(work, COSTS, Schedule(actors=2, slots=2, per_episode=True, speeds=(1.0, 4.0)))
    taken = [sum(1 for _, actor, *_ in r.log if actor == i) for i in (0, 1)]
    assert taken[0] > 2 * taken[1] >= 2 and sum(taken) == 3 * 8  # 8 chunks of 2 groups a step, each once


@pytest.mark.parametrize("bad", [dict(decode_s=-1.0), dict(publish_s=float("nan"))])
def test_a_negative_or_non_finite_cost_is_a_usage_error(bad):
    with pytest.raises(UsageError, match="must be a finite number >= 0"):
        Costs(**bad)


def _cli(capsys, *argv: str) -> tuple[int, str, str]:
    from envace.cli import main

    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_bench_pipeline_on_the_fixture_store_prints_the_validation_row(capsys):
    code, out, _ = _cli(capsys, "bench", "pipeline", "cut", "--root", str(FIXTURE))
    assert code == 0
    row = next(line for line in out.splitlines() if line.startswith("│ cut"))
    assert "%" in row and "measured s/step" in out


def test_bad_input_is_one_line_and_exit_2(capsys, tmp_path):
    import shutil

    code, out, err = _cli(capsys, "bench", "pipeline", "cut", "--root", str(FIXTURE), "--publish-s", "-1")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "--publish-s" in err
    store = tmp_path / "store"
    shutil.copytree(FIXTURE / "cut", store / "cut", ignore=shutil.ignore_patterns("metrics"))
    code, out, err = _cli(capsys, "bench", "pipeline", "cut", "--root", str(store))
    assert code == 2 and len(err.strip().splitlines()) == 1 and "no GRPO steps" in err


def test_the_model_the_ray_driver_and_the_single_process_loop_hand_out_work_with_one_scheduler():
    """One scheduler (`envace.training.scheduler`): the pipeline model, the Ray driver and the single-process
    overlapped loop all build it, and no other module decides what an actor plays."""
    import ast
    import inspect

    import envace.bench.pipeline as model
    import envace.training.cluster.driver as driver
    import envace.training.staleness as local
    from envace.training import scheduler

    for module in (model, driver, local):
        assert module.Scheduler is scheduler.Scheduler, module.__name__
        calls = {n.func.id for n in ast.walk(ast.parse(inspect.getsource(module)))
                 if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
        assert "Scheduler" in calls, module.__name__  # each builds one
    assert "def assign" not in inspect.getsource(driver) + inspect.getsource(local)
    assert "self.sched.assign(" in inspect.getsource(model._Sim)


def test_a_step_that_trains_no_row_costs_no_update():
    """The learner skips a step whose every advantage is 0 ("no update"), and a stored run's update cost is per
    token trained: the model charges the update only for what a step trains."""
    work = steps(((4, 8),), n=2)  # two steps of one episode, one request of 8 tokens
    costs = Costs(decode_s=0.01, update_s=5.0, update_s_per_token=0.1)
    every = simulate(work, costs, Schedule())  # the projection's default: every generated token trained
    none_first = simulate(work, costs, Schedule(), trained=[0, 8])
    assert every.mean_s - none_first.mean_s == pytest.approx((5.0 + 0.1 * 8) / 2)
