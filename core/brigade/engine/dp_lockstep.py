"""DPLockstep: data-parallel engines that step together, because their MoE layers are collectives over all of them.

With ``--enable-expert-parallel`` and ``-dp`` above 1 the experts spread over every engine's ranks
(``model_executor/layers/moe_dispatch.py``), so an engine's forward pass waits, in each MoE layer, for the same
layer on every other engine. vLLM v1 runs such engines in "waves": while any engine has requests, every engine
runs one forward pass per loop turn, a dummy batch when it has nothing scheduled; when none has, all go idle, and
the next request anywhere starts a new wave on all of them.

Brigade does the same with one small agreement per loop turn: an all-reduce MAX over a gloo group of the engine
processes (a ``StatelessGroup`` at the front end's rendezvous store, beside the workers' world) of "I have
unfinished requests". Any engine busy: each engine either steps (``EngineCore.step``; its runner turns a step with
nothing to compute into a dummy forward pass) or runs a dummy batch (``EngineCore.execute_dummy_batch``). None busy:
each engine waits up to ``IDLE_POLL_S`` for a request, then agrees again; so idle engines wake together within
``IDLE_POLL_S`` of a request reaching any of them, and an idle wave costs one all-reduce per ``IDLE_POLL_S``. (vLLM
wakes idle engines from the front end instead, which sends a "start wave" message; the poll keeps the front ends
unaware of lockstep, at the price of that bounded wake-up delay.)

The token count each engine pads its MoE dispatch to is agreed by the workers themselves, once per forward pass
(``moe_dispatch.agree_num_tokens``), where the batch is built; the engine loop only decides *whether* to step.

A dead engine breaks the group: the survivors' next all-reduce (or MoE collective) raises at once (the peer's
connection closed), or after ``BRIGADE_DISTRIBUTED_TIMEOUT`` for a stalled one, and each engine then fails its
requests with the error as for any engine failure (``core_proc.py``).
"""

from __future__ import annotations

import logging

from brigade import envs
from brigade.config import ParallelConfig
from brigade.distributed import StatelessGroup

logger = logging.getLogger("brigade.engine")

IDLE_POLL_S = 0.05  # while every engine is idle, how long each waits for a request between agreements
_GROUP_PREFIX = "dp_engines/"  # the engines' keys in the front end's store (the workers' world uses others)


class DPLockstep:
    """This engine's seat in the lockstep group of the ``data_parallel_size`` engines.

    Invariant: every engine calls ``any_busy`` once per loop turn, and when it returns True runs exactly one
    forward pass (a step or a dummy batch) before the next call.

    Raises:
        RuntimeError (from gloo): the group could not form within ``BRIGADE_DISTRIBUTED_TIMEOUT``.
    """

    def __init__(self, parallel: ParallelConfig):
        self.dp_rank = parallel.data_parallel_rank or 0
        self.group = StatelessGroup(parallel.data_parallel_store, _GROUP_PREFIX, self.dp_rank,
                                    parallel.data_parallel_size, envs.BRIGADE_DISTRIBUTED_TIMEOUT)
        self.running = False  # whether any engine had requests at the last agreement (a wave is on)
        self.num_dummy_batches = 0  # in the current wave: forward passes run for the others, none of its own

    def input_wait_s(self, busy: bool) -> float:
        """How long the loop may block on its input queue before the next agreement: not at all while this
        engine or any other has work (the others wait in the agreement), ``IDLE_POLL_S`` while all are idle."""
        return 0.0 if busy or self.running else IDLE_POLL_S

    def any_busy(self, busy: bool) -> bool:
        """Whether any engine has unfinished requests (this one: ``busy``); every engine must call it.

        Raises:
            RuntimeError (from gloo): another engine died or stalled past ``BRIGADE_DISTRIBUTED_TIMEOUT``.
        """
        (flag,) = self.group.all_reduce_max([int(busy)])
        if bool(flag) and not self.running:
            self.num_dummy_batches = 0
            logger.debug("lockstep wave starts")
        elif self.running and not flag:
            logger.debug("lockstep wave ends, every engine idle; this engine ran %d dummy batches in it",
                         self.num_dummy_batches)
        self.running = bool(flag)
        return self.running
