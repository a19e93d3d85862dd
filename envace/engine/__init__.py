"""The episode engine: plays every mode (the real environment, the rehearser, a shadow beside either, a Dyna mix),
many episodes batched together: the loop (`rollout.py`; or each episode on its own thread,
`per_episode.py`, with seeds of its own, `streams.py`), who answers a call (`worlds.py`), the rehearser
(`rehearser.py`) and its grounding examples (`examples.py`), simulated users (`user.py`), prompts and sampling
(`prompts.py`, `sampler.py`). Mode → world, and the engine with private rehearsal's hook, is `envace.build`,
above this package."""
