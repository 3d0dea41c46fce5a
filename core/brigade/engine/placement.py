"""Placement of data-parallel engines: which devices (or, on the host, how many threads) each EngineCore process
gets, set in its environment before it starts.

vLLM's engine-process manager does the same: engine i of ``-dp N`` sees devices ``[i * tp * pp, (i + 1) * tp *
pp)`` of those the front end sees, through the platform's device control variable (``CUDA_VISIBLE_DEVICES``),
set in the environment the spawned process inherits, so the engine and its workers never see another engine's
devices and their local ranks count from 0. On the host (a platform without devices) every engine runs on the
CPU, each with an equal share of the cores as its torch thread count (``OMP_NUM_THREADS``, unless the operator
set it; a forked engine applies it with ``torch.set_num_threads``, as torch read the variable before the fork), so
N engines do not oversubscribe the cores.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from brigade.config import BrigadeConfig, ConfigError
from brigade.platforms.interface import Platform

THREADS_ENV = "OMP_NUM_THREADS"  # read by torch at start-up for its intra-op thread pool


@dataclass(frozen=True)
class EnginePlacement:
    """Where one data-parallel engine runs.

    Attributes:
        index: the engine's data-parallel rank, 0 .. dp - 1.
        env: variables set in its process's environment when it starts (empty: it inherits the front end's).
        description: for the start-up log ("cuda devices 2,3", "the cpu, 1 thread").
    """

    index: int
    env: Mapping[str, str] = field(default_factory=dict)
    description: str = ""


def check_device_count(config: BrigadeConfig, platform: type[Platform]) -> None:
    """Refuse a grid that needs more devices than this process sees, before anything loads.

    The front end needs dp x tp x pp devices; an engine process (``data_parallel_rank`` set) tp x pp of its own.
    A platform that cannot count its devices (``device_count()`` None, and the host) is not checked, nor is the
    ray executor: its ranks may sit on other nodes, and its placement group is its check.

    Raises:
        ConfigError: naming the grid, the count needed and the count visible.
    """
    parallel = config.parallel_config
    if parallel.distributed_executor_backend == "ray":
        return
    needed = parallel.num_devices_needed
    available = platform.device_count()
    if available is None or needed <= available:
        return
    grid = f"-dp {parallel.data_parallel_size} x " if parallel.data_parallel_rank is None else ""
    variable = platform.device_control_env_var
    seen = f"{variable}={os.environ[variable]}" if variable and os.environ.get(variable, "").strip() else "the host"
    raise ConfigError(f"{grid}-tp {parallel.tensor_parallel_size} x -pp {parallel.pipeline_parallel_size} needs "
                      f"{needed} {platform.name} devices but {available} are visible ({seen}); lower the sizes so "
                      f"that their product is at most {available}")


def plan_placements(config: BrigadeConfig, platform: type[Platform],
                    environ: Mapping[str, str] | None = None) -> list[EnginePlacement]:
    """One placement per data-parallel engine, in engine order.

    With one engine nothing is set: it sees what the front end sees. With more, on a device platform engine i gets
    the visible devices ``[i * tp * pp, (i + 1) * tp * pp)`` (the control variable's list when set, else ids 0 ..
    count - 1); on the host each gets ``max(1, cores // dp)`` threads unless ``OMP_NUM_THREADS`` is set.
    """
    environ = os.environ if environ is None else environ
    parallel = config.parallel_config
    dp, per_engine = parallel.data_parallel_size, parallel.world_size
    variable = platform.device_control_env_var
    if variable is None:
        return _host_placements(dp, environ)
    visible = platform.visible_device_ids()
    if visible is None:
        count = platform.device_count()
        visible = [str(i) for i in range(count if count is not None else dp * per_engine)]
    if dp == 1:
        return [EnginePlacement(0, {}, f"{platform.name} devices {','.join(visible[:per_engine])}")]
    placements = []
    for index in range(dp):
        devices = visible[index * per_engine:(index + 1) * per_engine]
        placements.append(EnginePlacement(index, {variable: ",".join(devices)},
                                          f"{platform.name} devices {','.join(devices)} ({variable})"))
    return placements


def _host_placements(dp: int, environ: Mapping[str, str]) -> list[EnginePlacement]:
    if dp == 1:
        return [EnginePlacement(0, {}, "the cpu")]
    given = environ.get(THREADS_ENV, "").strip()
    if given:
        return [EnginePlacement(i, {}, f"the cpu, {THREADS_ENV}={given}") for i in range(dp)]
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    threads = max(1, cores // dp)
    return [EnginePlacement(i, {THREADS_ENV: str(threads)}, f"the cpu, {threads} thread{'s' * (threads > 1)}")
            for i in range(dp)]


@contextlib.contextmanager
def engine_environment(env: Mapping[str, str]) -> Iterator[None]:
    """Set ``env`` in this process's environment for the duration (a spawned or forked child inherits it), then
    restore every variable as it was. Used around ``Process.start()`` only, while the front end starts its engines."""
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
