"""An environment from a separate installed package, used through every door with no edit to the project.

The package is built in a temporary folder: a `pyproject.toml` declaring `envace.envs` entry points, the example
shop of `docs/environments.md` (`envace/envs/example.py`, copied, so it imports nothing of the project's but the
public API), and three bad plugins. It is "installed" by a `.dist-info` folder beside it (what pip writes) on
`sys.path`, which `workbench.launch` hands on to its child processes; nothing is left behind.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from envace.cli import main
from envace.envs import registry
from envace.store import connect

PACKAGE = "envace_shop_plugin"
SPEC = f"{PACKAGE}.shop:benchmark"
ENTRY_POINTS = {"shop": SPEC, "shop_broken": f"{PACKAGE}.missing_data:benchmark",
                "shop_wrong": f"{PACKAGE}.wrong:benchmark", "shop_contradicts": f"{PACKAGE}.contradicts:benchmark",
                "shop_documented": f"{PACKAGE}.contradicts:documented", "shop_stale": f"{PACKAGE}.stale:benchmark"}
FAST = ["--model", "tiny", "--max-new-tokens", "8", "--max-steps-per-turn", "2", "--limit", "1"]

MODULES = {
    "__init__.py": "",
    "shop.py": (Path(__file__).parents[1] / "envace" / "envs" / "example.py").read_text(),
    "missing_data.py": 'raise ImportError("the shop\'s price list is missing")\n',
    "wrong.py": 'def benchmark():\n    return {"name": "shop"}\n',
    # the schema says `count` is required but never declares it: every add_to_cart is refused
    "contradicts.py": textwrap.dedent('''
        import copy
        from dataclasses import replace

        from envace_shop_plugin import shop


        def load_tasks(*args, **kwargs):
            tools = copy.deepcopy(shop.TOOLS)
            tools[1]["function"]["parameters"]["required"].append("count")
            return [replace(t, tools=tools) for t in shop.load_tasks(*args, **kwargs)]


        def benchmark():
            return replace(shop.benchmark(), load_tasks=load_tasks)


        def documented():  # the same contradiction, declared as a known defect of the data
            tasks = shop.load_tasks("groceries", "all")
            return replace(benchmark(), known_defects={t.uid: "add_to_cart requires an undeclared count"
                                                       for t in tasks})
        '''),
    # a known defect listed for a task whose gold passes: the list has gone stale
    "stale.py": textwrap.dedent('''
        from dataclasses import replace

        from envace_shop_plugin import shop


        def benchmark():
            first = shop.load_tasks("groceries", "all")[0]
            return replace(shop.benchmark(), known_defects={first.uid: "said to fail"})
        '''),
}


@pytest.fixture(scope="module")
def plugin(tmp_path_factory):
    """The installed package's folder (on `sys.path` while this module runs)."""
    site = tmp_path_factory.mktemp("site")
    (site / PACKAGE).mkdir()
    for name, text in MODULES.items():
        (site / PACKAGE / name).write_text(text)
    points = "\n".join(f'{name} = "{target}"' for name, target in ENTRY_POINTS.items())
    (site / "pyproject.toml").write_text(f'[project]\nname = "envace-shop-plugin"\nversion = "0.1"\n\n'
                                         f'[project.entry-points."envace.envs"]\n{points}\n')
    info = site / f"{PACKAGE}-0.1.dist-info"  # what installing that pyproject.toml writes
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: envace-shop-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[envace.envs]\n" + points.replace('"', "") + "\n")
    sys.path.insert(0, str(site))
    yield site
    sys.path.remove(str(site))
    for name in [m for m in sys.modules if m == PACKAGE or m.startswith(PACKAGE + ".")]:
        del sys.modules[name]


def test_check_env_passes_with_its_negative_control(plugin, capsys):
    assert main(["check-env", "shop"]) == 0
    out = capsys.readouterr().out
    assert "groceries" in out and "6/6  negative control fell 6/6" in out and "problem" not in out


def test_check_env_fails_an_environment_whose_schema_contradicts_its_gold(plugin, capsys):
    assert main(["check-env", "shop_contradicts"]) == 1
    problems = [line for line in capsys.readouterr().out.splitlines() if line.startswith("problem:")]
    assert any("reference call(s) rejected by execute()" in p and "missing required parameter 'count'" in p
               for p in problems), problems
    assert any("ground-truth trajectories fail" in p for p in problems)


def test_known_defects_are_named_and_a_stale_one_is_a_problem(plugin, capsys):
    assert main(["check-env", "shop_documented"]) == 0  # every failure is a documented defect of the data
    out = capsys.readouterr().out
    assert "0/6 ground-truth trajectories pass" in out and "6 fail by known defects" in out
    assert out.count("known defect: ") == 6 and "problem:" not in out
    assert main(["check-env", "shop_stale"]) == 1
    problems = [line for line in capsys.readouterr().out.splitlines() if line.startswith("problem:")]
    assert problems == [p for p in problems if "listed as known defects pass their gold" in p] and problems


@pytest.mark.parametrize("mode", ["real", "rehearse", "rehearse+shadow", "real+shadow"])
def test_rollout_runs_in_every_mode(plugin, tmp_path, mode, capsys):
    assert main(["rollout", "--env", "shop", "--mode", mode, *FAST, "--root", str(tmp_path), "--run-name", "r"]) == 0
    rows = connect(tmp_path).execute("SELECT env, category, mode, score_value, score_parts FROM episodes").fetchall()
    assert [r[:3] for r in rows] == [("shop", "groceries", mode)]
    assert 0.0 <= rows[0][3] <= 1.0 and "lines" in rows[0][4]


def test_the_reference_replays_to_success_and_full_graded_score(plugin, tmp_path, tiny):
    from envace.config import RolloutConfig
    from envace.envs import registry
    from envace.jobs import Reporter, rollout_job
    from envace.policy.scripted import ReferencePolicy

    benchmark = registry.get("shop")
    tasks = benchmark.load_tasks("groceries", "train")
    quiet = type("Quiet", (Reporter,), {"say": lambda self, text: None})()
    for mode in ("real", "rehearse"):  # rehearsed: the scripted rehearser writes the real results back
        cfg = RolloutConfig(env="shop", category="groceries", split="train", mode=mode, model="tiny", embedding=False,
                            rehearser={"fewshot": "reference"})
        _, summary = rollout_job(cfg, tmp_path, mode, reporter=quiet, backend=ReferencePolicy(tiny[1], tasks))
        assert summary["success_rate"] == 1.0, mode
    values = connect(tmp_path).execute("SELECT DISTINCT score_value FROM episodes").fetchall()
    assert values == [(1.0,)]


def test_train_runs_on_the_tiny_model_and_says_how_to_evaluate(plugin, tmp_path, capsys):
    assert main(["train", "experiments/smoke.toml", "--root", str(tmp_path), "--run-name", "t",
                 "--set", "rollout.env=shop", "--set", "rollout.category=groceries", "--set", "grpo.steps=1"]) == 0
    assert "--env shop --category groceries" in capsys.readouterr().out
    con = connect(tmp_path)
    assert ("shop", "grpo") in con.execute("SELECT DISTINCT env, phase FROM episodes").fetchall()
    assert con.execute("SELECT count(*) FROM metrics WHERE phase = 'sft'").fetchall()[0][0] > 0


def test_a_module_factory_spec_works_as_an_installed_name(plugin, tmp_path, capsys):
    assert main(["check-env", SPEC]) == 0
    assert main(["rollout", "--env", SPEC, "--mode", "real+shadow", *FAST, "--root", str(tmp_path),
                 "--run-name", "spec"]) == 0
    capsys.readouterr()
    con = connect(tmp_path)
    # the episodes name the benchmark as the run was started with (the plugin calls itself "shop"), so a stored
    # run finds its benchmark again from its own rows, as `envace judge` does
    (env,) = con.execute("SELECT DISTINCT env FROM episodes").fetchone()
    assert env == SPEC == json.loads((tmp_path / "spec" / "run.json").read_text())["config"]["env"]
    assert registry.get(env).categories == ("groceries",)
    assert con.execute("SELECT count(*) FROM pairs").fetchall()[0][0] >= 0


def test_workbench_launch_runs_a_plugin_rollout_in_its_own_process(plugin, tmp_path):
    """The child finds the spec's module through the launcher's own path (it is not on PYTHONPATH here)."""
    from workbench import launch

    handle = launch(kind="rollout", root=tmp_path, name="launched", args=("--env", SPEC, *FAST))
    assert handle.command[handle.command.index("--env") + 1] == SPEC
    assert handle.wait(240) == "finished", handle.log_tail()
    assert connect(tmp_path).execute("SELECT env FROM episodes").fetchall() == [(SPEC,)]


@pytest.mark.heavy
def test_envs_lists_built_ins_plugins_and_broken_plugins_in_a_child_process(plugin):
    from workbench.launch import child_env

    result = subprocess.run([sys.executable, "-m", "envace.cli", "envs"], capture_output=True, text=True,
                            timeout=120, env=child_env())
    assert result.returncode == 0, result.stderr
    lines = {line.split()[0]: line for line in result.stdout.splitlines()[1:] if line.strip()}
    assert "built-in" in lines["bfcl"] and "built-in" in lines["tau2"]
    assert f"entry point {SPEC}" in lines["shop"] and lines["shop"].endswith("groceries")
    assert "error: env plugin 'shop_broken'" in lines["shop_broken"] and "price list is missing" in lines["shop_broken"]
    assert "error: env plugin 'shop_wrong'" in lines["shop_wrong"] and "returned dict" in lines["shop_wrong"]


@pytest.mark.parametrize("env, message", [
    ("shop_broken", "env plugin 'shop_broken' (entry point envace_shop_plugin.missing_data:benchmark): cannot load"),
    ("shop_wrong", "env plugin 'shop_wrong' (entry point envace_shop_plugin.wrong:benchmark): the factory returned "
                   "dict"),
    (f"{PACKAGE}.shop:no_such_factory", f"env plugin '{PACKAGE}.shop:no_such_factory': module {PACKAGE}.shop has no"),
    ("no_such_package.shop:benchmark", "env plugin 'no_such_package.shop:benchmark': cannot import no_such_package"),
])
def test_a_bad_plugin_is_one_line_and_exit_2(plugin, tmp_path, capsys, env, message):
    for args in (["rollout", "--env", env, "--model", "tiny", "--root", str(tmp_path)], ["check-env", env]):
        assert main(args) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err
    assert main(["check-env", "shop"]) == 0  # the others keep working
