"""The episode engine: plays every mode (the real environment, the rehearser, a shadow beside either, a Dyna mix),
many episodes batched together: the loop (`rollout.py`), who answers a call (`worlds.py`), mode → world
(`build.py`), simulated users (`user.py`), prompts and sampling (`prompts.py`, `sampler.py`)."""
