"""What an outside author ran into, each fixed: one error rule for real and rehearsed results, a deep `envace envs
SPEC`, check-env's workers and names, a migration note for old configs, and VitaBench answering as upstream."""

from __future__ import annotations

import json
import textwrap

import pytest

from envace.cli import main
from envace.config import RehearserOptions, RolloutConfig
from envace.engine.rehearser import as_result
from envace.envs import registry
from envace.envs.check import check_category, problems
from envace.errors import UsageError
from envace.formats import parse_execution_result
from envace.types import ToolCall

# The example shop whose failures say {"status": false}: `rule` defines the environment's error rule, `by_hand`
# only flags its own results; `lazy` is a factory whose data path was never set.
MODULE = textwrap.dedent('''
    import json
    import os
    from dataclasses import replace

    from envace.envs import example
    from envace.types import ToolResult


    class ByHand(example.ShopEnv):
        def _dispatch(self, call):
            if call.name == "add_to_cart" and call.arguments["quantity"] < 1:
                return ToolResult(json.dumps({"status": False}), True, "TOOL_ERROR")
            return super()._dispatch(call)


    class Rule(ByHand):
        def _dispatch(self, call):  # no flag by hand: the rule flags it
            result = super()._dispatch(call)
            return ToolResult(result.content) if result.content == json.dumps({"status": False}) else result

        @staticmethod
        def result_is_error(content):
            return content == json.dumps({"status": False})


    def by_hand():
        return replace(example.benchmark(), make_env=ByHand)


    def rule():
        return replace(example.benchmark(), make_env=Rule)


    def lazy():
        path = os.environ["SHOP_DATA_NEVER_SET"]  # read when tasks load, as a lazy factory would

        def load_tasks(category, split="test", limit=None, offset=0):
            return json.loads(open(os.environ["SHOP_DATA_NEVER_SET"]).read())

        return replace(example.benchmark(), load_tasks=load_tasks) if path else None
    ''')


@pytest.fixture()
def shops(tmp_path, monkeypatch):
    (tmp_path / "rule_shops.py").write_text(MODULE.replace('path = os.environ["SHOP_DATA_NEVER_SET"]', 'path = 1'))
    monkeypatch.syspath_prepend(str(tmp_path))
    return {name: registry.get(f"rule_shops:{name}") for name in ("by_hand", "rule")}


def test_the_environments_rule_reads_real_and_rehearsed_failures_alike(shops):
    refused = json.dumps({"status": False})
    bench = shops["rule"]
    assert bench.result_is_error is None and bench.is_error(refused)  # derived from the environment itself
    env = bench.make_env()
    env.reset(bench.load_tasks("groceries", "all")[0])
    real = env.execute(ToolCall("add_to_cart", {"item": "apple", "quantity": 0}))
    assert real.is_error and real.error_kind == "TOOL_ERROR"  # `execute` flags what the rule matches
    rehearsed = as_result(parse_execution_result(f"<execution_result>{refused}</execution_result>"), bench.is_error)
    assert rehearsed.is_error  # and so does the rehearser's result, through the same rule


def test_check_env_names_results_flagged_by_hand_that_the_error_rule_misses(shops):
    for name, found in (("by_hand", 1), ("rule", 0)):
        checked = check_category(shops[name], "groceries", workers=1)
        lines = [p for p in problems(checked) if "error rule does not recognise" in p]
        assert len(lines) == found and (not lines or '{"status": false}' in lines[0]), (name, lines)


def test_envs_spec_loads_a_task_of_every_category_and_says_what_fails(tmp_path, monkeypatch, capsys):
    (tmp_path / "lazy_shop.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("SHOP_DATA_NEVER_SET", str(tmp_path / "missing.json"))
    assert main(["envs", "envace.envs.example:benchmark"]) == 0
    assert main(["envs", "lazy_shop:lazy", "envace.envs.example:benchmark", "no_such_module:x"]) == 2
    rows = capsys.readouterr().out.splitlines()
    lazy = next(r for r in rows if r.startswith("lazy_shop:lazy"))
    assert "error: env 'lazy_shop:lazy' category groceries: load_tasks raised FileNotFoundError" in lazy
    assert any(r.startswith("no_such_module:x") and "cannot import no_such_module" in r for r in rows)
    assert any(r.startswith("envace.envs.example:benchmark") and r.endswith("groceries") for r in rows)


def test_check_env_takes_a_number_of_workers(capsys):
    assert main(["check-env", "envace.envs.example:benchmark", "--workers", "1"]) == 0
    assert "6/6  negative control fell 6/6" in capsys.readouterr().out
    assert main(["check-env", "envace.envs.example:benchmark", "--workers", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: --workers: must be at least 1, got 0"]


def test_an_old_leakage_config_is_refused_with_how_to_migrate():
    with pytest.raises(UsageError) as refused:
        RolloutConfig(split="test", mode="real+shadow", rehearser=RehearserOptions(fewshot="reference"))
    assert 'fewshot = "other_tasks" under [rollout.rehearser]' in str(refused.value)


def test_vitabench_runs_calls_as_upstream_and_stores_new_instore_orders_as_it_does():
    bench = registry.get("vitabench")
    task = next(t for t in bench.load_tasks("instore_solo", "all") if t.reference)
    env = bench.make_env()
    env.reset(task)
    typed = env.execute(ToolCall("get_holiday_date", {"year": 2025, "holiday_name": "Dragon Boat"}))
    # an integer where the schema says string: upstream's tool runs and answers plainly, not a refusal
    assert typed.content == "No holiday data for the year 2025." and typed.dispatched and not typed.is_error
    order = next(s.call for turn in task.reference for s in turn if s.call.name == "create_instore_product_order")
    before = set(env.db.orders)
    created = env.execute(order)  # the gold's own order
    (new,) = set(env.db.orders) - before
    assert created.dispatched and env.db.orders[new].shipping_time == 0.0  # upstream's, not None
