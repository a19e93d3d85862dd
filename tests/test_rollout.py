from envace.build import build_engine
from envace.config import RolloutConfig
from envace.jobs import play


def _tasks(bfcl, n, category="multi_turn_base"):
    return bfcl.load_tasks(category, "test", limit=n)


def test_reference_policy_succeeds_end_to_end(bfcl, reference_policy):
    """Engine + real environment + official checker: replaying the answers must score 100%."""
    for category in ("multi_turn_base", "multi_turn_miss_func"):
        tasks = _tasks(bfcl, 3, category)
        policy = reference_policy(tasks)
        summary = play(RolloutConfig(category=category, batch_size=3), None, policy, tasks=tasks)
        assert summary.successes == summary.episodes == 3
        assert summary.terminations == {"completed": 3}
        assert summary.calls == sum(len(turn) for t in tasks for turn in t.reference)


def test_one_backend_call_per_step(bfcl, reference_policy):
    tasks = _tasks(bfcl, 4)
    policy = reference_policy(tasks)
    engine = build_engine(policy, bfcl, RolloutConfig(batch_size=4))
    episodes = engine.run_batch([(t, 0) for t in tasks])
    # every episode advances at each call, so the batch needs as many calls as its longest episode
    assert policy.calls == max(len(ep.generations) for ep in episodes)
    assert len(policy.prompts) == sum(len(ep.generations) for ep in episodes)


def test_token_in_token_out(bfcl, tiny_backend):
    """The prompt of step k+1 starts with the exact ids of step k's prompt and completion."""
    seen = []
    generate = tiny_backend.generate

    def recording(prompts, params):
        gens = generate(prompts, params)
        seen.extend(zip(prompts, gens, strict=True))
        return gens

    tiny_backend.generate = recording
    tasks = _tasks(bfcl, 2)
    cfg = RolloutConfig(model="tiny", max_new_tokens=12, batch_size=2)
    episodes = build_engine(tiny_backend, bfcl, cfg).run_batch([(t, 0) for t in tasks])
    followed = 0
    for i, (prompt, gen) in enumerate(seen):
        later = [p for p, _ in seen[i + 1:] if p[: len(prompt)] == prompt]
        if later:
            assert later[0][: len(prompt) + len(gen.ids)] == prompt + gen.ids
            followed += 1
    assert followed == len(seen) - len(tasks)  # every prompt but each episode's last one is continued
    for ep in episodes:
        for g in ep.generations:
            assert ep.ids[g.prompt_len: g.prompt_len + len(g.gen.ids)] == g.gen.ids


def test_parse_errors_are_recorded_and_follow_the_rule(bfcl, reference_policy):
    tasks = _tasks(bfcl, 1)
    bad = '<tool_call>{"name": "cd", "arguments": {</tool_call>'
    for rule, termination, messages in (("end_turn", "completed", len(tasks[0].user_turns)),
                                        ("end_episode", "parse_error", 1)):
        engine = build_engine(reference_policy(tasks, corrupt=bad), bfcl, RolloutConfig(on_parse_error=rule))
        (ep,) = engine.run_batch([(tasks[0], 0)])
        assert ep.termination == termination and len(ep.generations) == messages
        assert all(g.parse_error == "json_decode_error" and g.gen.text == bad for g in ep.generations)


def test_step_limit_and_context_limit(bfcl, reference_policy, tiny_backend):
    tasks = _tasks(bfcl, 1)
    loop = '<tool_call>{"name": "ls", "arguments": {}}</tool_call>'
    engine = build_engine(reference_policy(tasks, corrupt=loop), bfcl, RolloutConfig(max_steps_per_turn=3))
    (ep,) = engine.run_batch([(tasks[0], 0)])
    assert ep.termination == "step_limit" and len(ep.calls) == 3
    assert not ep.env.score(ep.task, ep.steps).success
    small = build_engine(tiny_backend, bfcl, RolloutConfig(max_new_tokens=8), max_context=len(ep.ids[:10]))
    (cut,) = small.run_batch([(tasks[0], 0)])
    assert cut.termination == "context_exceeded" and cut.generations == []


def test_group_rollouts_are_separate_episodes(bfcl, reference_policy):
    tasks = _tasks(bfcl, 1)
    engine = build_engine(reference_policy(tasks), bfcl, RolloutConfig(group_size=3, batch_size=8))
    (batch,) = list(engine.batches(tasks))
    episodes = engine.run_batch(batch)
    assert [ep.group_index for ep in episodes] == [0, 1, 2]
    assert len({id(ep.env) for ep in episodes}) == 3


def test_compact_tool_docs_shrink_the_prompt_and_keep_every_tool(bfcl, tiny):
    from envace.engine.prompts import ChatRenderer, compact_tool

    task = bfcl.load_tasks("multi_turn_base", "train", limit=1)[0]
    full, compact = ChatRenderer(tiny[1]), ChatRenderer(tiny[1], "compact")
    assert len(compact.opening(task)) < 0.6 * len(full.opening(task))
    text = tiny[1].decode(compact.opening(task))
    assert all(t["function"]["name"] in text for t in task.tools)
    cd = compact_tool(next(t for t in task.tools if t["function"]["name"] == "cd"))
    assert cd == {"name": "cd", "description": "Change the current working directory to the specified folder.",
                  "arguments": {"folder": "string"}}


def test_each_episode_stores_its_own_wall_time_not_its_batchs(bfcl, reference_policy, tmp_path):
    """In one batch, an episode whose caller answers every turn in words ends (and is timed) before one that
    plays every gold call of every turn; each stores its own start and end on the run's clock."""
    import time

    from envace.record import score

    tasks = sorted(_tasks(bfcl, 8), key=lambda t: sum(len(turn) for turn in t.reference))
    short, long = tasks[0], tasks[-1]
    policy = reference_policy([short, long])
    generate = policy.generate

    def slow(prompts, params):  # every backend call takes a while, as a model's would: long enough (~2.5 s for the
        time.sleep(0.25)  # long episode) that a pause of the test process (one whole-suite run saw the one-message
        return generate(prompts, params)  # episode timed at 0.98 s against 0.56 s with 0.05 s here) cannot flip them

    policy.generate = slow
    quits = reference_policy([short], corrupt="I cannot help with that.")
    first = short.user_turns[0]

    def mixed(prompts, params):  # the short task's caller answers in words: its episode ends after one message
        out = slow(prompts, params)
        return [quits.generate([p], params)[0] if first in policy.tokenizer.decode(p) else g
                for p, g in zip(prompts, out, strict=True)]

    policy.generate = mixed
    engine = build_engine(policy, bfcl, RolloutConfig(batch_size=2, max_steps_per_turn=8))
    quick, slow_ep = engine.run_batch([(short, 0), (long, 0)])
    assert len(quick.generations) < len(slow_ep.generations)
    rows = [score(ep, "real", "rollout") for ep in (slow_ep, quick)][::-1]  # the quick one scored last
    assert rows[0]["wall_s"] < rows[1]["wall_s"]
    assert rows[0]["ended_at"] < rows[1]["ended_at"] and abs(rows[0]["started_at"] - rows[1]["started_at"]) < 1.0
    assert rows[1]["wall_s"] >= 0.05 * len([g for g in slow_ep.generations if g.role == "caller"]) * 0.9
