"""BFCL-v4's memory categories: the prerequisite conversations write the memory each question opens on, scored by
`bfcl_eval`'s own `agentic_checker`, on its three backends."""

from __future__ import annotations

import json
import re

import pytest

from envace.build import build_engine
from envace.cli import main
from envace.config import RolloutConfig
from envace.envs import registry
from envace.envs.bfcl import memory
from envace.envs.check import check_category
from envace.policy.models import tokenizer_for
from envace.policy.scripted import ReferencePolicy
from envace.types import Score

# each backend's own call that writes one line to the memory its questions see in their prompt
WRITE = {"memory_kv": ("core_memory_add", lambda k: {"key": f"note_{k}", "value": f"marker-{k}"}),
         "memory_vector": ("core_memory_add", lambda k: {"text": f"marker-{k}"}),
         "memory_rec_sum": ("memory_append", lambda k: {"text": f"marker-{k}"})}


class Writer(ReferencePolicy):
    """The reference policy, except that conversation k of a prerequisite chain writes `marker-k` to memory once."""

    category = "memory_kv"

    def _caller(self, text: str, task) -> str:
        found = re.search(r"_prereq_(\d+)-", task.uid) if task is not None else None
        if found and f"marker-{found[1]}" not in text:
            name, arguments = WRITE[self.category]
            return f'<tool_call>\n{json.dumps({"name": name, "arguments": arguments(found[1])})}\n</tool_call>'
        return super()._caller(text, task)


@pytest.mark.parametrize("category", memory.CATEGORIES)
def test_a_question_opens_on_the_memory_its_scenarios_conversations_wrote(category):
    bfcl = registry.get("bfcl")
    first, second, third = bfcl.load_tasks(category, "all", limit=3)
    writer = Writer(tokenizer_for("tiny"), [first, second, third])
    writer.category = category
    engine = build_engine(writer, bfcl, RolloutConfig(category=category, split="all", batch_size=4,
                                                      max_steps_per_turn=3, embedding=False))
    (one,) = engine.run_batch([(first, 0)])
    customer = len(first.payload["prerequisites"])
    assert customer == 10 and engine.before_turn.conversations == customer
    prompt = writer.tokenizer.decode(one.ids)
    system = prompt.split("<|im_end|>")[0]
    assert "marker-0" in system and "marker-6" in system  # the core memory as the prerequisites left it
    assert "For your final answer to the user" in system and one.texts == [first.payload["reference_answer"]]
    assert one.env.score(one.task, one.steps, one.texts).success
    # the rest of the scenario opens on the same memory without playing its conversations again
    two, three = engine.run_batch([(second, 0), (third, 0)])
    assert engine.before_turn.conversations == customer
    assert two.task.system_prompt == three.task.system_prompt == one.task.system_prompt


def test_without_a_memory_written_the_question_opens_on_an_empty_one():
    bfcl = registry.get("bfcl")
    (task,) = bfcl.load_tasks("memory_kv", "all", limit=1)
    policy = ReferencePolicy(tokenizer_for("tiny"), [task])
    (ep,) = build_engine(policy, bfcl, RolloutConfig(category="memory_kv", split="all")).run_batch([(task, 0)])
    assert "There is no content in the core memory at this point." in ep.task.system_prompt
    assert "marker" not in ep.task.system_prompt


@pytest.mark.parametrize("said, expected", [
    ("{'answer': 'Michael', 'context': 'you told me'}", True),
    ("Your name is MICHAEL.", True),
    ("{'answer': 'Michaela'}", False),  # a whole word, as bfcl_eval's checker asks
    ("I do not know", False),
])
def test_the_answer_is_scored_by_bfcls_own_checker(said, expected):
    (task,) = registry.get("bfcl").load_tasks("memory_kv", "all", limit=1)
    assert task.payload["possible_answer"] == ["Michael"]
    assert memory.score(task, ["a first message", said]) == Score(expected, "" if expected
                                                                   else "agentic:answer_not_found")
    assert memory.score(task, []) == Score(False, "agentic:no_last_message")


def test_check_env_passes_every_gold_answer_and_every_control_falls():
    for category in ("memory_kv", "memory_rec_sum"):  # the vector backend: in the CLI test below
        check = check_category(registry.get("bfcl"), category, workers=1)
        assert len(check.tasks) == 155 and not check.failures and len(check.control("fell")) == 155


def test_check_env_and_a_reference_run_on_the_cli(tmp_path, capsys):
    assert main(["check-env", "bfcl", "--category", "memory_vector", "--workers", "1"]) == 0
    out = capsys.readouterr().out
    assert "memory_vector" in out and "155/155" in out
    assert main(["eval", "reference", "--env", "bfcl", "--category", "memory_vector", "--split", "all",
                 "--limit", "2", "--root", str(tmp_path), "--run-name", "m"]) == 0
    assert "100.0%" in capsys.readouterr().out


@pytest.mark.parametrize("args, message", [
    (["--mode", "rehearse"], "memory_kv opens each task on what the policy wrote in the real environment"),
    (["--private", "parallel", "--budget", "1"], "so it runs in mode real, without private rehearsal"),
])
def test_rehearsal_on_a_memory_category_is_refused_in_one_line(tmp_path, capsys, args, message):
    assert main(["rollout", "--model", "tiny", "--env", "bfcl", "--category", "memory_kv", "--root", str(tmp_path),
                 *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
