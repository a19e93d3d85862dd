"""The transformers backend: batched `generate` on CPU (or one GPU), token ids in and out."""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import replace
from functools import lru_cache

from envace.policy.backend import Generation, SamplingParams
from envace.policy.prefix_cache import PrefixCache


@lru_cache(maxsize=1)
def cache_field() -> str:
    """`generate`'s name for the KV cache, taken and returned: `cache` since transformers 5.2x (`past_key_values`
    deprecated), `past_key_values` in 5.17, the GPU machine's release."""
    from transformers.generation.utils import GenerateDecoderOnlyOutput

    return "cache" if "cache" in GenerateDecoderOnlyOutput.__dataclass_fields__ else "past_key_values"


def prefers_prefix_cache(device) -> bool:
    """One prompt at a time with a shared-prefix cache on a CPU; padded batches on an accelerator."""
    return str(getattr(device, "type", device)) == "cpu"


class HFBackend:
    """Generation with a loaded causal LM, in one of two strategies.

    `prefix_cache=True` (the default on CPU): prompts run one at a time, each continuing the KV cache of
    an earlier prompt that shares its prefix (see `prefix_cache.py`). Measured here: 4 BFCL prompts
    of 3-5k tokens left-padded into one batch took 128 s to prefill (SDPA's masked path) against
    ~11 s each alone, and batched decoding gains little on 2 cores.
    `prefix_cache=False` (the default on a GPU): left-padded micro-batches of at most `max_batch_tokens`
    padded tokens, sorted by length; a GPU decodes a batch about as fast as one sequence.
    """

    def __init__(self, model, tokenizer, max_batch_tokens: int = 32768, prefix_cache: bool | None = None) -> None:
        if prefix_cache is None:
            prefix_cache = prefers_prefix_cache(model.device)
        self.model = model
        self.tokenizer = tokenizer
        self.max_batch_tokens = max_batch_tokens
        # One cache per weight set: keys computed with adapters must never serve the frozen base.
        self.caches = {False: PrefixCache(), True: PrefixCache()} if prefix_cache else None
        self.stop_ids = sorted({tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>")})
        self.max_context: int | None = getattr(model.config, "max_position_embeddings", None)
        self.calls = 0

    @classmethod
    def load(cls, spec: str, max_batch_tokens: int = 32768, prefix_cache: bool | None = None) -> HFBackend:
        """A backend for a model spec (`default`, `tiny`, or a local path); see `envace.policy.models`."""
        from envace.policy.models import load_policy

        model, tokenizer = load_policy(spec)
        return cls(model, tokenizer, max_batch_tokens, prefix_cache)

    @property
    def cache(self) -> PrefixCache | None:
        """The prefix cache of the trained weights."""
        return self.caches[False] if self.caches else None

    def clear_caches(self) -> None:
        for cache in (self.caches or {}).values():
            cache.clear()

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        import torch

        self.calls += 1
        if params.seed is not None:
            torch.manual_seed(params.seed)
        with self._weights(params.frozen):
            return self._generate(prompts, params)

    def _weights(self, frozen: bool):
        if not frozen:
            return nullcontext()
        if not hasattr(self.model, "disable_adapter"):
            raise ValueError("a frozen role needs adapters (LoRA) to switch off")
        return self.model.disable_adapter()

    def _generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        if params.seeds and len(params.seeds) != len(prompts):
            raise ValueError(f"SamplingParams.seeds: one seed per prompt, got {len(params.seeds)} for "
                             f"{len(prompts)} prompts")
        if self.caches is not None:
            return [self._generate_cached(p, _row(params, i)) for i, p in enumerate(prompts)]
        lengths = [len(p) for p in prompts]
        out: list[Generation | None] = [None] * len(prompts)
        for batch in self._micro_batches(sorted(range(len(prompts)), key=lengths.__getitem__), lengths,
                                         params.max_new_tokens):
            rows = replace(params, seeds=tuple(params.seeds[i] for i in batch)) if params.seeds else params
            for i, gen in zip(batch, self._generate_padded([prompts[i] for i in batch], rows), strict=True):
                out[i] = gen
        return [g for g in out if g is not None]

    def _micro_batches(self, order: list[int], lengths: list[int], new_tokens: int) -> list[list[int]]:
        batches: list[list[int]] = []
        for i in order:
            if batches:
                width = max(lengths[j] for j in batches[-1] + [i]) + new_tokens
                if width * (len(batches[-1]) + 1) <= self.max_batch_tokens:
                    batches[-1].append(i)
                    continue
            batches.append([i])
        return batches

    def _run(self, input_ids, attention, params: SamplingParams, cache=None):
        import torch

        # Per-prompt seeds: `RowSampler` draws each row's token from its own generator and hands `generate` a
        # one-hot choice to take greedily; `output_logits` still returns the model's raw logits.
        rows = RowSampler(params) if params.seeds and params.temperature > 0 else None
        sample = params.temperature > 0 and rows is None
        with torch.inference_mode():
            return self.model.generate(
                input_ids=input_ids, attention_mask=attention, **{cache_field(): cache},
                max_new_tokens=params.max_new_tokens, do_sample=sample,
                temperature=params.temperature if sample else None, top_p=params.top_p if sample else None,
                top_k=None, eos_token_id=self.stop_ids, pad_token_id=self.tokenizer.pad_token_id,
                logits_processor=[rows] if rows else None,
                return_dict_in_generate=True, output_logits=params.logprobs)

    def _generate_cached(self, prompt: list[int], params: SamplingParams) -> Generation:
        import torch

        assert self.caches is not None
        cache = self.caches[params.frozen]
        result = self._run(torch.tensor([prompt], device=self.model.device), None, params, cache=cache.take(prompt))
        gen = self._finish(result, len(prompt), 0, params)
        cache.put(prompt + gen.ids, getattr(result, cache_field()))
        return gen

    def _generate_padded(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        import torch

        width = max(len(p) for p in prompts)
        pad = self.tokenizer.pad_token_id
        input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
        attention = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        result = self._run(input_ids.to(self.model.device), attention.to(self.model.device), params)
        return [self._finish(result, width, row, params) for row in range(len(prompts))]

    def _finish(self, result, width: int, row: int, params: SamplingParams) -> Generation:
        """Cut one row's new tokens at its first stop token (kept), decode it, attach logprobs."""
        ids = result.sequences[row, width:].tolist()
        stop_at = next((k for k, t in enumerate(ids) if t in self.stop_ids), None)
        ids = ids if stop_at is None else ids[: stop_at + 1]
        logprobs = None
        if params.logprobs:  # of the model's own distribution, before temperature and top-p (as vLLM reports them)
            import torch

            raw = torch.stack([step[row] for step in result.logits[: len(ids)]]).float().log_softmax(-1)
            logprobs = raw.gather(-1, torch.tensor(ids, device=raw.device).unsqueeze(-1)).squeeze(-1).tolist()
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        return Generation(ids=ids, text=text, finish="length" if stop_at is None else "stop", logprobs=logprobs)


def _row(params: SamplingParams, i: int) -> SamplingParams:
    """Prompt i's settings when it runs alone: its own seed of `params.seeds`."""
    return replace(params, seeds=(params.seeds[i],)) if params.seeds else params


class RowSampler:
    """Samples each row of a batch from its own `torch.Generator` (seeded by `SamplingParams.seeds`), at the
    call's temperature and top-p (nucleus: the smallest set of most likely tokens whose mass reaches `top_p`), and
    returns scores that are −inf but at the chosen token, so greedy decoding takes it. A row's tokens then depend on
    its own logits and seed only, never on which prompts share its batch (HF's sampler draws a whole batch from one
    stream). Rows that already stopped draw too (their tokens are discarded by `generate`)."""

    def __init__(self, params: SamplingParams) -> None:
        self.temperature, self.top_p, self.seeds = params.temperature, params.top_p, params.seeds
        self.generators: list | None = None  # made on the first call, on the logits' device (no copy to the host)

    def __call__(self, input_ids, scores):
        import torch

        if self.generators is None:
            self.generators = [torch.Generator(device=scores.device).manual_seed(int(s) % 2**63) for s in self.seeds]
        probs = torch.softmax(scores.float() / self.temperature, dim=-1)
        if self.top_p < 1.0:
            ranked, order = probs.sort(dim=-1, descending=True)
            outside = ranked.cumsum(-1) - ranked >= self.top_p  # the mass before a token already reaches top-p
            ranked = ranked.masked_fill(outside, 0.0)
            probs = torch.zeros_like(probs).scatter(-1, order, ranked)
        chosen = torch.stack([torch.multinomial(probs[r], 1, generator=g) for r, g in enumerate(self.generators)])
        return torch.full_like(scores, float("-inf")).scatter(-1, chosen, 0.0)
