"""EngineProcs: the EngineCore processes behind one front end, one per data-parallel engine.

Each is started with its platform's ``engine_start_method`` (spawn; fork on the CPU, whose child then starts
with the front end's imports; spawn whenever the engine runs Ray), in its placement's environment
(``placement.py``: its own devices, or its share of the CPU threads), with its own copy of the config naming its
``data_parallel_rank``; each watches its parent and exits when the front end dies (``parent_watch.py``). The front
end binds the sockets; this only starts, waits for, watches and stops the processes, and, when the engines step in
lockstep (experts across -dp: ``dp_lockstep.py``), hosts the rendezvous store where every engine's workers join
one DP x PP x TP world (``ParallelConfig.data_parallel_store``).
"""

from __future__ import annotations

import dataclasses
import logging
import multiprocessing
import time
from multiprocessing.connection import wait

from brigade import envs
from brigade.config import BrigadeConfig
from brigade.distributed import RendezvousStore
from brigade.engine.core_proc import run_engine_core
from brigade.engine.placement import engine_environment, plan_placements

logger = logging.getLogger("brigade.engine")


class EngineStartupError(RuntimeError):
    """An EngineCore process failed while starting; the message carries its error (and, with several, which)."""


def engine_label(index: int, num_engines: int) -> str:
    """The prefix naming an engine in error messages: "" with one engine, "DP engine 1: " with several."""
    return "" if num_engines == 1 else f"DP engine {index}: "


class EngineProcs:
    """Starts the ``data_parallel_size`` EngineCore processes and blocks until every one is ready.

    Engine i reads requests from ``input_addresses[i]``; all of them send to ``output_address``.

    Raises:
        EngineStartupError: an engine failed or timed out while starting (all of them are stopped then); with
            several engines the message names which.
    """

    def __init__(self, config: BrigadeConfig, input_addresses: list[str], output_address: str):
        from brigade.plugins import current_platform

        parallel = config.parallel_config
        self.num_engines = parallel.data_parallel_size
        placements = plan_placements(config, current_platform())
        self.procs: list[multiprocessing.process.BaseProcess] = []
        # Lockstep engines (experts across -dp): their workers join one world, and the engines one group, at a
        # store this front end hosts for as long as they run.
        self.store = RendezvousStore("127.0.0.1") if parallel.data_parallel_lockstep else None
        try:
            pipes = self._start(config, placements, input_addresses, output_address)
            logger.info("dp=%d tp=%d pp=%d: %s", self.num_engines, parallel.tensor_parallel_size,
                        parallel.pipeline_parallel_size,
                        "; ".join(f"engine {p.index} (pid {proc.pid}) on {p.description}"
                                  for p, proc in zip(placements, self.procs)))
            self.num_blocks = self._wait_ready(pipes)
        except BaseException:
            self.shutdown()
            raise

    def _start(self, config: BrigadeConfig, placements: list, input_addresses: list[str],
               output_address: str) -> list:
        """Start one process per placement, each with its own config copy; returns their ready pipes."""
        from brigade.plugins import current_platform

        method = current_platform().engine_start_method
        if config.parallel_config.distributed_executor_backend == "ray":
            # The engine starts its local Ray cluster itself; from a forked engine, Ray's dashboard and runtime-env
            # agents outlived the cluster's shutdown (tests/distributed/test_ray_executor.py, on a busy machine).
            method = "spawn"
        mp = multiprocessing.get_context(method)
        pipes = []
        for placement, input_address in zip(placements, input_addresses):
            engine_config = dataclasses.replace(config, parallel_config=dataclasses.replace(
                config.parallel_config, data_parallel_rank=placement.index,
                data_parallel_store=self.store.address if self.store is not None else None))
            parent_conn, child_conn = mp.Pipe(duplex=False)
            proc = mp.Process(target=run_engine_core, name=f"BrigadeEngineCore-{placement.index}", daemon=True,
                              args=(engine_config, input_address, output_address, child_conn, method == "fork"))
            with engine_environment(placement.env):  # the child inherits it (a forked one applies it: core_proc)
                proc.start()
            child_conn.close()
            self.procs.append(proc)
            pipes.append(parent_conn)
        return pipes

    def _wait_ready(self, pipes: list) -> list[int]:
        """Each engine's KV blocks once all are ready; waits on all pipes at once, so the first failure ends it."""
        timeout_s = envs.BRIGADE_ENGINE_STARTUP_TIMEOUT
        deadline = time.monotonic() + timeout_s
        pending = {conn: index for index, conn in enumerate(pipes)}
        num_blocks = [0] * self.num_engines
        while pending:
            ready = wait(list(pending), timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                index = min(pending.values())
                raise EngineStartupError(f"{engine_label(index, self.num_engines)}the engine did not start within "
                                         f"{timeout_s:.0f} s")
            for conn in ready:
                index = pending.pop(conn)
                label = engine_label(index, self.num_engines)
                try:
                    info = conn.recv()
                except EOFError:
                    self.procs[index].join(1.0)
                    raise EngineStartupError(f"{label}the engine process exited during start-up (code "
                                             f"{self.procs[index].exitcode})") from None
                if info["status"] != "ready":
                    logger.debug("engine %d start-up traceback:\n%s", index, info["traceback"])
                    raise EngineStartupError(f"{label}the engine failed to start: {info['error']}")
                num_blocks[index] = info["num_blocks"]
        return num_blocks

    def exited(self) -> str | None:
        """Why the first engine process that is no longer running stopped, or None while all run."""
        for index, proc in enumerate(self.procs):
            if not proc.is_alive():
                return f"{engine_label(index, self.num_engines)}engine process exited with code {proc.exitcode}"
        return None

    def stop_all(self) -> None:
        """Ask every engine still running to stop (SIGTERM), without waiting: once one engine died nothing more
        is served, and the others must not keep computing requests nobody will read."""
        for proc in self.procs:
            if proc.is_alive():
                proc.terminate()

    def shutdown(self, timeout: float = 5.0) -> None:
        """Stop every engine process: SIGTERM to all, then wait, then SIGKILL what is left."""
        self.stop_all()
        deadline = time.monotonic() + timeout
        for proc in self.procs:
            proc.join(max(0.0, deadline - time.monotonic()))
        for proc in self.procs:
            if proc.is_alive():
                proc.kill()
                proc.join(timeout)
        if self.store is not None:
            self.store.close()
