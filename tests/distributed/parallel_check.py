"""Shared by the parallelism tests: a check that serves a model through the offline ``LLM`` class on the mp
executor under given layouts, in a fresh interpreter (forking pytest's own process, full of threads, could
deadlock the child)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

PROMPTS = [[1, 5, 7, 9, 11, 13], [3, 4, 5], [100, 150, 20, 30, 40, 50, 60, 70, 80, 90, 10, 12, 14, 16, 18, 20, 22]]
MAX_TOKENS = 10

_CHECK = r"""
import json, sys
from brigade import LLM, SamplingParams
from brigade.lora.request import LoRARequest
from brigade.sampling_params import StructuredOutputsParams

# per-request extras: "lora" (a PEFT folder), "structured_outputs" (its fields), "prompt_logprobs" (true)
REQUEST = json.loads(sys.argv[7])
TEXTS, PROMPT_LOGPROBS = [], []

def generate(llm, prompts):
    extra = {"prompt_logprobs": 0} if REQUEST.get("prompt_logprobs") else {}
    if "structured_outputs" in REQUEST:
        extra["structured_outputs"] = StructuredOutputsParams(**REQUEST["structured_outputs"])
    lora = LoRARequest("adapter", 1, REQUEST["lora"]) if "lora" in REQUEST else None
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        SamplingParams(temperature=0.0, max_tokens=int(sys.argv[3]), ignore_eos=True, **extra),
                        use_tqdm=False, lora_request=lora)
    TEXTS[:] = [o.outputs[0].text for o in outs]
    # each scored prompt token's logprob, under the prompt's own context whatever the generated tokens
    PROMPT_LOGPROBS[:] = [[step[t].logprob for t, step in zip(p[1:], o.prompt_logprobs[1:])]
                          for p, o in zip(prompts, outs)] if "prompt_logprobs" in extra else []
    return [list(o.outputs[0].token_ids) for o in outs]

def main():
    model, prompts, load_format = sys.argv[1], json.loads(sys.argv[2]), sys.argv[4]
    out = {}
    for layout in sys.argv[5].split(","):
        shape, _, ep = layout.partition("+")  # "2x1+ep": --enable-expert-parallel
        tp, pp = map(int, shape.split("x"))
        # a small step budget and a small pool: prompts are chunked, and requests are preempted
        kwargs = dict(dtype="float32", max_model_len=32, skip_tokenizer_init=True, load_format=load_format,
                      max_num_batched_tokens=8, num_gpu_blocks_override=6, block_size=8, enable_prefix_caching=True,
                      async_scheduling=True)
        kwargs.update(json.loads(sys.argv[6]))
        if ep:
            kwargs["enable_expert_parallel"] = True
        llm = LLM(model, tensor_parallel_size=tp, pipeline_parallel_size=pp, **kwargs)
        executor = llm.engine.core.executor
        infos = getattr(executor, "worker_info", [])
        calls = {"steps": 0, "step_messages": 0}  # executor.execute_model calls; EXECUTE_MODEL messages published
        if getattr(executor, "channel", None) is not None:
            publish, execute = executor.channel.publish, executor.execute_model
            def counted_publish(message, publish=publish):
                calls["step_messages"] += message[0].name == "EXECUTE_MODEL"
                publish(message)
            def counted_execute(*args, execute=execute, **kwargs):
                calls["steps"] += 1
                return execute(*args, **kwargs)
            executor.channel.publish, executor.execute_model = counted_publish, counted_execute
        tokens = generate(llm, prompts)
        texts, prompt_logprobs = list(TEXTS), list(PROMPT_LOGPROBS)
        again = generate(llm, prompts[2:])  # its two full prompt blocks come from the prefix cache
        scheduler = llm.engine.core.scheduler
        spec = getattr(scheduler, "spec_totals", None)
        out[layout] = {"tokens": tokens, "again": again, "texts": texts, "prompt_logprobs": prompt_logprobs,
                   "kv": llm.get_kv_cache_stats(),
                   "spec": dict(spec) if spec else {},
                   "preemptions": scheduler.num_preemptions_total,
                   "peak_in_flight": llm.engine.core.peak_batches_in_flight,
                   "methods": [i.start_method for i in infos], "param_bytes": [i.param_bytes for i in infos],
                   "expert_param_bytes": [i.expert_param_bytes for i in infos],
                   "places": [i.place for i in infos], "pids": [i.pid for i in infos],
                   "plugins": [i.plugins for i in infos], **calls}
        llm.engine.core.shutdown()
        out[layout]["alive"] = [p.is_alive() for p in getattr(executor, "procs", [])]
    print(json.dumps(out))

if __name__ == "__main__":
    main()
"""


def run_check(model, method: str, load_format: str, layouts: str, *, request: dict | None = None,
              prompts: list[list[int]] | None = None, max_tokens: int = MAX_TOKENS, **engine_args) -> dict:
    """Run ``_CHECK`` in a fresh interpreter for each ``TPxPP`` layout of ``layouts`` ("2x1,1x2"; "2x1+ep" adds
    ``enable_expert_parallel``); returns layout -> what it saw (greedy tokens, texts, prompt tokens' logprobs, KV
    stats, speculation counts...). ``engine_args`` override the check's ``LLM`` arguments; ``request`` adds to every
    request a LoRA adapter (``{"lora": folder}``), a grammar (``{"structured_outputs": StructuredOutputsParams
    fields}``) or asks for the prompt tokens' logprobs (``{"prompt_logprobs": True}``). ``prompts`` and
    ``max_tokens`` replace ``PROMPTS`` and ``MAX_TOKENS`` (the prefix-cache rerun takes the prompts from the third
    on)."""
    env = {**os.environ, "BRIGADE_WORKER_MULTIPROC_METHOD": method}
    proc = subprocess.run([sys.executable, "-c", _CHECK, str(model), json.dumps(prompts or PROMPTS), str(max_tokens),
                           load_format, layouts, json.dumps(engine_args), json.dumps(request or {})],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def save_with_greedy_references(config, path, model_cls=None) -> tuple[list[list[int]], int]:
    """Build a random-weight ``model_cls`` (transformers' class, ``LlamaForCausalLM`` by default) from ``config``
    (seed 0), save it at ``path``, and return transformers' greedy tokens (fp32) on ``PROMPTS`` and the model's
    parameter bytes."""
    import torch
    import transformers

    torch.manual_seed(0)
    model = (model_cls or transformers.LlamaForCausalLM)(config).eval()
    model.save_pretrained(path)
    return _greedy(model), sum(p.numel() * p.element_size() for p in model.parameters())


def kill_rank_mid_stream(server, body: dict, pid: int, sig: int | None = None) -> str:
    """Stream ``body`` from ``server``, send the worker ``pid`` the signal ``sig`` (SIGKILL by default; SIGSTOP
    leaves it alive but stalled) after the first chunk, check the stream ends with an error event then ``[DONE]``
    and the server exits 1; returns the server's last log line."""
    import signal

    import httpx

    sig = signal.SIGKILL if sig is None else sig

    with httpx.stream("POST", server.url("/v1/completions"), json=body, timeout=60) as stream:
        assert stream.status_code == 200, stream.read()
        lines = (line for line in stream.iter_lines() if line.startswith("data: "))
        assert "error" not in next(lines)
        os.kill(pid, sig)
        rest = list(lines)
    assert rest[-1] == "data: [DONE]" and '"engine_unavailable"' in rest[-2], rest[-3:]
    assert server.proc.wait(timeout=60) == 1, server.log_tail()
    return server.log_tail().strip().splitlines()[-1]


def hf_greedy_tokens(path) -> list[list[int]]:
    """transformers' greedy tokens (fp32) on ``PROMPTS`` for the checkpoint at ``path``."""
    import torch
    import transformers

    return _greedy(transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval())


def _greedy(model) -> list[list[int]]:
    """``model``'s greedy tokens on ``PROMPTS``, ``MAX_TOKENS`` each."""
    import torch

    refs = []
    with torch.inference_mode():
        for prompt in PROMPTS:
            out = model.generate(torch.tensor([prompt]), max_new_tokens=MAX_TOKENS, min_new_tokens=MAX_TOKENS,
                                 do_sample=False)
            refs.append(out[0, len(prompt):].tolist())
    return refs


def hf_prompt_logprobs(path) -> list[list[float]]:
    """transformers' logprob (fp32) of each prompt token of ``PROMPTS`` after the first."""
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.inference_mode():
        return [torch.log_softmax(model(torch.tensor([p])).logits[0, :-1].float(), -1)
                .gather(1, torch.tensor(p[1:])[:, None])[:, 0].tolist() for p in PROMPTS]


def check_parallel_matches_one_rank(path, refs: list[list[int]] | None = None, **engine_args) -> dict:
    """``-tp 2`` and ``-pp 2`` give ``-tp 1``'s greedy tokens (and ``refs`` when given), also from the prefix cache,
    and each ``-tp 2`` rank holds at most 65% of the checkpoint's bytes (its slices); returns what ``run_check``
    saw."""
    from pathlib import Path

    got = run_check(path, "fork", "auto", "1x1,2x1,1x2", **engine_args)
    for layout in ("2x1", "1x2"):
        assert got[layout]["tokens"] == got["1x1"]["tokens"], layout
        assert got[layout]["again"] == got["1x1"]["tokens"][2:], layout
    if refs is not None:
        assert got["1x1"]["tokens"] == refs
    on_disk = sum(f.stat().st_size for f in Path(path).glob("*.safetensors"))
    assert len(got["2x1"]["param_bytes"]) == 2 and max(got["2x1"]["param_bytes"]) < 0.65 * on_disk, \
        (got["2x1"]["param_bytes"], on_disk)
    return got
