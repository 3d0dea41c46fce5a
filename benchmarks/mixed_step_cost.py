"""What a mixed prefill/decode step costs eagerly against the same step replayed as a CUDA graph.

Serving mixes a new prompt's prefill (or a chunk of it) with the running decodes. Decode-only steps replay
decode graphs; mixed steps run eagerly, launching every kernel from Python. This times one mixed step of
``D`` decodes (each with a context of ``--context`` tokens; several lengths may be given) plus one prefill of ``P`` tokens, with random
token ids on a throwaway KV cache: eagerly (wall time, synchronized, median of ``--iters``), then the very same
step captured once into a CUDA graph and replayed (valid for that exact step: the grids are the step's own).
The difference is the launch overhead a mixed-step graph could remove. With the engine's mixed-step graphs
captured (``cudagraph_mode`` FULL), the same step replayed through them (padded to the graph's token count,
every request through the one varlen attention kernel) is timed as well.

Usage (CUDA machine)::

    python benchmarks/mixed_step_cost.py benchmarks/configs/llama-3.1-8b --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from brigade import LLM
from brigade.attention.backend import AttentionContext
from brigade.interfaces.kv_cache_spec import KVCacheConfig
from brigade.worker.input_batch import CachedRequestState, build_step_inputs


def _time(fn, iters: int) -> float:
    times = []
    for _ in range(iters):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(1e3 * (time.perf_counter() - start))
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--decodes", default="0,1,8,32,64")
    parser.add_argument("--prefills", default="16,64,256")
    parser.add_argument("--context", default="512", help="the decodes' context length(s), comma-separated")
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.6)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--json")
    args = parser.parse_args()
    llm = LLM(args.model, load_format="dummy", dtype="bfloat16", skip_tokenizer_init=True,
              max_model_len=args.max_model_len, max_num_seqs=128, gpu_memory_utilization=args.gpu_memory_utilization)
    runner = llm.engine.core.executor.worker.model_runner
    gen = torch.Generator().manual_seed(0)
    vocab = runner.hf_config.vocab_size
    rows = []
    combos = [(c, d, p) for c in (int(x) for x in args.context.split(","))
              for d in (int(x) for x in args.decodes.split(",")) for p in (int(x) for x in args.prefills.split(","))]
    for context, num_decodes, prefill in combos:
        requests = [(context, context - 1)] * num_decodes + [(prefill, 0)]
        states, first = [], 0
        for i, (length, computed) in enumerate(requests):
            blocks = -(-length // runner.block_size)
            states.append(CachedRequestState(
                req_id=str(i), token_ids=torch.randint(0, vocab, (length,), generator=gen).tolist(),
                num_prompt_tokens=length, block_ids=(list(range(first, first + blocks)),),
                num_computed_tokens=computed, sampling=None))
            first += blocks
        scheduled = [length - computed for length, computed in requests]
        inputs = build_step_inputs(states, scheduled, block_size=runner.block_size, device=runner.device)
        kv = runner.kv_cache.allocate(KVCacheConfig(first, runner.kv_cache_config.groups), runner.device)
        ctx = AttentionContext(metadata=inputs.metadata, kv_caches=kv)

        def step():
            hidden = runner.model(inputs.input_ids, inputs.positions, ctx)
            return runner.model.compute_logits(hidden[inputs.logits_indices])

        with torch.inference_mode():
            step()
            eager = _time(step, args.iters)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                step()
            graphed = _time(graph.replay, args.iters)
            # The engine's own mixed-step graph (MixedGraphs: padded sizes, one varlen attention kernel),
            # on the runner's KV cache, when captured (cudagraph_mode FULL).
            engine_graph = None
            mixed = runner.graphs.mixed
            if mixed is not None and mixed.can_run(len(inputs.input_ids), len(states)):
                staged = build_step_inputs(states, scheduled, block_size=runner.block_size,
                                           device=runner.device, transfer=mixed.transfer)
                mixed.run(staged)
                engine_graph = round(_time(lambda: mixed.run(staged), args.iters), 3)
        row = {"context": context, "decodes": num_decodes, "prefill": prefill, "tokens": num_decodes + prefill,
               "eager_ms": round(eager, 3), "graph_ms": round(graphed, 3), "mixed_graph_ms": engine_graph}
        print(row, flush=True)
        rows.append(row)
        del graph, kv
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
