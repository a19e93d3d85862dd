"""Self-check of an environment: what `envace check-env` runs, for a built-in or a plugin alike.

For every task of a category (both splits), on a fresh environment each time:
1. every reference call goes through `execute()` as a caller's would (validation included; a call to one of
   the simulated user's tools through `execute_user`); a call the environment refuses is a *rejected* call:
   the task's own schema contradicts its gold (a required parameter missing from `properties`, say);
2. the checker scores the dispatched calls, each its own step: the gold must pass (`payload["reference_texts"]`
   are the answers a perfect caller says, for checkers that read them);
3. negative control: the same replay without the last state-changing reference call (the last one whose result
   is not an error) must fail. A task where it still passes is named, not raised: in some τ² tasks the last
   such call is a read the checker does not look at. A task with no reference call that is scored on what the
   caller says (BFCL memory) must fail when it says it does not know. Any other task has no control;
4. every result the environment flagged as an error must be one its error rule recognises
   (`Benchmark.is_error`, what rehearsed results go through): otherwise a rehearsal of that very text would
   count as a success.

`problems` turns a category's counts into what `check-env` fails on, one line each: gold that fails, reference
calls the environment rejects, flagged results the error rule misses, and a negative control that fell on none
of the tasks that have one (the score does not depend on the calls). Tasks the benchmark lists in
`known_defects` (its data contradicts itself) are reported with their reason instead, and a listed task whose
gold passes is a problem: the list is kept true. `check_benchmark` runs every category in turn and adds them up.
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ProcessPoolExecutor
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field

from envace.envs.base import Environment, Steps
from envace.envs.benchmark import Benchmark
from envace.errors import UsageError
from envace.types import Split, Task, ToolCall, ToolResult


@dataclass(frozen=True)
class TaskCheck:
    """One task's verdicts. `control`: `fell` (the cut replay fails, as it must), `held` (it still passes), `none`."""

    uid: str
    passed: bool
    detail: str
    rejected: tuple[tuple[str, str], ...]  # (call name, the environment's error) for every refused reference call
    control: str
    unrecognised: tuple[str, ...] = ()  # results the environment flagged that its error rule does not recognise


@dataclass
class CategoryCheck:
    """A category's tasks, checked: the counts `check-env` prints, and the problems it fails on."""

    category: str
    tasks: list[TaskCheck] = field(default_factory=list)

    @property
    def failures(self) -> list[str]:
        return [t.uid for t in self.tasks if not t.passed]

    @property
    def unrecognised(self) -> list[tuple[str, str]]:
        """(task uid, result text) of every flagged result the error rule misses."""
        return [(t.uid, text) for t in self.tasks for text in t.unrecognised]

    @property
    def rejected(self) -> list[tuple[str, str, str]]:
        """(task uid, call name, error) of every reference call the environment refused."""
        return [(t.uid, name, error) for t in self.tasks for name, error in t.rejected]

    def control(self, outcome: str) -> list[str]:
        return [t.uid for t in self.tasks if t.control == outcome]


def _run(env: Environment, call: ToolCall) -> ToolResult:
    """A reference call issued by whoever owns the tool: the caller, or the simulated user (τ² telecom)."""
    return env.execute_user(call) if call.name in env.user_tools and call.name not in env.tools else env.execute(call)


def _replay(benchmark: Benchmark, task: Task, skip: tuple[int, int] | None = None
            ) -> tuple[Steps, list[tuple[int, int, ToolResult]]]:
    """The reference executed on a fresh environment (without the call at `skip`): the steps a checker scores,
    and each executed call's (turn, index, result)."""
    env = benchmark.make_env()
    env.reset(task)
    steps: Steps = []
    results = []
    for k, turn in enumerate(task.reference):
        steps.append([])
        for i, ref in enumerate(turn):
            if (k, i) == skip:
                continue
            result = _run(env, ref.call)
            results.append((k, i, result))
            steps[-1].append([ref.call] if result.dispatched else [])
    return steps, results


_SAID_NOTHING = "I do not know."


def _score(benchmark: Benchmark, task: Task, steps: Steps, texts: list[str] | None = None):
    env = benchmark.make_env()
    env.reset(task)
    # A perfect caller also says what the benchmark checks was said (τ²'s communicate_info, BFCL memory's answer).
    return env.score(task, steps, texts=texts or task.payload.get("reference_texts"))


def check_task(benchmark: Benchmark, task: Task, control: bool = True) -> TaskCheck:
    steps, results = _replay(benchmark, task)
    rejected = tuple((task.reference[k][i].call.name, r.content) for k, i, r in results if not r.dispatched)
    unrecognised = tuple(r.content for _, _, r in results
                         if r.dispatched and r.is_error and not benchmark.is_error(r.content))
    verdict = _score(benchmark, task, steps)
    writes = [(k, i) for k, i, r in results if not r.is_error]
    outcome = "none"
    if writes and control:
        cut, _ = _replay(benchmark, task, skip=writes[-1])
        outcome = "held" if _score(benchmark, task, cut).success else "fell"
    elif control and not results and task.payload.get("reference_texts"):  # scored on what is said alone
        outcome = "held" if _score(benchmark, task, steps, texts=[_SAID_NOTHING]).success else "fell"
    return TaskCheck(task.uid, verdict.success, verdict.detail, rejected, outcome, unrecognised)


def _check_slice(benchmark: Benchmark | str, category: str, offset: int, limit: int | None, control: bool
                 ) -> list[TaskCheck]:
    if isinstance(benchmark, str):  # a benchmark that does not pickle is found again by its name
        from envace.envs import registry

        benchmark = registry.get(benchmark)
    return [check_task(benchmark, task, control) for task in benchmark.load_tasks(category, Split.ALL, limit, offset)]


def _portable(benchmark: Benchmark) -> Benchmark | str:
    """The benchmark itself for a worker process when it pickles (no import by name again), else its name."""
    try:
        pickle.dumps(benchmark)
        return benchmark
    except Exception:  # noqa: BLE001 - a lambda, a closure, a local class: anything that does not pickle
        return benchmark.name


def check_category(benchmark: Benchmark, category: str, workers: int | None = None, chunk: int = 8,
                   control: bool = True) -> CategoryCheck:
    """Every task of `category`, both splits, checked (see the module docstring; `control` False skips step 3).

    Chunks of `chunk` tasks are spread over `workers` processes (one per core by default) until a chunk comes back
    short: building and scoring τ² environments is pure-Python validation of their databases, so it scales with
    cores, and no worker builds a task it does not check. Workers get the benchmark itself when it pickles, else
    find it again by its name (a plugin's name is its entry point or its `module:factory` spec).
    """
    workers = workers or len(os.sched_getaffinity(0))
    if workers <= 1:
        return CategoryCheck(category, _check_slice(benchmark, category, 0, None, control))
    out, offset, done = CategoryCheck(category), 0, False
    portable = _portable(benchmark)
    with ProcessPoolExecutor(workers) as pool:
        running = []
        while running or not done:
            while not done and len(running) < workers:
                running.append(pool.submit(_check_slice, portable, category, offset, chunk, control))
                offset += chunk
            part = running.pop(0).result()
            out.tasks += part
            done = done or len(part) < chunk
    return out


def replay_reference_scores(benchmark: Benchmark, category: str, workers: int | None = None, chunk: int = 8
                            ) -> tuple[int, int, list[str]]:
    """(passed, total, failed task uids): the gold verdicts of `check_category`, without its negative control."""
    checked = check_category(benchmark, category, workers, chunk, control=False)
    return len(checked.tasks) - len(checked.failures), len(checked.tasks), checked.failures


def has_gold(benchmark: Benchmark, category: str) -> bool:
    """Whether the category's tasks carry gold to replay (BFCL's live_relevance keeps none: `payload["gold"]`)."""
    first = benchmark.load_tasks(category, Split.ALL, 1)
    return bool(first) and first[0].payload.get("gold", True) is not False


def known_failures(checked: CategoryCheck, known: Mapping[str, str]) -> list[tuple[str, str]]:
    """(task uid, documented reason) of each failing task the benchmark lists as a defect of its data."""
    return [(uid, known[uid]) for uid in checked.failures if uid in known]


def problems(checked: CategoryCheck, known: Mapping[str, str] | None = None, shown: int = 3) -> list[str]:
    """One line per problem of a checked category (see the module docstring); empty when it is sound."""
    out, known = [], known or {}
    c, total = checked.category, len(checked.tasks)
    rejected = [r for r in checked.rejected if r[0] not in known]
    if rejected:
        first = "; ".join(f"{uid} {name}: {error}" for uid, name, error in rejected[:shown])
        out.append(f"{c}: {len(rejected)} reference call(s) rejected by execute() (the tools' schemas "
                   f"contradict the gold calls): {first}")
    failures = [uid for uid in checked.failures if uid not in known]
    if failures:
        details = {t.uid: t.detail for t in checked.tasks}
        out.append(f"{c}: {len(failures)}/{total} ground-truth trajectories fail the checker: "
                   + "; ".join(f"{uid} ({details[uid][:120]})" for uid in failures[:shown]))
    unrecognised = [u for u in checked.unrecognised if u[0] not in known]
    if unrecognised:
        first = "; ".join(f"{uid}: {text[:80]!r}" for uid, text in unrecognised[:shown])
        out.append(f"{c}: {len(unrecognised)} result(s) the environment flags as errors that its error rule does "
                   f"not recognise, so a rehearsal of the same text counts as a success (define "
                   f"Environment.result_is_error): {first}")
    stale = [t.uid for t in checked.tasks if t.passed and t.uid in known]
    if stale:
        out.append(f"{c}: {len(stale)} task(s) listed as known defects pass their gold: {', '.join(stale[:shown])}")
    fell, held = checked.control("fell"), checked.control("held")
    if held and not fell:
        out.append(f"{c}: negative control did not fall on any of {len(held)} task(s): dropping the last "
                   f"state-changing call never changes the score ({', '.join(held)})")
    return out


@dataclass
class BenchmarkCheck:
    """A benchmark's categories, checked one after the other as `envace check-env` runs them, and their sums."""

    benchmark: Benchmark
    gold: dict[str, bool]  # the categories to check, each with whether it keeps gold answers to replay
    workers: int | None = None
    checked: list[CategoryCheck] = field(default_factory=list)

    def run(self, replaying: Callable[[str], AbstractContextManager] = lambda category: nullcontext()
            ) -> Iterator[tuple[str, CategoryCheck | None]]:
        """Each category as soon as it is checked (None: it has no gold), inside `replaying(category)` meanwhile."""
        for category, has in self.gold.items():
            if not has:
                yield category, None
                continue
            with replaying(category):
                checked = check_category(self.benchmark, category, self.workers)
            self.checked.append(checked)
            yield category, checked

    @property
    def passed(self) -> int:
        return sum(len(c.tasks) - len(c.failures) for c in self.checked)

    @property
    def total(self) -> int:
        return sum(len(c.tasks) for c in self.checked)

    @property
    def known(self) -> list[tuple[str, str]]:
        """(task uid, documented reason) of every failure the benchmark lists as a defect of its data."""
        return [k for c in self.checked for k in known_failures(c, self.benchmark.known_defects)]

    @property
    def found(self) -> list[str]:
        """Every problem of the categories checked so far, one line each (`problems`)."""
        return [line for c in self.checked for line in problems(c, self.benchmark.known_defects)]


def check_benchmark(benchmark: Benchmark, category: str | None = None, workers: int | None = None
                    ) -> BenchmarkCheck:
    """The check of every category of `benchmark`, or of `category` alone, ready to `run`: bad input (a category
    it does not have, or one without gold) fails here, before anything is replayed."""
    categories = benchmark.categories
    if category is not None:
        if category not in categories:
            raise UsageError(f"category: unknown {benchmark.name} category '{category}' "
                             f"(choose from {', '.join(categories)})")
        categories = (category,)
    gold = {c: has_gold(benchmark, c) for c in categories}
    if category is not None and not gold[category]:
        raise UsageError(f"{benchmark.name} {category} has no gold answers to replay")
    return BenchmarkCheck(benchmark, gold, workers)
