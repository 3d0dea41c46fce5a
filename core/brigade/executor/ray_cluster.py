"""The Ray cluster the ray executor runs on: checks before anything loads, the connection, the placement group.

``check_ray_backend`` refuses in one line what would otherwise fail late or hang: Ray not installed, or a
``RAY_ADDRESS`` (``HOST:PORT`` of a cluster's head, its GCS) that does not answer within a few seconds.
``connect_ray`` joins the cluster ``RAY_ADDRESS`` names, or starts a local one (``ray.init``) on this machine.
``reserve_bundles`` asks for one bundle per rank (``{"GPU": 1}`` on CUDA, ``{"CPU": 1}`` on the CPU) in a
placement group, as vLLM's Ray executor does, and waits a bounded time for the cluster to grant it.
"""

from __future__ import annotations

import logging
import os
import socket

from brigade.config import ConfigError

logger = logging.getLogger(__name__)

ADDRESS_TIMEOUT_S = 5.0  # how long a RAY_ADDRESS may take to accept a connection
PLACEMENT_TIMEOUT_S = 60.0  # how long the cluster may take to grant the placement group

__all__ = ["check_ray_backend", "connect_ray", "reserve_bundles"]


def check_ray_backend() -> None:
    """Refuse the ray executor when Ray is missing or ``RAY_ADDRESS`` does not answer.

    ``RAY_ADDRESS`` may be unset (a local cluster is started), ``auto`` (the cluster ``ray start`` left on this
    machine), ``ray://...`` (Ray Client, not checked here) or ``HOST:PORT``, which must accept a TCP connection
    within ``ADDRESS_TIMEOUT_S``.

    Raises:
        ConfigError: one line naming the problem and the fix.
    """
    try:
        import ray  # noqa: F401
    except ImportError:
        raise ConfigError("--distributed-executor-backend ray needs Ray, which is not installed; install "
                          "brigade[ray] (pip install 'brigade[ray]') or use --distributed-executor-backend mp") \
            from None
    address = os.environ.get("RAY_ADDRESS", "")
    if not address or address == "auto" or "://" in address:
        return
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host or address, int(port)), timeout=ADDRESS_TIMEOUT_S).close()
    except (OSError, ValueError) as exc:
        raise ConfigError(f"RAY_ADDRESS={address} does not answer ({exc}); give the HOST:PORT of a running Ray "
                          "head (ray start --head --port 6379), or unset RAY_ADDRESS to start a local cluster") \
            from None


def connect_ray(world_size: int) -> bool:
    """Join the cluster of ``RAY_ADDRESS``, or start a local one with at least ``world_size`` CPUs (ranks on
    the CPU share its cores, as mp workers do). Nothing is done when this process already joined one.

    Returns:
        True when this call joined or started the cluster (so the executor's shutdown leaves it), False when
        the process had joined it before.
    Raises:
        ConfigError: the cluster of ``RAY_ADDRESS`` cannot be joined.
    """
    import ray

    if ray.is_initialized():
        return False
    address = os.environ.get("RAY_ADDRESS") or None
    try:
        if address is None:
            ray.init(num_cpus=max(os.cpu_count() or 1, world_size), include_dashboard=False,
                     logging_level=logging.WARNING)
        else:
            ray.init(address=address, logging_level=logging.WARNING)
    except ConnectionError as exc:
        raise ConfigError(f"cannot join the Ray cluster at RAY_ADDRESS={address}: {exc}") from None
    logger.info("ray: %s cluster, resources %s", "joined the" if address else "started a local",
                ray.cluster_resources())
    return True


def reserve_bundles(world_size: int, device_type: str, timeout_s: float = PLACEMENT_TIMEOUT_S):
    """A placement group of ``world_size`` bundles, one per rank, granted by the cluster.

    Returns:
        The ``ray.util.placement_group.PlacementGroup``.
    Raises:
        ConfigError: the cluster could not grant it within ``timeout_s`` (not enough GPUs or CPUs free); the
            group is removed first.
    """
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    resource = "GPU" if device_type == "cuda" else "CPU"
    group = placement_group([{resource: 1}] * world_size, strategy="PACK")
    ready, _ = ray.wait([group.ready()], timeout=timeout_s)
    if not ready:
        remove_placement_group(group)
        have = ray.available_resources().get(resource, 0)
        raise ConfigError(f"the Ray cluster did not grant {world_size} bundles of {{'{resource}': 1}} (one per "
                          f"rank) in {timeout_s:g} s; {have:g} {resource}(s) are free: add nodes or lower -tp x -pp")
    return group
