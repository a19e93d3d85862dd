import pytest

from envace.policy.backend import SamplingParams
from envace.policy.hf import HFBackend
from envace.policy.prefix_cache import PrefixCache


def _prompts(tok):
    texts = ["<|im_start|>user\nlist the files<|im_end|>\n<|im_start|>assistant\n",
             "<|im_start|>user\nmove report.pdf to temp please<|im_end|>\n<|im_start|>assistant\n"]
    return [tok.encode(t, add_special_tokens=False) for t in texts]


def test_cached_and_padded_strategies_agree_greedily(tiny):
    model, tok = tiny
    params = SamplingParams(max_new_tokens=12, temperature=0.0)
    cached = HFBackend(model, tok, prefix_cache=True).generate(_prompts(tok), params)
    padded = HFBackend(model, tok, prefix_cache=False).generate(_prompts(tok), params)
    assert [g.ids for g in cached] == [g.ids for g in padded]
    assert all(g.finish in ("stop", "length") and len(g.ids) <= 12 for g in cached)


def test_prefix_cache_continues_an_earlier_prompt(tiny):
    model, tok = tiny
    backend = HFBackend(model, tok)
    params = SamplingParams(max_new_tokens=6, temperature=0.0)
    first = _prompts(tok)[0]
    (gen,) = backend.generate([first], params)
    follow = first + gen.ids + tok.encode("\n<|im_start|>user\nand now?<|im_end|>\n<|im_start|>assistant\n",
                                          add_special_tokens=False)
    (cached,) = backend.generate([follow], params)
    assert backend.cache.hits == 1
    (fresh,) = HFBackend(model, tok, prefix_cache=False).generate([follow], params)
    assert cached.ids == fresh.ids  # reusing the cache changes nothing but the cost


def test_logprobs_are_one_per_token_and_sampling_is_seeded(tiny):
    model, tok = tiny
    backend = HFBackend(model, tok)
    params = SamplingParams(max_new_tokens=8, temperature=1.0, seed=7, logprobs=True)
    a = backend.generate(_prompts(tok), params)
    backend.clear_caches()
    b = backend.generate(_prompts(tok), params)
    assert [g.ids for g in a] == [g.ids for g in b]
    for g in a:
        assert len(g.logprobs) == len(g.ids) and all(lp <= 0.0 for lp in g.logprobs)


def test_shared_prefix_is_copied_not_stolen():
    class FakeCache:
        def __init__(self, n):
            self.n = n

        def get_seq_length(self):
            return self.n

        def crop(self, delta):
            self.n += delta

    cache = PrefixCache(min_shared=2)
    cache.put([1, 2, 3, 4, 5], FakeCache(5))
    copy = cache.take([1, 2, 3, 9])  # shares 3 tokens with the stored entry
    assert copy.n == 3 and cache.shared == 1
    own = cache.take([1, 2, 3, 4, 5, 6])  # the stored entry's own continuation takes it over
    assert own.n == 5 and cache.hits == 1 and cache.take([1, 2, 3, 4, 5, 6]) is None


def test_the_strategy_follows_the_device(tiny):
    """The prefix cache where it measurably wins (a CPU); padded batches on an accelerator."""
    import torch

    from envace.policy.hf import prefers_prefix_cache

    model, tok = tiny
    assert prefers_prefix_cache(torch.device("cpu")) and prefers_prefix_cache("cpu")
    assert not prefers_prefix_cache(torch.device("cuda", 0)) and not prefers_prefix_cache("cuda")
    assert HFBackend(model, tok).caches is not None  # the tiny model lives on the CPU here

    class OnAccelerator(torch.nn.Module):  # the device a model reports decides; nothing runs on it
        device = torch.device("cuda", 0)
        config = model.config

    assert HFBackend(OnAccelerator(), tok).caches is None


def test_each_generation_records_the_sampling_parameters_it_was_drawn_at(tiny, tmp_path):
    """The sampler stamps every generation with its temperature and top-p (greedy: temperature 0), the training rows
    carry them to the learner (`grpo.aligned`), and the store keeps them per generation."""
    from envace.cli import main
    from envace.engine.sampler import Sampler
    from envace.store import connect

    model, tok = tiny
    sampler = Sampler(HFBackend(model, tok), temperature=0.7, top_p=0.9, seed=1)
    assert {(g.temperature, g.top_p) for g in sampler(_prompts(tok), 4)} == {(0.7, 0.9)}
    assert {(g.temperature, g.top_p) for g in sampler(_prompts(tok), 4, greedy=True)} == {(0.0, 0.9)}
    assert main(["rollout", "--model", "tiny", "--mode", "real+shadow", "--limit", "1", "--max-new-tokens", "4",
                 "--max-steps-per-turn", "1", "--temperature", "0.5", "--top-p", "0.8", "--root", str(tmp_path),
                 "--run-name", "warm"]) == 0
    stored = connect(tmp_path).execute("SELECT DISTINCT role, temperature, top_p FROM generations").fetchall()
    assert stored and all(t == 0.5 and p == pytest.approx(0.8) for role, t, p in stored if role == "caller"), stored
