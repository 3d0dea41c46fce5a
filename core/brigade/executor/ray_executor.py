"""RayExecutor: the mp executor's workers as Ray actors, one per rank, in one placement group.

Ray is the distributed engine: it places the actors (``ray_cluster.reserve_bundles``: one ``{"GPU": 1}`` or
``{"CPU": 1}`` bundle per rank), starts their processes on whatever nodes hold the bundles, and reports their
deaths. Each actor runs the mp worker's own body (``worker_proc.run_worker``): it loads the plugins, joins the
``torch.distributed`` world, builds the platform's worker and serves the commands the executor publishes once per
step on its ``BroadcastChannel``. Only the transport differs from mp: the channel is bound to a TCP port on the
address Ray reports for this node (``ray.util.get_node_ip_address``), each rank answers on its own ZMQ socket
(``ReplySender`` -> ``ReplyReceiver``) instead of a pipe, and the rendezvous store this executor hosts listens
on that address too. Ranks are numbered node by node, this node first, so a TP group stays within one node.

A worker's death (``ray.kill``, a killed process, a lost node) ends the actor's ``run`` task with Ray's error;
the executor checks those tasks whenever it waits for an answer, and raises ``WorkerDiedError`` naming the rank,
its node and process, and Ray's cause.
"""

from __future__ import annotations

import collections
import logging
import multiprocessing.util
import os
import re

import zmq

from brigade.config import BrigadeConfig
from brigade.distributed.rendezvous import RendezvousStore
from brigade.executor.abstract import Executor
from brigade.executor.broadcast import BroadcastChannel, ReplyReceiver, ReplySender
from brigade.executor.multiproc import MultiprocExecutor, PendingReplies, WorkerDiedError
from brigade.executor.ray_cluster import connect_ray, reserve_bundles
from brigade.executor.worker_proc import WorkerCommand, WorkerInfo, WorkerReply, WorkerSpec, run_worker

logger = logging.getLogger(__name__)

POLL_MS = 100  # while waiting for an answer, how often Ray is asked whether a worker died
SHUTDOWN_TIMEOUT_S = 10.0
ACTOR_START_TIMEOUT_S = 300.0  # how long the actors' processes may take to start (Python and torch imports)

__all__ = ["RayExecutor", "RayWorker"]


class RayWorker:
    """The body of one rank's Ray actor (made a remote class by ``RayExecutor``)."""

    def place(self) -> tuple[str, list[str], int]:
        """(this node's address, the GPU ids Ray gave this actor, its pid)."""
        import ray

        return ray.util.get_node_ip_address(), [str(i) for i in ray.get_gpu_ids()], os.getpid()

    def run(self, config: BrigadeConfig, hf_config, spec: WorkerSpec, reply_address: str,
            env: dict[str, str]) -> None:
        """Serve as rank ``spec.rank`` until SHUTDOWN: ``run_worker`` with a ZMQ socket for a pipe. ``env`` is
        set first (the executor's ``BRIGADE_*`` variables, and ``CUDA_VISIBLE_DEVICES`` of the node's ranks)."""
        os.environ.update(env)
        conn = ReplySender(reply_address)
        try:
            run_worker(config, hf_config, spec, conn)
        finally:
            conn.close()


class RayExecutor(MultiprocExecutor):
    """One Ray actor per rank; the mp executor's commands, broadcast and failure handling over ZMQ sockets.

    Raises:
        ConfigError: Ray missing, a cluster that cannot be joined, or a placement group it cannot grant.
        WorkerDiedError: when a worker fails to start or dies.
    """

    def __init__(self, config: BrigadeConfig, hf_config):
        Executor.__init__(self, config, hf_config)
        config.check_supported()
        parallel = config.parallel_config
        self.world_size = parallel.world_size
        self.driver_rank = self.world_size - parallel.tensor_parallel_size  # the last stage's first TP rank
        self.channel = None
        self.store: RendezvousStore | None = None
        self.conns: list[ReplyReceiver] = []
        self.actors, self.run_refs, self.places = [], [], []
        self.group = None
        self._outstanding: collections.deque[PendingReplies] = collections.deque()
        self._owns_ray = connect_ray(self.world_size)
        # A process ends without its atexit hooks (Ray's own ray.shutdown among them) when it is a multiprocessing
        # child, as the server's EngineCore is: its finalizers run instead. Without this, a local cluster's
        # dashboard and runtime-env agents outlive the engine.
        multiprocessing.util.Finalize(None, self.shutdown, exitpriority=10)
        try:
            self._start(config, hf_config)
            self.worker_info: list[WorkerInfo] = self._collect()
            self.channel.wait_for_subscribers(self.world_size, self._check_alive)
        except BaseException:
            self.shutdown()
            raise
        logger.info("started %d Ray actor(s): %s", self.world_size,
                    ", ".join(f"rank {r} on {ip} pid {pid}" for r, (ip, _, pid) in enumerate(self.places)))

    def _start(self, config: BrigadeConfig, hf_config) -> None:
        """Place the actors, number them node by node, bind the channel and reply sockets, start every rank."""
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from brigade.plugins import current_platform

        device_type = current_platform().device_type
        self.group = reserve_bundles(self.world_size, device_type)
        actor_cls = ray.remote(RayWorker)
        actors = [actor_cls.options(
            num_cpus=0 if device_type == "cuda" else 1, num_gpus=1 if device_type == "cuda" else 0,
            scheduling_strategy=PlacementGroupSchedulingStrategy(placement_group=self.group,
                                                                 placement_group_bundle_index=i)).remote()
            for i in range(self.world_size)]
        self.actors = actors  # killed by shutdown should the start fail from here on
        try:
            places = ray.get([a.place.remote() for a in actors], timeout=ACTOR_START_TIMEOUT_S)
        except ray.exceptions.RayError as exc:  # e.g. a node without Brigade installed, or a timeout
            raise WorkerDiedError(f"a rank's Ray actor did not start: {actor_death_cause(str(exc))}") from None
        host = ray.util.get_node_ip_address()
        order = sorted(range(len(actors)), key=lambda i: (places[i][0] != host, places[i][0], places[i][1]))
        self.actors, self.places = [actors[i] for i in order], [places[i] for i in order]
        self.channel = BroadcastChannel(host)
        self.conns = [ReplyReceiver(host) for _ in range(self.world_size)]
        self.store = RendezvousStore(host)
        env = {k: v for k, v in os.environ.items() if k.startswith("BRIGADE_")}
        node_gpus = collections.defaultdict(list)  # node -> the GPU ids of its ranks, in rank order
        for ip, gpus, _ in self.places:
            node_gpus[ip] += gpus
        for rank, (actor, (ip, gpus, _)) in enumerate(zip(self.actors, self.places)):
            local_rank = node_gpus[ip].index(gpus[0]) if gpus else sum(p[0] == ip for p in self.places[:rank])
            rank_env = {**env, "CUDA_VISIBLE_DEVICES": ",".join(node_gpus[ip])} if gpus else env
            spec = WorkerSpec(rank, self.world_size, self.driver_rank, "ray", self.channel.address,
                              self.store.address, local_rank=local_rank)
            self.run_refs.append(actor.run.remote(config, hf_config, spec, self.conns[rank].address, rank_env))

    # ---- the transport: ZMQ sockets and Ray's view of the actors --------------------------------
    def _wait_replies(self, ranks: list[int]) -> set[int]:
        poller = zmq.Poller()
        for rank in ranks:
            poller.register(self.conns[rank].socket, zmq.POLLIN)
        ready = {sock for sock, _ in poller.poll(POLL_MS)}
        return {rank for rank in ranks if self.conns[rank].socket in ready}

    def _recv(self, rank: int) -> WorkerReply:
        return self.conns[rank].recv()

    def _has_reply(self, rank: int) -> bool:
        return self.conns[rank].poll()

    def _death_of(self, rank: int) -> str:
        import ray

        ip, _, pid = self.places[rank]
        try:
            ray.get(self.run_refs[rank], timeout=1.0)
            how = "exited"
        except ray.exceptions.GetTimeoutError:
            how = "is gone"
        except ray.exceptions.RayActorError as exc:
            how = actor_death_cause(str(exc))
        except ray.exceptions.RayTaskError as exc:
            how = f"failed: {str(exc.cause)[:300]}"
        return f"worker rank {rank} (Ray actor on {ip}, pid {pid}) {how}"

    def _ended(self) -> list[tuple[int, str]]:
        import ray

        if not self.run_refs:
            return []
        done, _ = ray.wait(self.run_refs, num_returns=len(self.run_refs), timeout=0)
        return [(self.run_refs.index(ref), self._death_of(self.run_refs.index(ref))) for ref in done]

    def _wait_for_death(self, timeout_s: float) -> None:
        import ray

        ray.wait(self.run_refs, num_returns=1, timeout=timeout_s)

    def shutdown(self) -> None:
        """Ask every worker to stop, wait for them (10 s), kill the actors, free the placement group, close the
        sockets, and leave the Ray cluster when this executor joined it; idempotent."""
        import ray

        if self.channel is not None:
            try:
                self._broadcast(WorkerCommand.SHUTDOWN)
            except Exception:  # noqa: BLE001 - a closed channel: the actors are killed below
                pass
        if self.run_refs:
            ray.wait(self.run_refs, num_returns=len(self.run_refs), timeout=SHUTDOWN_TIMEOUT_S)
        for actor in self.actors:
            ray.kill(actor)
        self.actors, self.run_refs = [], []
        if self.group is not None:
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(self.group)
            self.group = None
        for conn in self.conns:
            conn.close()
        self.conns = []
        if self.channel is not None:
            self.channel.close()
            self.channel = None
        if self.store is not None:
            self.store.close()
            self.store = None
        if self._owns_ray and ray.is_initialized():
            ray.shutdown()
            self._owns_ray = False


def actor_death_cause(message: str) -> str:
    """Ray's (multi-line) account of an actor's death in a few words: "killed by ray.kill", "died: Worker
    unexpectedly exits with a connection error code 2", "failed to start: ModuleNotFoundError: ..."."""
    if "ray.kill" in message:
        return "killed by ray.kill"
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    if "creation task" in message and lines:  # the actor's own start raised: its exception is the last line
        return f"failed to start: {lines[-1][:300]}"
    detail = re.search(r"exit detail: (.+?)(?:\. |\n|$)", message)
    if detail:
        return f"died: {detail.group(1).strip()}"
    return f"died: {lines[0][:300] if lines else 'no reason given'}"
