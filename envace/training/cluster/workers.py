"""What runs inside Ray's worker processes: a rollout actor, and one rank of the learner.

Both are plain classes (`ray.remote` wraps them in `driver.py`), and both build what they need from the
config alone: the base model by name, the benchmark from its installed package. What the learner returns
(a policy version's reference, an update's statistics) has every tensor on the CPU (`to_host`): the driver holds
no CUDA tensor; `state.pt` and the checkpoint are files rank 0 writes, streamed to the driver in pieces only where
the ranks do not see the run folder (`LearnerRank.send`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any

import torch

from envace.config import TrainConfig
from envace.pids import alive
from envace.policy.hf import HFBackend
from envace.policy.models import put_weights
from envace.policy.vllm import transient
from envace.training import evaluate
from envace.training.actor import Played, RolloutActor
from envace.training.budget import engine_context, row_budget
from envace.training.checkpoint import pieces, read_state, write_checkpoint, write_learner_state
from envace.training.distributed import Processes
from envace.training.fsdp import full_trainable
from envace.training.grpo import Row
from envace.training.learner import Learner
from envace.training.pool import grpo_pool, seen_groups
from envace.training.served import ServedPolicy
from envace.training.setup import build_policy, heartbeat, policy_model
from envace.training.sft import warm_up


def to_host(obj: Any) -> Any:
    """`obj` with every tensor in it (through dicts, lists and tuples) moved to the CPU: what a rank returns to the
    driver. The driver may run on a node without a GPU, and on one with a GPU it would otherwise hold every kept
    policy version (`grpo.max_staleness` + 1 of them) in that GPU's memory."""
    if isinstance(obj, torch.Tensor):
        return obj.to("cpu")
    if isinstance(obj, dict):
        return {k: to_host(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [to_host(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(to_host(v) for v in obj)
    return obj


def host_copy(cfg: TrainConfig, weights: dict[str, torch.Tensor]) -> torch.nn.Module:
    """The run's model as every rank built it (`policy_model`), in host memory, with `weights` (every trainable
    weight, whole) put in."""
    model, _ = policy_model(cfg, gpu=False)
    put_weights(model, weights.items())
    return model


def see_reserved_gpus() -> str:
    """Make this Ray worker see exactly the GPUs Ray reserved for it, none for a zero-GPU one, and return them
    (`CUDA_VISIBLE_DEVICES`). Ray sets the variable only for a worker granted GPUs (since 2.4x it leaves it alone
    at zero): a CPU actor or rank would otherwise see every GPU of its node, and put its model on one. Called
    first in every worker, before anything initialises CUDA."""
    import ray

    ids = ray.get_runtime_context().get_accelerator_ids().get("GPU", [])
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in ids)
    return os.environ["CUDA_VISIBLE_DEVICES"]


def actor_gpus() -> list[int] | None:
    """Every GPU Ray gave this actor (`ray.actor_gpus` of them, the only ones it sees): its server's, tensor
    parallel over all of them; None on a CPU."""
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return list(range(count)) or None


def _node() -> str:
    import ray

    return ray.get_runtime_context().get_node_id()


ACTOR_FOLDER = "envace-actor"  # + "<index>-pid<pid>-<random>", in the node's temporary folder
STATE_FOLDER = "envace-state"  # + "-pid<pid>-<random>": state.pt or the checkpoint on its way to or from the driver


def node_folder(prefix: str, tag: str = "") -> Path:
    """A new folder `<prefix><tag>-pid<pid>-<random>` in this node's temporary folder, once the `prefix` folders of
    processes that are gone are removed (`sweep_folders`)."""
    sweep_folders(prefix)
    return Path(tempfile.mkdtemp(prefix=f"{prefix}{tag}-pid{os.getpid()}-"))


def sweep_folders(prefix: str, under: str | Path | None = None) -> list[Path]:
    """Remove the folders named `<prefix>…-pid<pid>-…` whose process is gone: one killed cannot remove its own (an
    actor's `close()` never ran; a rank's state was mid-way to a driver that died). Each actor that starts on a node
    sweeps the actors' (a killed actor's adapters last until the next one starts), each state sent the states'."""
    swept = []
    for folder in Path(under or tempfile.gettempdir()).glob(f"{prefix}*-pid*-*"):
        pid = folder.name.split("-pid", 1)[1].split("-", 1)[0]
        if pid.isdigit() and not alive(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)
            swept.append(folder)
    return swept


class ActorWorker:
    """Rollout actor `index`: a `RolloutActor` on its own copy of the policy (and its own vLLM server with
    `rollout.backend = vllm`). It plays only with the version the driver asks for: a restarted actor holds
    none, answers None, and the driver sends the weights again. It plays several chunks at once (the dispatcher
    keeps `ray.in_flight` episodes in flight: the actor is made with that many calls at a time), all of one version:
    the scheduler sends a new one only to an actor with nothing in flight."""

    def __init__(self, cfg: TrainConfig, index: int) -> None:
        see_reserved_gpus()
        serves = cfg.rollout.backend == "vllm"
        # Beside a vLLM server the model only carries the weights the server loads: host memory, not the GPU's
        policy = build_policy(cfg, threads=cfg.ray.actor_cpus, gpu=not serves)
        model, tok, benchmark, bank = policy.model, policy.tok, policy.benchmark, policy.bank
        served, self.folder = None, None
        if serves:  # the server's log and pushed adapters: this actor's own folder
            self.folder = node_folder(ACTOR_FOLDER, str(index))
            served = ServedPolicy.start(cfg.model, "", cfg.policy.lora_rank if cfg.policy.lora else None,
                                        cfg.policy.dtype, tok, self.folder, print, devices=actor_gpus(),
                                        gpu_memory=cfg.serving.share(shares_gpu=False))  # the actor's own GPUs
        backend = served.backend if served else HFBackend(model, tok, cfg.rollout.max_batch_tokens)
        self.cfg, self.index, self.benchmark, self.bank, self.backend = cfg, index, benchmark, bank, backend
        self.actor = RolloutActor(cfg, benchmark, bank, model.eval(), backend, served, self._progress, index)
        self.actor.version = -1
        self.loading = threading.Lock()  # the chunks started together take their version in once

    def _progress(self, what: str):
        return heartbeat(lambda line: print(f"actor {self.index}:{line}", flush=True), what)

    def where(self) -> tuple[str, int]:
        """(Ray node id, process id)."""
        return _node(), os.getpid()

    def load(self, weights: dict[str, torch.Tensor], version: int) -> float:
        """Version `version`, sent as CPU tensors: `RolloutActor.load` copies each into its parameter (`copy_`, onto
        the generator's device), so no CPU copy outlives the call."""
        with self.loading:
            if self.actor.version == version:  # taken already (offered mid-chunk, or by a chunk beside this one)
                return 0.0
            with self._closed_on_error():
                seconds = self.actor.load(weights, version)
            self.backend.clear_caches()  # what it cached belongs to the weights before
            return seconds

    def capacity(self) -> int | None:
        """Episodes this actor's vLLM server holds at once, each at the longest context the actor lets one grow to
        (the engine's: the server's `max_model_len`, never past a training row's budget): its KV cache's tokens
        (`Server.kv_cache_tokens`) ÷ that context, so even episodes all at their longest are never preempted.
        For `ray.in_flight = auto`; None without a server, or where it does not say its KV cache."""
        served = self.actor.served
        tokens = served.servers[0].kv_cache_tokens() if served is not None and served.servers else None
        context = engine_context(getattr(self.backend, "max_context", None), row_budget(self.cfg))
        return max(1, tokens // context) if tokens and context else None

    def offer(self, weights: dict[str, torch.Tensor], version: int) -> None:
        """Partial rollouts: a version taken between two backend calls of the chunk in flight (this call runs beside
        `play`: the actor is made with `max_concurrency = 2`)."""
        self.actor.offer(weights, version)

    @contextlib.contextmanager
    def _closed_on_error(self):
        """A call that raises closes the actor first: the driver kills it next (to be restarted), and no Python
        cleanup runs in a killed process, so its server (dead, perhaps, with its engine processes alive) goes
        now."""
        try:
            yield
        except BaseException as exc:
            if transient(exc) or not isinstance(exc, Exception):  # a deterministic failure leaves the server up
                self.close()
            raise

    def close(self) -> None:
        """Stop the vLLM server and remove the actor's folder (before the driver lets the actor go)."""
        if self.actor.served is not None:
            self.actor.served.close()
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)

    def _holds(self, version: int, weights: list | None, exact: bool = False) -> float | None:
        """Seconds spent taking `version` in from `weights` (`[reference]`, when the driver sends it); None when
        this actor does not hold it and was sent nothing."""
        import ray

        held = self.actor.version == version if exact else self.actor.holds(version)
        if held:
            return 0.0
        if weights is None:
            return None
        return self.load(ray.get(weights[0]) if isinstance(weights[0], ray.ObjectRef) else weights[0], version)

    def play(self, step: int, tasks: list, version: int, chunk: int = 0, weights: list | None = None) -> Played | None:
        """Chunk `chunk` of step `step` (`dispatch.Dispatcher`), sampled from the seeds of `rollout_at(step, chunk)`:
        the chunk's, not this actor's, so a chunk plays the same on any actor. `weights`: `[reference]` to version
        `version` when the scheduler has it load that version first. None when it neither holds nor was sent it."""
        loaded = self._holds(version, weights)
        if loaded is None:
            return None
        with self._closed_on_error():
            played = self.actor.play(step, tasks, stream=chunk, clear=False)
        played.load_s = loaded
        return played

    def evaluate(self, updates: int, version: int, index: int, count: int, weights: list | None = None):
        if self._holds(version, weights, exact=True) is None:
            return None
        with self._closed_on_error():
            return evaluate.play(self.cfg, self.benchmark, self.bank, self.actor.generator, self.backend, updates,
                                 lambda tasks: list(tasks[index::count]))


class LearnerRank:
    """Rank `rank` of `world`: the trained weights and optimiser (`learner.Learner`) in a torch.distributed
    group that `join` forms (rank 0's `endpoint` first)."""

    def __init__(self, cfg: TrainConfig, rank: int, world: int) -> None:
        see_reserved_gpus()
        self.cfg, self.rank, self.world = cfg, rank, world

    def where(self) -> tuple[str, int]:
        return _node(), os.getpid()

    def endpoint(self) -> tuple[str, int]:
        """This node's address and a free port: where the group's rendezvous listens (rank 0)."""
        import socket

        import ray

        with socket.socket() as sock:
            sock.bind(("", 0))
            return ray.util.get_node_ip_address(), sock.getsockname()[1]

    def join(self, host: str, port: int) -> tuple[TrainConfig, list] | None:
        """Form the group, build the policy and its optimiser; rank 0 returns the resolved config and the
        GRPO pool (`train.grpo_pool`)."""
        cfg = self.cfg
        gpus = cfg.ray.learner_gpus > 0  # Ray shows each rank only its own GPU: cuda:0
        os.environ.update(RANK=str(self.rank), WORLD_SIZE=str(self.world), MASTER_ADDR=host, MASTER_PORT=str(port),
                          LOCAL_RANK="0" if gpus else str(self.rank), LOCAL_WORLD_SIZE="1" if gpus else str(self.world))
        self.policy = policy = build_policy(cfg, threads=cfg.ray.learner_cpus)
        self.procs = Processes(cfg.distributed.fsdp, timeout_s=cfg.distributed.timeout_s,
                               reduce_every_pass=cfg.distributed.reduce_every_pass)
        pool = grpo_pool(cfg, policy.benchmark, policy.train_tasks, policy.bank, policy.model, policy.tok,
                         self._say) if self.rank == 0 else None
        # a rank never generates (the actors do): under FSDP it keeps its shards and no whole copy (`checkpoint`)
        self.generator = self.procs.prepare(policy.model, generates=False)
        self.learner = Learner(cfg, policy.model, self.procs, policy.tok.pad_token_id)
        return pool

    def _say(self, line: str) -> None:
        if self.rank == 0:
            print(line, flush=True)

    def sft(self) -> tuple[dict[str, float], list[tuple[int, dict[str, float]]]]:
        """SFT (`sft.warm_up`) through this rank's learner; its summary and rank 0's per-step metrics."""
        logged: list[tuple[int, dict[str, float]]] = []
        summary = warm_up(self.cfg, self.policy, self.learner, lambda step, values: logged.append((step, values)),
                          self._say)
        return to_host((summary, logged))

    def update(self, rows: list[Row], advantages: list[float]) -> dict[str, Any]:
        return to_host(self.learner.update(rows, advantages))

    def host_weights(self) -> dict[str, torch.Tensor] | None:
        """The policy version to publish, on the CPU (`to_host`); rank 0's (every rank must call under FSDP)."""
        weights = self.learner.weights()
        return to_host(weights) if self.rank == 0 else None

    def weights(self) -> list | None:
        """`host_weights` put in Ray's object store by this rank: [its reference]. Ray hands a reference nested in
        a return value over as it is, so the driver passes it on to the actors, which read the weights from the
        store; they never cross the driver's memory."""
        import ray

        weights = self.host_weights()
        return None if weights is None else [ray.put(weights)]

    def sees(self, probe: str, token: str) -> bool:
        """Whether `probe`, a file the driver has just written in the run folder, holds `token` here too: the
        folder is shared (one machine, or a filesystem every node mounts). Where every rank sees it, rank 0 writes
        `state.pt` and the checkpoint there itself and nothing of either passes through the driver."""
        try:
            return Path(probe).read_text() == token
        except OSError:
            return False

    def save_state(self, path: str | None, next_step: int, versions: dict) -> str | None:
        """`state.pt` at `path` (`checkpoint.write_learner_state`, as the single-process loop saves it: under FSDP
        every rank writes its own shards, else rank 0 the gathered state): the kept policy versions are references
        into the object store (`weights`), read here. `path` None (a rank does not see the run folder, `sees`):
        rank 0 writes the state whole (FSDP's gathered) in a folder of its own node, and returns that folder for
        the driver to take in pieces (`send`)."""
        import ray

        whole = path is None
        here = node_folder(STATE_FOLDER) if whole and self.rank == 0 else None
        # a whole state is written by rank 0 alone: the other ranks only take part in gathering it
        target = here / "state.pt" if here else Path(path or os.devnull)

        def kept() -> dict:
            return to_host({v: ray.get(w) if isinstance(w, ray.ObjectRef) else w for v, w in versions.items()})

        write_learner_state(self.learner, self.procs, target, next_step, kept, shards=self.procs.fsdp and not whole)
        return str(here) if here else None

    def send(self, folder: str):
        """The files of `folder` on this rank's node (`save_state`'s, `checkpoint`'s), streamed to the driver in
        pieces (`checkpoint.pieces`), so neither side holds them whole; the folder removed after."""
        yield from pieces(Path(folder))

    def load_state(self, path: str) -> tuple[int, dict] | None:
        """Every rank reads `state.pt` at `path` (`save_state`'s) onto its own device (`Learner.load`:
        `load_state_dict` copies the weights into the parameters, `Optimizer.load_state_dict` casts each moment to
        its parameter's device, FSDP's `set_*_state_dict` scatters them into the shards); rank 0 returns the next
        step and the kept versions, put in the object store for the driver to hand the actors."""
        import ray

        next_step, versions = read_state(Path(path), self.learner)
        return None if self.rank != 0 else (next_step, {v: ray.put(w) for v, w in versions.items()})

    def receive_begin(self) -> None:
        """Open `state.pt` in a folder of this node for the pieces the driver sends next (a rank that does not see
        the run folder, `RemoteLearner.send_state`); a folder left by an earlier try is replaced."""
        self._drop_received()
        self._incoming = node_folder(STATE_FOLDER)
        self._incoming_file = (self._incoming / "state.pt").open("wb")

    def receive(self, piece: bytes) -> None:
        """One piece of `state.pt`, written as it comes (Ray runs a rank's calls in the order they were sent)."""
        self._incoming_file.write(piece)

    def load_received(self) -> tuple[int, dict] | None:
        """The `state.pt` received, read as `load_state` reads it, then removed."""
        self._incoming_file.close()
        try:
            return self.load_state(str(self._incoming / "state.pt"))
        finally:
            self._drop_received()

    def _drop_received(self) -> None:
        if getattr(self, "_incoming_file", None) is not None:
            self._incoming_file.close()
            shutil.rmtree(self._incoming, ignore_errors=True)
        self._incoming, self._incoming_file = None, None

    def checkpoint(self, out: str | None = None) -> str | None:
        """The final weights (LoRA merged) and tokenizer as `save_pretrained` writes them, by rank 0: written as
        `out` where it sees the run folder (`sees`), else in a folder of its own node, returned for the driver to
        take in pieces (`send`).
        Under FSDP (a collective) the trained weights are gathered one at a time into host memory on rank 0 and
        put into a host copy of the base model built for the save: no rank holds a whole model on its device."""
        generator = self.generator
        if generator is None:
            weights = full_trainable(self.learner.model, self.rank == 0)
            generator = host_copy(self.cfg, weights) if self.rank == 0 else None
        if self.rank != 0:
            return None
        seen = seen_groups(self.cfg, self.policy.train_tasks)
        if out is not None:
            return str(write_checkpoint(Path(out), generator, self.policy.tok, seen, self.cfg.policy.lora))
        folder = node_folder(STATE_FOLDER)
        write_checkpoint(folder / "checkpoint", generator, self.policy.tok, seen, self.cfg.policy.lora)
        return str(folder)

    def leave(self) -> None:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
