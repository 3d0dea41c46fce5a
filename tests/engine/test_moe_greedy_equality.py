"""The mixture-of-experts models end to end: Brigade's greedy tokens equal HF transformers' (fp32, CPU) on tiny
random-weight Mixtral, Qwen2-MoE and Qwen3-MoE checkpoints built with transformers' own classes and saved as
safetensors with SmolLM2's tokenizer beside them. Six prompts go in at once under chunked prefill (16-token
budget) and a KV pool too small for all of them (preemption), in a real ``brigade serve`` answering concurrent
requests of the ``openai`` client for each family, every KV block back in the pool afterwards; Mixtral also runs
in the offline ``LLM``."""

from __future__ import annotations

import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import torch
import transformers
from moe_checkpoints import greedy_reference, moe_config, save_moe_checkpoint

from brigade import LLM, SamplingParams

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "entrypoints"))
from remote_server import RemoteServer  # noqa: E402

MAX_NEW_TOKENS = 20
PROMPT_LENS = (5, 23, 40, 61, 9, 34)
# 16-token blocks, 13 of them (12 usable: 192 tokens): one request of max_model_len fits, the six together do not.
ENGINE = {"max_model_len": 128, "block_size": 16, "num_gpu_blocks_override": 13, "max_num_batched_tokens": 16,
          "max_num_seqs": 6}


# One intra-op thread: transformers' MoE adds each expert's output with ``index_add_``, slow in parallel on 2 cores.
pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(7)
    return [torch.randint(100, 49152, (n,), generator=gen).tolist() for n in PROMPT_LENS]


@pytest.fixture(scope="module")
def moe_model(tmp_path_factory, smollm2_path, prompts):
    """``make(name) -> (model_dir, transformers' greedy tokens per prompt)``, each model written once."""
    made = {}

    def make(name: str):
        if name not in made:
            path = tmp_path_factory.mktemp(name)
            model = save_moe_checkpoint(moe_config(name), path, tokenizer_dir=smollm2_path)
            made[name] = (path, greedy_reference(model, prompts, MAX_NEW_TOKENS))
        return made[name]

    return make


def test_offline_greedy_tokens_equal_transformers(moe_model, prompts):
    path, expected = moe_model("mixtral")
    llm = LLM(str(path), dtype="float32", **ENGINE)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW_TOKENS, ignore_eos=True)
    got = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    assert got == expected
    assert llm.engine.core.scheduler.num_preemptions_total > 0, "the small KV pool should have forced preemption"
    stats = llm.get_kv_cache_stats()
    assert stats["num_free_blocks"] == stats["num_total_blocks"], "KV blocks leaked"


def _gauge(srv, name: str) -> float | None:
    lines = [line for line in httpx.get(srv.url("/metrics"), timeout=10).text.splitlines() if line.startswith(name)]
    return float(lines[0].split()[-1]) if lines else None


@pytest.mark.parametrize("name", ["mixtral", "qwen2-moe", "qwen3-moe"])
def test_server_greedy_tokens_equal_transformers(name, moe_model, prompts):
    path, expected = moe_model(name)
    tok = transformers.AutoTokenizer.from_pretrained(str(path))
    args = ["--dtype", "float32", "--served-model-name", f"tiny-{name}"]
    for key, value in ENGINE.items():
        args += [f"--{key.replace('_', '-')}", str(value)]
    srv = RemoteServer(path, args)
    try:
        client = srv.openai_client()

        def complete(prompt: list[int]):
            return client.completions.create(model=f"tiny-{name}", prompt=prompt, max_tokens=MAX_NEW_TOKENS,
                                             temperature=0.0, extra_body={"ignore_eos": True})

        with ThreadPoolExecutor(len(prompts)) as pool:  # all at once: batched, chunked, preempted
            completions = list(pool.map(complete, prompts))
        for completion, want in zip(completions, expected):
            assert completion.usage.completion_tokens == MAX_NEW_TOKENS
            assert completion.choices[0].text == tok.decode(want)
        metrics = httpx.get(srv.url("/metrics"), timeout=10).text
        preempted = [line for line in metrics.splitlines() if line.startswith("brigade:num_preemptions_total")]
        assert preempted and float(preempted[0].split()[-1]) > 0, preempted
        deadline = time.monotonic() + 20  # the gauge follows the engine's next stats: wait for every block back
        while (free := _gauge(srv, "brigade:num_free_blocks")) != ENGINE["num_gpu_blocks_override"] - 1:
            assert time.monotonic() < deadline, f"KV blocks leaked: {free} free"
            time.sleep(0.2)
    finally:
        srv.stop()
