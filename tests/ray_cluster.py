"""A real Ray cluster of nodes simulated on this machine (`ray.cluster_utils.Cluster`), every process on loopback.

Ray replaces a loopback address by the machine's outward one (`services.resolve_ip_for_localhost`) unless it is
told that no multi-host cluster is being built (`RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`, read by this process's
Ray at import and by every process the cluster starts): with it, and each node at 127.0.0.1, no Ray traffic
leaves loopback.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

FLAG = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


@contextmanager
def loopback_cluster(*nodes: dict[str, Any]) -> Iterator[tuple[str, list[str]]]:
    """(the cluster's address, each node's Ray node id) for nodes started with these `add_node` arguments (the
    first is the head; `env_vars`: what its raylet, and so every worker it starts, has in its environment);
    every node shut down after the block."""
    import ray._private.ray_constants as ray_constants
    from ray.cluster_utils import Cluster

    saved = os.environ.get(FLAG), ray_constants.ENABLE_RAY_CLUSTER
    os.environ[FLAG], ray_constants.ENABLE_RAY_CLUSTER = "0", False
    cluster = None
    try:
        head, *others = [{"node_ip_address": "127.0.0.1", **node} for node in nodes]
        cluster = Cluster(initialize_head=True, head_node_args={**head, "include_dashboard": False})
        ids = [cluster.head_node.node_id] + [cluster.add_node(**node).node_id for node in others]
        yield cluster.address, ids
    finally:
        if cluster is not None:
            cluster.shutdown()
        ray_constants.ENABLE_RAY_CLUSTER = saved[1]
        if saved[0] is None:
            os.environ.pop(FLAG, None)
        else:
            os.environ[FLAG] = saved[0]
