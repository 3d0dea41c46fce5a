"""ParallelConfig: worker counts and the executor backend."""

from __future__ import annotations

from dataclasses import dataclass

from brigade.config.errors import ConfigError


@dataclass
class ParallelConfig:
    """How the model is spread over devices."""

    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    data_parallel_size: int = 1
    """Engine replicas (``-dp``): each is an EngineCore process with its own scheduler, KV cache and TP x PP
    workers, behind one front end that sends each request to the least-loaded one."""
    data_parallel_rank: int | None = None
    """Which replica this engine is (0 .. data_parallel_size - 1): set by the front end in each engine process's
    copy of the config; None in the front end itself (and in an engine the offline LLM runs in-process)."""
    enable_expert_parallel: bool = False
    """MoE models (``--enable-expert-parallel``, vLLM's flag): each rank of the expert-parallel group, the DP x TP
    ranks (one engine's TP ranks with -dp 1), holds ``num_experts / (dp * tp)`` whole experts instead of a
    ``1 / tp`` slice of every expert's intermediate dimension (docs/moe.md). With -dp above 1 the engines step in
    lockstep (``data_parallel_lockstep``)."""
    data_parallel_store: str | None = None
    """``HOST:PORT`` of the front end's rendezvous store, where the workers of every engine join one DP x PP x TP
    world and the engines their lockstep group: set by the front end in each engine's copy of the config when
    ``data_parallel_lockstep``; None otherwise (each engine's executor hosts its own store)."""
    distributed_executor_backend: str | None = None
    """uni, mp or ray; None picks uni for one device and mp for more."""
    worker_cls: str = "auto"
    """Dotted path of the Worker class; the platform sets it in check_and_update_config."""

    def __post_init__(self) -> None:
        for name in ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}")
        rank = self.data_parallel_rank
        if rank is not None and not 0 <= rank < self.data_parallel_size:
            raise ConfigError(f"data_parallel_rank {rank} is outside 0..{self.data_parallel_size - 1} "
                              f"(-dp {self.data_parallel_size}); leave it unset, the front end sets it per engine")
        if self.data_parallel_lockstep and self.distributed_executor_backend == "ray":
            raise ConfigError(f"--enable-expert-parallel with -dp {self.data_parallel_size} runs on the uni or mp "
                              "executor (every engine's workers join one world at the front end's store); drop "
                              "--distributed-executor-backend ray")
        if self.distributed_executor_backend not in (None, "uni", "mp", "ray"):
            raise ConfigError(f"--distributed-executor-backend {self.distributed_executor_backend!r} "
                              "is not known; use uni, mp or ray")

    @property
    def data_parallel_lockstep(self) -> bool:
        """Whether the DP engines must step together: experts spread over the DP x TP ranks
        (``--enable-expert-parallel`` with -dp above 1), so every MoE layer is a collective over all engines and
        an engine with nothing to run steps a dummy batch (vLLM's DP "waves")."""
        return self.enable_expert_parallel and self.data_parallel_size > 1

    @property
    def world_size(self) -> int:
        """Workers of one engine: tp x pp (each data-parallel engine has its own)."""
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def num_devices_needed(self) -> int:
        """Devices this process must see: one engine's tp x pp inside an engine process, all dp engines' in the
        front end that places them."""
        return self.world_size * (self.data_parallel_size if self.data_parallel_rank is None else 1)
