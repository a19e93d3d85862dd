"""The per-episode loop (`engine/per_episode.py`) against a served backend faked in-process: each prompt its own
request on its own thread, as `policy.remote` sends them, taking a latency that differs by episode and request."""

import random
import time
import zlib
from dataclasses import replace

import pytest

from envace.build import build_engine
from envace.config import PrivateOptions, RolloutConfig, TrainConfig
from envace.engine import streams
from envace.engine.episode import idle_share
from envace.policy.backend import Generation
from envace.policy.hf import HFBackend
from envace.policy.remote import concurrently
from envace.policy.scripted import ReferencePolicy
from envace.policy.tiny import build_tiny_tokenizer
from envace.record import score

TIMING = ("wall_s", "wait_s", "started_at", "ended_at")  # what may differ between two plays of the same episodes


class Served(ReferencePolicy):
    """The reference policy, served: a request sleeps its latency (slow or fast, by a hash of its episode's task,
    its prompt and `salt`), then the caller drops a gold call ("I cannot do that.") on a coin drawn from the prompt
    when greedy, from the request's seed when sampling; so episodes differ from the reference, and with sampling
    each episode's outcome shows the seeds it drew."""

    concurrent = True

    def __init__(self, tokenizer, tasks, slow=0.03, fast=0.002, salt=0):
        super().__init__(tokenizer, tasks)
        self.slow, self.fast, self.salt = slow, fast, salt

    def _one(self, job):
        prompt, uid, params, n = job
        started = time.perf_counter()
        key = zlib.crc32(f"{self.salt}/{uid}/{len(prompt)}/{sum(prompt)}".encode())
        time.sleep(self.slow if key % 2 else self.fast)
        (gen,) = super().generate([prompt], replace(params, tasks=(uid,)))
        coin = random.Random(params.seed * 65_537 + n if params.temperature > 0 else zlib.crc32(str(prompt).encode()))
        if "<tool_call>" in gen.text and coin.random() < 0.3:  # a caller's message (a rehearsal has no call)
            text = "I cannot do that."
            gen = Generation(self.tokenizer.encode(text, add_special_tokens=False) + [self.end], text, "stop")
        return replace(gen, elapsed_s=time.perf_counter() - started)

    def generate(self, prompts, params):
        jobs = [(p, params.tasks[n], params, n) for n, p in enumerate(prompts)]
        return concurrently(self._one, jobs, len(jobs))


def _play(bfcl, tokenizer, tasks, loop, salt=0, groups=1, slow=0.01, **config):
    """One batch of G rollouts of each task, played by `loop`; the episodes and the batch's wall time."""
    cfg = RolloutConfig(batch_size=len(tasks) * groups, group_size=groups, episode_loop=loop, embedding=False,
                        max_steps_per_turn=6, **config)
    engine = build_engine(Served(tokenizer, tasks, slow=slow, salt=salt), bfcl, cfg)
    started = time.perf_counter()
    episodes = engine.run_batch([(t, g) for t in tasks for g in range(groups)])
    return episodes, time.perf_counter() - started


def _facts(episodes, mode):
    """Everything stored of each episode but its clocks, and every generation's text, role and place."""
    rows = [{k: v for k, v in score(ep, mode, "rollout").items() if k not in TIMING} for ep in episodes]
    gens = [[(g.role, g.turn, g.turn_step, g.call_index, g.gen.text) for g in ep.generations] for ep in episodes]
    private = [[{k: v for k, v in m.items() if k not in TIMING} for m in ep.memories + ep.imagined]
               for ep in episodes]
    return rows, gens, [ep.calls for ep in episodes], private


@pytest.fixture(scope="module")
def tasks(bfcl):
    return bfcl.load_tasks("multi_turn_base", "test", limit=4)


@pytest.fixture(scope="module")
def tok():
    return build_tiny_tokenizer()  # the tiny model's; its weights are not needed


@pytest.mark.parametrize("mode", ["real", "rehearse"])
def test_greedy_per_episode_plays_the_lockstep_episodes(bfcl, tok, tasks, mode):
    lockstep, _ = _play(bfcl, tok, tasks, "lockstep", mode=mode)
    each, _ = _play(bfcl, tok, tasks, "per_episode", mode=mode)
    assert _facts(each, mode) == _facts(lockstep, mode)
    assert any(ep.texts.count("I cannot do that.") for ep in each)  # the episodes left the reference somewhere
    assert len({len(ep.generations) for ep in each}) > 1  # and are of different lengths: some finished first


def test_private_rehearsal_runs_beside_the_other_episodes(bfcl, tok, tasks):
    """Greedy imagined attempts and summaries: each episode's memories, as lock-step wrote them."""
    private = PrivateOptions(mode="parallel", budget=2, temperature=0.0)
    lockstep, _ = _play(bfcl, tok, tasks[:3], "lockstep", private=private)
    each, _ = _play(bfcl, tok, tasks[:3], "per_episode", private=private)
    assert _facts(each, "real") == _facts(lockstep, "real")
    assert all(ep.memories and ep.imagined for ep in each)


def test_sampled_episodes_do_not_depend_on_thread_timing(bfcl, tok, tasks):
    """Two per-episode runs whose requests take other latencies (so the threads interleave otherwise) draw the same
    seeds per episode and play the same episodes; drawn from one counter, as lock-step draws, they would not."""
    # a Dyna mix, a shadow of some episodes, decision forks and imagined attempts: every draw a world makes, and
    # seeds drawn by private rehearsal's own sampler, beside the episode's
    sampled = {"temperature": 1.0, "mode": "rehearse", "real_fraction": 0.5, "shadow_fraction": 0.5,
               "decision_sample": 0.5, "private": PrivateOptions(mode="parallel", budget=1, max_steps=3)}
    first, _ = _play(bfcl, tok, tasks[:3], "per_episode", salt=0, groups=2, **sampled)
    second, _ = _play(bfcl, tok, tasks[:3], "per_episode", salt=1, groups=2, **sampled)
    assert _facts(first, "rehearse") == _facts(second, "rehearse")
    assert [ep.pairs for ep in first] == [ep.pairs for ep in second]
    a, b = (ep for ep in first if ep.task is first[0].task)  # a group's two rollouts drew different seeds
    assert [g.gen.text for g in a.generations] != [g.gen.text for g in b.generations]


def test_the_timing_test_can_fail(bfcl, tok, tasks, monkeypatch):
    """The control of the test above: without episode streams the seeds follow the scheduler, and episodes differ."""
    monkeypatch.setattr(streams, "current", lambda: None)
    sampled = {"temperature": 1.0, "mode": "rehearse"}
    first, _ = _play(bfcl, tok, tasks[:3], "per_episode", salt=0, groups=2, **sampled)
    second, _ = _play(bfcl, tok, tasks[:3], "per_episode", salt=1, groups=2, **sampled)
    assert _facts(first, "rehearse") != _facts(second, "rehearse")


def test_uneven_latencies_leave_no_episode_idle(bfcl, tok, tasks):
    """Lock-step holds every episode for each step's slowest request; per-episode does not: less wall time, and a
    smaller idle share of episode slots (orderings only: the machine's load moves every number)."""
    lockstep, lock_wall = _play(bfcl, tok, tasks, "lockstep", slow=0.06, mode="rehearse")
    each, each_wall = _play(bfcl, tok, tasks, "per_episode", slow=0.06, mode="rehearse")
    assert each_wall < lock_wall
    assert idle_share(each) < idle_share(lockstep)
    assert all(ep.wait_s > 0 for ep in lockstep)
    # of it, requests done first that waited for their call's slowest one (per episode: only for a thread switch)
    held = [sum(g.gen.held_s for ep in played for g in ep.generations) for played in (each, lockstep)]
    assert held[0] < held[1]


def test_the_in_process_backend_plays_per_episode_behind_a_queue(bfcl, tiny, tasks):
    """per_episode on the HF backend (refused before): the episodes' calls queue (`policy.queued`), greedy ones
    that met run as one call, and the episodes are lock-step's. A training config takes it too."""
    from envace.policy.queued import Queued

    model, tok = tiny
    cfg = RolloutConfig(batch_size=3, embedding=False, max_steps_per_turn=3, max_new_tokens=8)
    played = {}
    for loop in ("lockstep", "per_episode"):
        engine = build_engine(HFBackend(model, tok), bfcl, replace(cfg, episode_loop=loop))
        played[loop] = engine.run_batch([(t, 0) for t in tasks[:3]]), engine.sampler
    (lockstep, _), (each, sampler) = played["lockstep"], played["per_episode"]
    assert _facts(each, "real") == _facts(lockstep, "real")
    queue = sampler.backend
    assert isinstance(queue, Queued) and queue.batches < sampler.calls  # calls that met ran together
    TrainConfig(model="tiny", rollout=replace(TrainConfig().rollout, episode_loop="per_episode"))


def test_a_served_per_episode_run_builds_its_grpo_pool_in_process(tiny, bfcl):
    """GRPO's pool is probed for rows that fit the packing budget by rendering each unit's first prompt with the
    trainer's own model, in this process: it never generates, so a run whose actors play per episode on served
    backends gets its pool (it was refused, as if the probe would play, on the Ray path and in one process)."""
    from envace.training.pool import grpo_pool

    model, tok = tiny
    cfg = TrainConfig(model="tiny", serving={"servers": "http://127.0.0.1:1/v1?model=m"},
                      packing={"max_tokens": 8192}, sft={"tasks": 0}, grpo={"tasks_per_step": 1, "tasks": 2},
                      rollout=replace(TrainConfig().rollout, episode_loop="per_episode", limit=None))
    tasks = bfcl.load_tasks("multi_turn_base", "train", limit=4)
    resolved, pool = grpo_pool(cfg, bfcl, tasks, None, model, tok, lambda line: None)
    assert pool and resolved.rollout.episode_loop == "per_episode"  # the actors' loop is the config's
