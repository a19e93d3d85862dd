"""Joining a Ray cluster and reserving the actors' and learner ranks' resources, or one clear line why not.

Two placement groups: the actors' (spread as `actor_placement` says: STRICT_SPREAD puts one per node) and the
learner ranks' (PACK: a collective is fastest between ranks on one node). Both are checked against the
cluster's resources before they are asked for, so an impossible placement is refused at once instead of
waiting for resources that will never come. `reserved` joins, places and checks every node the placement
uses (`nodes.check`) before the caller creates the run folder, so no refusal leaves a run behind.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from envace.config import RayConfig, TrainConfig
from envace.errors import UsageError


@contextmanager
def reserved(cfg: TrainConfig, say: Callable[[str], None]) -> Iterator[Placement]:
    """Joined to the cluster with the run's placement reserved and every node it uses checked, for the block;
    placement removed and cluster left after it. Every refusal (`UsageError`) comes before the block runs."""
    from envace.training.cluster import nodes

    with joined(cfg.ray.address, say):
        placement = place(cfg.ray, cfg.rollout.backend)
        try:
            nodes.check(cfg, *placement.nodes(), timeout_s=cfg.ray.placement_timeout_s)
            yield placement
        finally:
            placement.remove()


@contextmanager
def joined(address: str, say: Callable[[str], None]) -> Iterator[None]:
    """Connected to Ray (`connect`) for the block; left after it (a cluster started here stops)."""
    import ray

    connect(address, say)
    try:
        yield
    finally:
        ray.shutdown()


def connect(address: str, say: Callable[[str], None]) -> None:
    """Start Ray on this machine (`local`) or join the cluster at `address` (`auto`, HOST:PORT)."""
    import ray

    if address == "local":
        # address="local": a cluster of its own even where `ray start` left its address in /tmp/ray (Ray would
        # join that one, and wait on it for minutes when it has died since)
        ray.init(address="local", include_dashboard=False, log_to_driver=True, namespace="envace")
        say(f"ray: started on this machine ({_resources(ray.cluster_resources())})")
        return
    if address != "auto":
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            raise UsageError(f"--ray: expected local, auto or HOST:PORT, got {address!r}")
        try:
            socket.create_connection((host, int(port)), timeout=5).close()
        except OSError as exc:
            raise UsageError(f"--ray: no Ray cluster answers at {address} ({exc.strerror or exc})") from None
        check_token(address)
    try:
        ray.init(address=address, include_dashboard=False, log_to_driver=True, namespace="envace")
    except (ConnectionError, RuntimeError) as exc:
        raise UsageError(f"--ray: could not join the Ray cluster at {address}: {str(exc).splitlines()[0]}") from None
    say(f"ray: joined {address}: {len([n for n in ray.nodes() if n['Alive']])} node(s), "
        f"{_resources(ray.cluster_resources())}")


def check_token(address: str) -> None:
    """Refuse at once when the cluster at `address` wants a token this process does not send. Ray (2.59 and later)
    requires one once the head has `~/.ray/auth_token`; `ray.init` would retry for 20 s, print a log line a second
    and end on "Failed to connect", naming no token. One request of Ray's own GCS client tells in milliseconds."""
    import os
    import sys

    from ray._raylet import GcsClient
    from ray.exceptions import AuthenticationError

    sys.stderr.flush()
    saved = os.dup(2)  # the client's C++ core logs the refusal to fd 2 itself: the line below says it once
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            GcsClient(address=address).internal_kv_get(b"envace-probe", None, timeout=5)
    except AuthenticationError:
        mode = os.environ.get("RAY_AUTH_MODE") or "unset"
        raise UsageError(f"--ray: the Ray cluster at {address} requires its token and this shell sends none that "
                         f"it accepts (RAY_AUTH_MODE is {mode}): run `ray get-auth-token` on the head node, then "
                         "`export RAY_AUTH_MODE=token RAY_AUTH_TOKEN=…` here (docs/multi-node.md, Token "
                         "authentication)") from None
    except Exception:  # noqa: BLE001 - any other answer is ray.init's to report, as before
        pass
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _resources(have: dict[str, float]) -> str:
    return f"{have.get('CPU', 0):g} CPU, {have.get('GPU', 0):g} GPU"


def _bundle(cpus: float, gpus: float) -> dict[str, float]:
    return {"CPU": cpus, **({"GPU": gpus} if gpus else {})}


@dataclass
class Placement:
    """The two reserved placement groups (`ray.util.placement_group.PlacementGroup`)."""

    actors: Any
    learners: Any

    def actor(self, index: int) -> Any:
        return self._at(self.actors, index)

    def learner(self, rank: int) -> Any:
        return self._at(self.learners, rank)

    @staticmethod
    def _at(group: Any, index: int) -> Any:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        return PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=index)

    def nodes(self) -> tuple[list[str], list[str]]:
        """(the Ray node id of each actor's bundle, of each learner rank's bundle), once the groups are ready."""
        from ray.util.placement_group import placement_group_table

        def where(group: Any) -> list[str]:
            table = placement_group_table(group)["bundles_to_node_id"]
            return [table[i] for i in sorted(table)]

        return where(self.actors), where(self.learners)

    def remove(self) -> None:
        from ray.util.placement_group import remove_placement_group

        for group in (self.actors, self.learners):
            remove_placement_group(group)


def place(rc: RayConfig, backend: str = "hf") -> Placement:
    """Reserve `rc.actors` actor bundles and `rc.learners` learner bundles, or refuse in one line (UsageError).
    `backend`: the actors' generation backend (`rollout.backend`)."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    have = ray.cluster_resources()
    if backend == "vllm" and not rc.actor_gpus and have.get("GPU", 0):
        raise UsageError(f"[train.ray] actor_gpus: rollout.backend = vllm on a cluster with {have['GPU']:g} GPU "
                         "needs ray.actor_gpus = 1 or more (whole GPUs): with 0 each actor's vLLM server would "
                         "take a GPU Ray does not account for")
    nodes = len([n for n in ray.nodes() if n["Alive"]])
    for kind in ("CPU", "GPU"):
        per_actor, per_rank = (rc.actor_cpus, rc.learner_cpus) if kind == "CPU" else (rc.actor_gpus, rc.learner_gpus)
        need = rc.actors * per_actor + rc.learners * per_rank
        if need > have.get(kind, 0):
            raise UsageError(f"[train.ray]: {rc.actors} actor(s) × {per_actor:g} {kind} + {rc.learners} learner "
                             f"rank(s) × {per_rank:g} {kind} = {need:g} {kind}, but the cluster has "
                             f"{have.get(kind, 0):g}")
    if rc.actor_placement == "STRICT_SPREAD" and rc.actors > nodes:
        raise UsageError(f"[train.ray] actor_placement: STRICT_SPREAD puts each of {rc.actors} actors on its own "
                         f"node, but the cluster has {nodes}")
    # The learner first, packed on as few nodes as hold it (its collectives cross as few nodes as they can), then
    # the actors where they fit: reserved together, PACK could be handed a node's GPUs the actors took first.
    deadline = time.monotonic() + rc.placement_timeout_s
    learner = placement_group([_bundle(rc.learner_cpus, rc.learner_gpus)] * rc.learners, strategy="PACK")
    placed, _ = ray.wait([learner.ready()], timeout=rc.placement_timeout_s)
    actors = placement_group([_bundle(rc.actor_cpus, rc.actor_gpus)] * rc.actors, strategy=rc.actor_placement)
    groups = [actors, learner]
    ready, _ = ray.wait([actors.ready()], timeout=max(0.0, deadline - time.monotonic())) if placed else ([], [])
    if not (placed and ready):
        for group in groups:
            remove_placement_group(group)
        raise UsageError(f"[train.ray]: the cluster could not place the actors and learner ranks within "
                         f"{rc.placement_timeout_s:g} s (no node has a whole bundle free: "
                         f"{_resources(_bundle(rc.actor_cpus, rc.actor_gpus))} per actor, "
                         f"{_resources(_bundle(rc.learner_cpus, rc.learner_gpus))} per learner rank)")
    return Placement(*groups)
