"""A pipeline model of GRPO steps: the training run's own scheduler (`envace.training.scheduler`) driven by a
deterministic discrete-event simulation of actors' generation servers and the learner (`envace bench pipeline`;
docs/benchmarks.md).

A step's work is its groups of episodes; an episode is a list of requests (prompt tokens to prefill, tokens to
generate), each followed by `tool_s` before the episode's next request. Costs:

    one server iteration   = speed × (decode_s + batch_s × (b − 1) + prefill_s × tokens admitted this iteration)
                             (b concurrent sequences each gain one token)
    one update             = update_s + update_s_per_token × the tokens it back-propagates (a stored run's
                             trained rows; every generated token in a projection), and nothing when it trains
                             none (the learner skips a step whose every advantage is 0)
    one publish            = publish_s (the learner is busy; the version is usable when it ends)

What each actor plays and when is not modelled here: `Scheduler.assign` decides it, exactly as in `envace train`
under Ray (chunks of every step the staleness bound opens, up to `slots` episodes in flight per actor, one version
per actor at a time, the learner taking steps in order). Only the episode loop is the model's: lock-step (a chunk's
episodes advance in rounds, each waiting for the slowest answer, as the engine plays a batch) or per-episode (an
episode sends its next request as soon as its answer is in; the server batches whatever is waiting).

Outputs per run of the model: step times (version k+1 published − version k published), slot-time idle
(`Scheduler.idle`: slots offered but empty, a finished episode's slot idle until refilled), actor utilisation
(server busy ÷ wall) and learner utilisation (update + publish ÷ wall).
"""

from __future__ import annotations

import heapq
import math
import random
from dataclasses import dataclass, field, fields, replace
from itertools import count

from envace.errors import UsageError
from envace.training.scheduler import ROLLOUT, Scheduler, Work

Episode = tuple[tuple[int, int], ...]  # (prompt tokens prefilled, tokens generated) per request
Step = list[list[Episode]]  # groups of episodes


@dataclass(frozen=True)
class Costs:
    decode_s: float = 0.0  # one decode iteration at batch 1 (s)
    batch_s: float = 0.0  # added per extra concurrent sequence per iteration (s)
    prefill_s: float = 0.0  # per prompt token prefilled (s)
    tool_s: float = 0.0  # between an answer and the episode's next request (s)
    update_s_per_token: float = 0.0  # per generated token of the step (s)
    update_s: float = 0.0  # per update (s)
    publish_s: float = 0.0  # per published version (s)

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
                raise UsageError(f"pipeline cost {f.name} must be a finite number >= 0, got {value!r}")


@dataclass(frozen=True)
class Schedule:
    staleness: int = 0
    per_episode: bool = False
    actors: int = 1
    slots: int | None = None  # episodes in flight per actor (`ray.in_flight`; None: a step's share, ⌈episodes / n⌉)
    speeds: tuple[float, ...] = ()  # per actor: multiplier on its iteration time (1 = nominal)
    chunk: int | None = None  # groups a chunk holds (`ray.chunk_groups`; None: `scheduler.chunk_size`'s default)

    def __post_init__(self) -> None:
        if not isinstance(self.staleness, int) or self.staleness < 0:
            raise UsageError(f"pipeline staleness must be a whole number >= 0, got {self.staleness!r}")
        if self.actors < 1 or (self.slots is not None and self.slots < 1):
            raise UsageError("pipeline actors and slots (episodes in flight per actor) must be at least 1")
        if any(s <= 0 for s in self.speeds):
            raise UsageError("pipeline actor speeds must be > 0")


@dataclass
class Result:
    step_s: list[float]  # per step: its version published − the previous one published
    idle_share: float  # slot-time idle over the run (`Scheduler.idle`): empty slots ÷ slots offered
    actor_util: float  # server busy time ÷ (actors × wall)
    learner_util: float  # update + publish ÷ wall
    wall_s: float
    step_idle: list[float] = field(default_factory=list)  # slot-time idle over each step's window
    log: list = field(default_factory=list)  # the scheduler's hand-outs: (at, actor, kind, step, chunk)

    @property
    def mean_s(self) -> float:
        return sum(self.step_s) / len(self.step_s)

    def steady_s(self, skip: int) -> float:
        """Mean step time after the first `skip` steps (the pipeline's fill)."""
        tail = self.step_s[skip:] or self.step_s
        return sum(tail) / len(tail)


@dataclass(eq=False)
class _Ep:
    requests: Episode
    chunk: _Chunk
    index: int = 0
    remaining: int = 0
    seconds: float = 0.0


@dataclass(eq=False)
class _Chunk:
    """A chunk the scheduler handed out, as the model plays it: its episodes on its actor's server."""
    actor: int
    work: Work
    started: float
    episodes: list = field(default_factory=list)
    left: int = 0  # episodes still playing
    outstanding: int = 0  # lock-step: answers the current round still waits for


@dataclass(eq=False)
class _Server:
    speed: float
    waiting: list = field(default_factory=list)
    active: list = field(default_factory=list)
    running: bool = False
    busy_s: float = 0.0


def simulate(steps: list[Step], costs: Costs, schedule: Schedule, trained: list[int] | None = None) -> Result:
    """Play `steps` under `schedule` with `costs` (module docstring): deterministic. `trained`: the tokens each
    step's update back-propagates (None: every token generated)."""
    if not steps or any(not any(group for group in step) for step in steps):
        raise UsageError("pipeline: every step needs at least one episode")
    return _Sim(steps, costs, schedule, trained).run()


class _Sim:
    """The training run's own scheduler (`scheduler.Scheduler`) on a simulated clock: it decides every hand-out;
    this class only plays the chunks on simulated servers and the learner's updates."""

    def __init__(self, steps: list[Step], costs: Costs, schedule: Schedule, trained: list[int] | None) -> None:
        self.costs, self.s, self.steps = costs, schedule, steps
        n = schedule.actors
        biggest = max(sum(len(g) for g in step) for step in steps)
        self.group = max(len(g) for step in steps for g in step)
        speeds = list(schedule.speeds) + [1.0] * (n - len(schedule.speeds))
        self.servers = [_Server(speeds[i]) for i in range(n)]
        self.sched = Scheduler(n, schedule.staleness, 0, len(steps), lambda k: len(steps[k]), self.group,
                               schedule.slots or -(-biggest // n), schedule.chunk)
        self.tokens = trained if trained is not None else [generated(step) for step in steps]
        self.events: list = []
        self.seq = count()
        self.published = [0.0]
        self.learner_busy, self.learner_s, self.next_update, self.t = False, 0.0, 0, 0.0
        self.step_idle: list[float] = []

    def at(self, t: float, kind: str, what) -> None:
        heapq.heappush(self.events, (t, next(self.seq), kind, what))

    def run(self) -> Result:
        self.assign(0.0)
        while self.events:
            self.t, _, kind, what = heapq.heappop(self.events)
            getattr(self, "on_" + kind)(what, self.t)
        if len(self.published) != len(self.steps) + 1:
            raise UsageError("pipeline: the schedule never finished its steps")
        t = self.t
        busy = sum(a.busy_s for a in self.servers)
        windows = [b - a for a, b in zip(self.published, self.published[1:], strict=False)]
        # the run's slot-time idle: each step's window's, weighted by its length (the windows tile the run)
        idle = sum(i * w for i, w in zip(self.step_idle, windows, strict=True)) / t if t else 0.0
        return Result(windows, idle, busy / (len(self.servers) * t) if t else 0.0, self.learner_s / t if t else 0.0,
                      t, self.step_idle, list(self.sched.log))

    # actors
    def assign(self, t: float) -> None:
        for actor, work, _loads in self.sched.assign(t):
            chunk = _Chunk(actor, work, t)
            groups = self.steps[work.step][work.start: work.stop]
            chunk.episodes = [_Ep(tuple(r for r in e if r[1] > 0) or ((0, 1),), chunk) for g in groups for e in g]
            chunk.left = chunk.outstanding = len(chunk.episodes)
            for ep in chunk.episodes:
                self.submit(ep, t)

    def submit(self, ep: _Ep, t: float) -> None:
        server = self.servers[ep.chunk.actor]
        ep.remaining = ep.requests[ep.index][1]
        server.waiting.append(ep)
        if not server.running:  # the next iteration admits every request that arrives at this instant
            server.running = True
            self.at(t, "kick", server)

    def on_kick(self, a: _Server, t: float) -> None:
        self.iterate(a, t)

    def iterate(self, a: _Server, t: float) -> None:
        prefill = sum(ep.requests[ep.index][0] for ep in a.waiting)
        a.active += a.waiting
        a.waiting = []
        if not a.active:
            a.running = False
            return
        c = self.costs
        dur = a.speed * (c.decode_s + c.batch_s * (len(a.active) - 1) + c.prefill_s * prefill)
        a.running, a.busy_s = True, a.busy_s + dur
        self.at(t + dur, "iterated", a)

    def on_iterated(self, a: _Server, t: float) -> None:
        still = []
        for ep in a.active:
            ep.remaining -= 1
            if ep.remaining > 0:
                still.append(ep)
            else:
                self.at(t + self.costs.tool_s, "answered", ep)
        a.active = still
        self.iterate(a, t)

    def on_answered(self, ep: _Ep, t: float) -> None:
        """An answer is in: per-episode, the episode sends its next request at once; lock-step, the chunk's round
        waits for its slowest answer (the engine plays a chunk's episodes as one batch)."""
        chunk = ep.chunk
        ep.index += 1
        if ep.index >= len(ep.requests):
            ep.seconds = t - chunk.started
            chunk.left -= 1
        if self.s.per_episode:
            if ep.index < len(ep.requests):
                return self.submit(ep, t)
        else:
            chunk.outstanding -= 1
            if chunk.outstanding:
                return None
            going = [e for e in chunk.episodes if e.index < len(e.requests)]
            chunk.outstanding = len(going)
            for e in going:
                self.submit(e, t)
        if chunk.left == 0:
            self.sched.done(chunk.actor, chunk.work, t, None, [e.seconds for e in chunk.episodes])
            self.learn(t)
            self.assign(t)
        return None

    # the learner
    def learn(self, t: float) -> None:
        k = self.next_update
        if self.learner_busy or k >= len(self.steps) or not self.sched.complete(ROLLOUT, k):
            return
        self.sched.take(ROLLOUT, k)
        c = self.costs
        dur = (c.update_s + c.update_s_per_token * self.tokens[k] if self.tokens[k] else 0.0) + c.publish_s
        self.learner_busy, self.learner_s = True, self.learner_s + dur
        if dur == 0:  # published at once, before any actor is refilled (as the driver's learner does)
            return self.on_published(k + 1, t)
        self.at(t + dur, "published", k + 1)
        return None

    def on_published(self, version: int, t: float) -> None:
        self.learner_busy, self.next_update = False, version
        self.step_idle.append(self.sched.idle(self.published[-1], t) or 0.0)
        self.published.append(t)
        self.sched.published(version)
        self.learn(t)
        self.assign(t)


# ---------------------------------------------------------------------------------------------------------------
# A run in the store: its episodes as requests, its measured steps, and costs fitted to them.

@dataclass
class Measured:
    run_id: str
    staleness: int
    steps: list[Step]
    step_s: list[float]
    rollout_s: list[float]
    update_s: list[float]
    publish_s: list[float]
    schedule: Schedule = field(default_factory=Schedule)  # the run's own: actors, episode loop, in flight, chunk
    trained: list[int] | None = None  # per step, the completion tokens of the rows its update trained


def load_run(con, run_id: str) -> Measured:
    """A stored training run's GRPO steps: each episode's requests (from its generations) and each step's timings."""
    import json

    meta = con.execute("SELECT kind, config FROM runs WHERE run_id = ?", [run_id]).fetchone() \
        if _has(con, "runs") else None
    if meta is None and not _has(con, "metrics"):
        raise UsageError(f"run '{run_id}': no such run in the store")
    timing = con.execute("SELECT step, name, value FROM metrics WHERE run_id = ? AND phase = 'grpo' AND role = 'all' "
                         "AND name IN ('step_s', 'rollout_s', 'update_s', 'sync_s', 'load_s', 'actor_in_flight')",
                         [run_id]).fetchall() if _has(con, "metrics") else []
    by_step: dict[int, dict[str, float]] = {}
    for step, name, value in timing:
        by_step.setdefault(step, {})[name] = value
    by_step = {k: v for k, v in by_step.items() if "step_s" in v and "rollout_s" in v}
    if not by_step:
        raise UsageError(f"run '{run_id}' has no GRPO steps with timings (step_s, rollout_s) to model")
    rows = con.execute("SELECT step, episode_id, role, turn, turn_step, call_index, prompt_len, len(completion_ids) "
                       "FROM generations WHERE run_id = ? AND regexp_matches(episode_id, '^s[0-9]+:') "
                       "ORDER BY step, episode_id, turn, turn_step, role <> 'caller', role, call_index",
                       [run_id]).fetchall() if _has(con, "generations") else []
    episodes: dict[int, dict[str, list]] = {}
    last: dict[tuple[str, str], int] = {}
    for step, ep, role, _turn, _ts, _ci, prompt_len, generated in rows:
        if step not in by_step:
            continue
        prev = last.get((ep, role))
        last[(ep, role)] = prompt_len + generated
        episodes.setdefault(step, {}).setdefault(ep, []).append(
            (prompt_len if prev is None else max(0, prompt_len - prev), max(1, generated)))
    config = {}
    if meta and meta[1]:
        config = meta[1] if isinstance(meta[1], dict) else json.loads(meta[1])
    staleness = int((config.get("grpo") or {}).get("max_staleness", 0) or 0)
    ray, rollout = config.get("ray") or {}, config.get("rollout") or {}
    actors = int(ray.get("actors", 1) or 1) if ray.get("address") else 1
    slots = [v for (_, name), v in _named(timing).items() if name == "actor_in_flight"]
    schedule = Schedule(staleness, rollout.get("episode_loop") == "per_episode", actors,
                        int(slots[0]) if slots else None, chunk=ray.get("chunk_groups") if actors > 1 else None)
    keep = sorted(k for k in by_step if k in episodes)
    if not keep:
        raise UsageError(f"run '{run_id}' stores no generations for its GRPO steps")
    trained = dict(con.execute("SELECT step, coalesce(sum(len(completion_ids)) FILTER (trained), 0) FROM generations "
                               "WHERE run_id = ? AND regexp_matches(episode_id, '^s[0-9]+:') GROUP BY step",
                               [run_id]).fetchall())
    steps = [_groups(episodes[k]) for k in keep]
    t = [by_step[k] for k in keep]
    return Measured(run_id, staleness, steps, [x["step_s"] for x in t], [x["rollout_s"] for x in t],
                    [x.get("update_s", 0.0) for x in t], [x.get("sync_s", 0.0) + x.get("load_s", 0.0) for x in t],
                    schedule, [int(trained.get(k, 0)) for k in keep])


def _named(timing: list) -> dict:
    return {(step, name): value for step, name, value in timing}


def _has(con, table: str) -> bool:
    return bool(con.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = ?",
                            [table]).fetchone()[0])


def _groups(episodes: dict[str, list]) -> Step:
    """Episodes `s<k>:<task>#<i>` grouped by task, in order."""
    groups: dict[str, list[Episode]] = {}
    for ep, requests in sorted(episodes.items()):
        groups.setdefault(ep.rsplit("#", 1)[0], []).append(tuple(requests))
    return list(groups.values())


def _lockstep_features(step: Step) -> list[float]:
    """One lock-step batch's rollout time as a linear function of (decode_s, batch_s, prefill_s, tool_s)."""
    eps = [e for g in step for e in g]
    iters = extra = prefill = rounds = 0
    for r in range(max(len(e) for e in eps)):
        here = [e[r] for e in eps if r < len(e)]
        lengths = [n for _, n in here]
        iters += max(lengths)
        extra += sum(lengths) - max(lengths)
        prefill += sum(p for p, _ in here)
        rounds += 1
    return [iters, extra, prefill, rounds]


def _nnls(rows: list[list[float]], target: list[float]) -> list[float]:
    import numpy as np
    from scipy.optimize import nnls

    a, b = np.array(rows, dtype=float), np.array(target, dtype=float)
    scale = np.where(a.max(axis=0) > 0, a.max(axis=0), 1.0)
    x, _ = nnls(a / scale, b)
    return list(x / scale)


def fit(run: Measured) -> Costs:
    """Costs fitted to a run's measured steps (non-negative least squares): each step's rollout against its
    lock-step batch's iterations, extra sequences, prefill tokens and rounds; the update against the tokens it
    trained (the steps that trained any: one that trains none costs nothing, as in the learner)."""
    decode, batch, prefill, tool = _nnls([_lockstep_features(s) for s in run.steps], run.rollout_s)
    tokens = run.trained if run.trained is not None else [generated(s) for s in run.steps]
    updated = [(t, u) for t, u in zip(tokens, run.update_s, strict=True) if t]
    update, per_token = _nnls([[1.0, t] for t, _ in updated], [u for _, u in updated]) if updated else (0.0, 0.0)
    return Costs(*(float(x) for x in (decode, batch, prefill, tool, per_token, update)),
                 float(sum(run.publish_s) / len(run.publish_s)))


def generated(step: Step) -> int:
    """The tokens a step's episodes generated."""
    return sum(n for group in step for e in group for _, n in e)


def validate(run: Measured, costs: Costs) -> dict[str, float]:
    """The run's steps simulated under its own schedule (its actors, episode loop, in-flight target and chunk, all
    from its `run.json`) against its measured mean step."""
    result = simulate(run.steps, costs, run.schedule, run.trained)
    measured = sum(run.step_s) / len(run.step_s)
    return {"run": run.run_id, "staleness": run.staleness, "steps": len(run.steps), "actors": run.schedule.actors,
            "loop": "per-episode" if run.schedule.per_episode else "lock-step", "measured_s": measured,
            "simulated_s": float(result.mean_s), "error": float(result.mean_s / measured - 1),
            "idle_share": float(result.idle_share)}


# ---------------------------------------------------------------------------------------------------------------
# Projection onto GPUs: published figures as inputs (docs/benchmarks.md names each).

H100_HBM_BYTES_S = 3.35e12  # H100 SXM memory bandwidth (NVIDIA's data sheet): batch-1 decode reads every weight once
PUBLISH_BYTES_S = 8e9  # verl checkpoint engine, ~8 GB/s over NCCL (anchors.md, scale.md)
GENERATION_8B = 2478.0  # tok/s/GPU: NeMo-RL v0.5, Llama-3.1-8B, 16 H100, one step off-policy (anchors.md, scale.md)
ON_POLICY_8B = 1581.0  # tok/s/GPU, the same, on-policy: 1/1581 = 1/generation + 1/update
TRAIN_1_7B = 6250.0  # tok/s: TRL trainer-only Qwen3-1.7B 5.2k–7.3k on one GPU, the midpoint (anchors.md)
CONCURRENCY = 64  # requests in flight per server (scale.md: the GPU configs' request concurrency)
PREFILL_FLOPS = 0.4 * 989e12  # H100 bf16 dense peak (NVIDIA's data sheet) at 40%: prefill is compute-bound

MODELS = {"Qwen3-1.7B": 2.03e9, "Qwen3-8B": 8.19e9}  # parameters


def gpu_costs(model: str, gpus: int, tool_s: float = 0.0) -> tuple[Costs, dict[str, str]]:
    """One actor GPU's serving costs and the learner's (on `gpus` GPUs of its own) for `model`, with how each
    number was derived."""
    params = MODELS[model]
    weights = 2 * params  # bf16 bytes
    generation = GENERATION_8B * MODELS["Qwen3-8B"] / params  # decode throughput scales with the weights read
    update = 1 / (1 / ON_POLICY_8B - 1 / GENERATION_8B) if model == "Qwen3-8B" else TRAIN_1_7B
    decode = weights / H100_HBM_BYTES_S
    batch = (CONCURRENCY / generation - decode) / (CONCURRENCY - 1)
    costs = Costs(decode_s=decode, batch_s=batch, prefill_s=2 * params / PREFILL_FLOPS, tool_s=tool_s,
                  update_s_per_token=1 / (update * gpus), publish_s=weights / PUBLISH_BYTES_S)
    inputs = {"decode at batch 1": f"{1 / decode:,.0f} tok/s (bf16 weights ÷ 3.35 TB/s H100 HBM)",
              f"decode at batch {CONCURRENCY}": f"{generation:,.0f} tok/s/GPU (NeMo-RL 8B off-policy 2,478"
                                                + (" × 8.19/2.03 params)" if model != "Qwen3-8B" else ")"),
              "prefill": f"{1 / costs.prefill_s:,.0f} tok/s (2·params FLOPs at 40% of 989 TFLOP/s)",
              "update": f"{update:,.0f} tok/s per learner GPU, as many learner GPUs as actor GPUs ("
                        + ("NeMo-RL 8B: 1/1581 − 1/2478)" if model == "Qwen3-8B" else "TRL 1.7B 5.2k–7.3k, midpoint)"),
              "publish": f"{costs.publish_s:.2f} s (bf16 weights at 8 GB/s, verl checkpoint engine)"}
    return costs, inputs


def workload(run: Measured, steps: int, groups: int, tokens: int, prompt: int, seed: int) -> list[Step]:
    """`steps` steps of `groups` groups drawn (seeded) from the run's groups, each request's generated and prefill
    tokens scaled so their means are `tokens` and `prompt`: the run's turn counts and spread, at GPU lengths."""
    pool = [g for s in run.steps for g in s]
    reqs = [r for g in pool for e in g for r in e]
    gen_scale = tokens / (sum(n for _, n in reqs) / len(reqs))
    pre_scale = prompt / max(1e-9, sum(p for p, _ in reqs) / len(reqs))
    rng = random.Random(seed)
    return [[[tuple((round(p * pre_scale), max(1, round(n * gen_scale))) for p, n in e) for e in rng.choice(pool)]
             for _ in range(groups)] for _ in range(steps)]


def project(run: Measured, gpus: tuple[int, ...] = (1, 4, 8, 32), steps: int = 8, groups: int = 32, tokens: int = 256,
            prompt: int = 512, seed: int = 0, tool_s: float = 0.0) -> tuple[list[dict], dict[str, dict[str, str]]]:
    """Each model × actor GPUs × rollout mode: steady step time under staleness 0, 1 and 2, with the idle share
    and utilisations of the synchronous schedule."""
    work = workload(run, steps, groups, tokens, prompt, seed)
    rows, inputs = [], {}
    for model in MODELS:
        for n in gpus:
            costs, inputs[model] = gpu_costs(model, n, tool_s)
            for per_episode in (False, True):
                slots = min(CONCURRENCY, -(-sum(len(g) for g in work[0]) // n))
                base = Schedule(per_episode=per_episode, actors=n, slots=slots)
                out = {"model": model, "gpus": n, "mode": "per-episode" if per_episode else "lock-step"}
                for k in (0, 1, 2):
                    r = simulate(work, costs, replace(base, staleness=k))
                    out[f"s{k}"] = r.steady_s(k + 1)
                    if k == 0:
                        out.update(idle=r.idle_share, actor_util=r.actor_util, learner_util=r.learner_util)
                rows.append(out)
    return rows, inputs
