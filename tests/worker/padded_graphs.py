"""A GraphDispatch for tests: runs steps in the padded layouts the CUDA graphs replay, eagerly, where no graph
is captured (on the CPU), and counts the steps run in each layout, replayed or not.

``pad_steps(runner)`` puts one in the runner's place (keeping its captured graphs) and returns it:

* ``pad_mixed_steps``: steps a mixed-step graph would take run through an uncaptured ``MixedGraphs``
  (``pad_mixed_steps_graphs``) in its padded layout, eagerly (``MixedGraphs.run_eager``);
* ``pad_spec_steps``: verification steps run padded to 1 + k tokens a request also when no verification graph
  takes them;
* ``num_padded_mixed_steps``, ``num_padded_spec_steps``: the steps run in a mixed graph's layout and in the
  padded verification layout (on a GPU, equal to the graphs' ``num_replays`` when the switches are off).
"""

from __future__ import annotations

import torch

from brigade.worker.mixed_graph import MixedGraphs
from brigade.worker.graph_dispatch import GraphDispatch, StepPlan
from brigade.worker.input_batch import StepInputs
from brigade.worker.model_runner import ModelRunner
from brigade.worker.request_states import StepBatch


class PaddedGraphDispatch(GraphDispatch):
    """``GraphDispatch`` plus the padding switches and counters (module docstring)."""

    def __init__(self, runner: ModelRunner):
        graphs = runner.graphs
        super().__init__(graphs.config, graphs.attn_backend, graphs.device)
        self.decode, self.verify, self.mixed = graphs.decode, graphs.verify, graphs.mixed
        self.model, self.kv_caches = runner.model, runner.kv_caches
        self.layer_groups = graphs.layer_groups
        self.pad_mixed_steps = False
        self.pad_mixed_steps_graphs: MixedGraphs | None = None  # the uncaptured MixedGraphs those steps run through
        self.num_padded_mixed_steps = 0
        self.pad_spec_steps = False
        self.num_padded_spec_steps = 0

    def plan(self, batch: StepBatch, *, lora: bool) -> StepPlan:
        uniform = self.uniform_query_len(batch, lora=lora) if self.pad_spec_steps else None
        plan = super().plan(batch, lora=lora)
        if uniform is not None and plan.uniform_query_len is None:  # no verification graph took it
            plan = StepPlan(None, uniform)
        if plan.uniform_query_len is not None:
            self.num_padded_spec_steps += 1
        if isinstance(plan.graphs, MixedGraphs):
            self.num_padded_mixed_steps += 1
        return plan

    def mixed_graphs_for_steps(self) -> MixedGraphs | None:
        if self.mixed is not None or not self.pad_mixed_steps:
            return self.mixed
        if self.pad_mixed_steps_graphs is None:
            self.pad_mixed_steps_graphs = self.make_mixed_graphs(self.model, self.kv_caches)
        return self.pad_mixed_steps_graphs

    def replay(self, plan: StepPlan, inputs: StepInputs) -> torch.Tensor:
        if plan.graphs is not None and plan.graphs is self.pad_mixed_steps_graphs:
            return plan.graphs.run_eager(inputs)
        return super().replay(plan, inputs)


def pad_steps(runner: ModelRunner) -> PaddedGraphDispatch:
    """Give ``runner`` a ``PaddedGraphDispatch`` in place of its ``GraphDispatch`` (same graphs); returns it."""
    runner.graphs = PaddedGraphDispatch(runner)
    return runner.graphs
