"""Imported by every Python process started while this folder is on PYTHONPATH: the Ray workers of
tests/test_ray.py (the simulated cluster's nodes are started with it; the test process itself is not).

- `ENVACE_TEST_HALF_GOLD=1`: the tiny model's messages are half swapped for the gold ones (`half_gold`), as
  tests/test_staleness.py does in-process, so that rewards differ within a group and updates happen.
- `ENVACE_TEST_FORBIDDEN=DIR`: any file operation under DIR (the driver's runs folder) raises: no worker may
  read or write a path of the driver's.
"""

import os
import random
import sys


def half_gold(backend_class) -> None:
    """Swap each generated message for the reference policy's with probability 1/2 (seeded by the request)."""
    original = backend_class.generate

    def generate(self, prompts, params):
        from envace.envs import registry
        from envace.policy.scripted import ReferencePolicy

        if not hasattr(self, "_gold"):
            self._gold = ReferencePolicy(self.tokenizer, registry.get("bfcl").load_tasks("multi_turn_base", "train"))
        sampled, gold = original(self, prompts, params), self._gold.generate(prompts, params)
        rng = random.Random(params.seed)
        return [g if rng.random() < 0.5 else s for s, g in zip(sampled, gold, strict=True)]

    backend_class.generate = generate


if os.environ.get("ENVACE_TEST_HALF_GOLD"):
    from envace.policy.hf import HFBackend

    half_gold(HFBackend)

_forbidden = os.environ.get("ENVACE_TEST_FORBIDDEN")
if _forbidden:
    _EVENTS = {"open", "os.listdir", "os.scandir", "os.mkdir", "os.rename", "os.remove", "os.rmdir", "shutil.rmtree"}

    def _audit(event, args):
        if event in _EVENTS and args and isinstance(args[0], str | bytes | os.PathLike) \
                and os.path.abspath(os.fsdecode(args[0])).startswith(_forbidden):
            raise PermissionError(f"a Ray worker touched the driver's {os.fsdecode(args[0])}")

    sys.addaudithook(_audit)
