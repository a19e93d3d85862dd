"""A seeded tiny training run reduced to what must not change when the training code is restructured.

`python tests/golden.py` writes `tests/fixtures/golden/`: the digest of two seeded runs on the tiny model (the
synchronous loop and staleness 1, SFT, three GRPO steps, evaluations, the final checkpoint), and a store
holding one run of the same config stopped after two steps, to be resumed by later code
(`tests/test_golden_run.py`). The digest keeps every metric except wall times and clocks, every stored
generation's tokens, reward, advantage and whether it was trained, every episode's scores, and a fingerprint of
the checkpoint's tensors.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from pathlib import Path

FIXTURE = Path(__file__).with_name("fixtures") / "golden"

# Small enough for seconds on the tiny model, wide enough to pass SFT, both roles' GRPO, LoRA, an evaluation,
# state.pt every step and the final merged checkpoint.
CONFIG = """\
[train]
model = "tiny"

[train.policy]
lora = true
lora_rank = 4

[train.sft]
tasks = 1
epochs = 1
lr = 1e-2
rows_per_step = 8

[train.grpo]
steps = {steps}
tasks_per_step = 1
lr = 1e-3
max_staleness = {staleness}
importance_cap = 2.0

[train.eval]
every = 3
limit = 1

[train.rollout]
group_size = 4
max_new_tokens = 8
max_steps_per_turn = 3
shadow_fraction = 1.0
temperature = 1.0

[train.rollout.rehearser]
max_new_tokens = 8
"""


def config(path: Path, steps: int = 3, staleness: int = 0) -> Path:
    path.write_text(CONFIG.format(steps=steps, staleness=staleness))
    return path


def _round(value: float) -> float:
    return float(f"{value:.5g}")


# Another CPU sums in another order (AVX-512 against AVX2 moved a loss from -0.0053685 to -0.0053684): numbers
# may differ in their last rounded digit, so 3 units in the fifth significant digit, relative, are "the same".
REL = 3e-4


def difference(got, expected, where: str = "") -> str | None:
    """Where `got` first differs from `expected` (None when it does not): lists and dicts item by item, floats
    within `REL` of each other, everything else (tokens, ids, names, flags) exactly."""
    if isinstance(expected, float) and isinstance(got, (int, float)) and not isinstance(got, bool):
        return None if abs(got - expected) <= REL * max(abs(got), abs(expected)) else f"{where}: {got} != {expected}"
    if isinstance(expected, list) and isinstance(got, list) and len(got) == len(expected):
        return next((d for i, (g, e) in enumerate(zip(got, expected, strict=True))
                     if (d := difference(g, e, f"{where}[{i}]"))), None)
    if isinstance(expected, dict) and isinstance(got, dict) and sorted(got) == sorted(expected):
        return next((d for k in expected if (d := difference(got[k], expected[k], f"{where}[{k!r}]"))), None)
    return None if got == expected else f"{where}: {got!r} != {expected!r}"


def digest(root: Path, run_id: str) -> dict:
    """What the run stored and saved, without wall times or clocks (names ending `_s` or `_t`)."""
    from envace.store import connect

    con = connect(str(root))
    metrics = con.execute("SELECT phase, step, role, name, value FROM metrics WHERE run_id = ? AND NOT "
                          "regexp_matches(name, '_(s|t)$') AND name NOT LIKE 'actor_%' ORDER BY ALL",
                          [run_id]).fetchall()
    generations = con.execute("SELECT episode_id, role, turn, turn_step, call_index, completion_ids, reward, "
                              "advantage, trained, policy_version FROM generations WHERE run_id = ? ORDER BY "
                              "episode_id, role, turn, turn_step, call_index", [run_id]).fetchall()
    episodes = con.execute("SELECT episode_id, phase, step, task_uid, success, checklist FROM episodes "
                           "WHERE run_id = ? ORDER BY episode_id", [run_id]).fetchall()
    tokens = hashlib.sha256(json.dumps([list(map(str, g)) for g in generations]).encode()).hexdigest()
    return {"metrics": [[p, s, r, n, _round(v)] for p, s, r, n, v in metrics],
            "generations": len(generations), "generations_sha256": tokens,
            "episodes": [[e, p, s, u, bool(ok), _round(c)] for e, p, s, u, ok, c in episodes],
            "checkpoint": fingerprint(root / run_id / "checkpoint")}


def fingerprint(folder: Path) -> dict[str, list[float]]:
    """Per tensor of a saved model: its sum and its sum of squares, rounded (exact files differ in metadata)."""
    from safetensors.torch import load_file

    out = {}
    for path in sorted(folder.glob("*.safetensors")):
        for name, t in sorted(load_file(path).items()):
            t = t.double()
            out[name] = [_round(t.sum().item()), _round((t * t).sum().item())]
    return out


def coin_flip_generation():
    """Patch in-process generation with the reference policy that drops a call half the time (seeded by the
    request): rewards then differ within a group, so GRPO's updates are real, while rows, log-probs, the
    update and the store stay the code under test."""
    import random
    from unittest import mock

    from envace.envs import registry
    from envace.policy.backend import Generation
    from envace.policy.hf import HFBackend
    from envace.policy.scripted import ReferencePolicy

    tasks = registry.get("bfcl").load_tasks("multi_turn_base", "all")
    scripted: dict[int, ReferencePolicy] = {}

    def generate(self, prompts, params):
        policy = scripted.setdefault(id(self.tokenizer), ReferencePolicy(self.tokenizer, tasks))
        rng, out = random.Random(params.seed), []
        for gen in policy.generate(prompts, params):
            if "<tool_call>" in gen.text and rng.random() < 0.5:
                text = "I cannot do that."
                ids = self.tokenizer.encode(text, add_special_tokens=False) + [policy.end]
                gen = Generation(ids, text, "stop")
            out.append(gen)
        return out

    return mock.patch.object(HFBackend, "generate", generate)


def train(toml: Path, root: Path, name: str, *extra: str) -> None:
    from envace.cli import main

    with coin_flip_generation():
        code = main(["train", str(toml), "--root", str(root), "--run-name", name, *extra])
    assert code == 0, f"envace train {toml.name} {name}: exit {code}"


def configs(repo: Path) -> dict[str, dict]:
    """Every `[rollout]` and `[train]` table of `experiments/*.toml`, and the fixture run's stored config, as the
    code resolves them (a model absent from this machine read as `tiny`, as `test_train` checks them). A train
    config's tables are read back into the flat keys the snapshot was taken with (`config.flat`, the inverse of
    the migration map), so the snapshot compares settings, whichever way a file spells them."""
    from dataclasses import asdict

    from envace.config import TRAINER_OWNED, RolloutConfig, TrainConfig, flat, load_toml

    def settings(cls, data: dict) -> dict:
        value = flat(TrainConfig.from_dict(data).resolve()) if cls is TrainConfig else asdict(cls.from_dict(data))
        return json.loads(json.dumps(value, default=str))

    out = {}
    for path in sorted((repo / "experiments").glob("*.toml")):
        raw = load_toml(path)
        for table, cls in (("rollout", RolloutConfig), ("train", TrainConfig)):
            if table in raw:
                data = dict(raw[table])
                if data.get("model", "default") not in ("default", "tiny"):
                    data["model"] = "tiny"
                out[f"{path.name} [{table}]"] = settings(cls, data)
    stored = json.loads((FIXTURE / "store" / "cut" / "run.json").read_text())["config"]
    stored["rollout"] = {k: v for k, v in stored["rollout"].items() if k not in TRAINER_OWNED}  # the trainer's
    out["fixture run.json"] = settings(TrainConfig, stored)
    return out


def write_configs() -> None:
    (FIXTURE / "configs.json").write_text(json.dumps(configs(Path(__file__).resolve().parent.parent), indent=1,
                                                     sort_keys=True) + "\n")


def write() -> None:
    """Run the golden runs with the code as it is and write the fixture."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        root = tmp / "runs"
        train(config(tmp / "sync.toml"), root, "sync")
        train(config(tmp / "ahead.toml", staleness=1), root, "ahead")
        train(config(tmp / "cut.toml", steps=2), root, "cut")
        if FIXTURE.exists():
            shutil.rmtree(FIXTURE)
        (FIXTURE / "store").mkdir(parents=True)
        (FIXTURE / "digest.json").write_text(json.dumps({name: digest(root, name) for name in ("sync", "ahead")},
                                                        indent=1) + "\n")
        shutil.copytree(root / "cut", FIXTURE / "store" / "cut",
                        ignore=shutil.ignore_patterns("checkpoint"))  # resume needs state.pt, not the weights


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    write_configs() if sys.argv[1:] == ["configs"] else write()
