"""The mixture-of-experts models end to end: Brigade's greedy tokens equal HF transformers' (fp32, CPU) on tiny
random-weight Mixtral, Qwen2-MoE and Qwen3-MoE checkpoints built with transformers' own classes and saved as
safetensors with SmolLM2's tokenizer beside them. Six prompts go in at once under chunked prefill (16-token
budget) and a KV pool too small for all of them (preemption); Mixtral and Qwen2-MoE run in the offline ``LLM``,
Qwen3-MoE in a real ``brigade serve`` answering concurrent requests of the ``openai`` client."""

from __future__ import annotations

import shutil
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import torch
import transformers

from brigade import LLM, SamplingParams

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "entrypoints"))
from remote_server import RemoteServer  # noqa: E402

MAX_NEW_TOKENS = 20
PROMPT_LENS = (5, 23, 40, 61, 9, 34)
TINY = dict(vocab_size=49152, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=256, rms_norm_eps=1e-5, initializer_range=0.1, tie_word_embeddings=False,
            bos_token_id=None, eos_token_id=None)
MODELS = {
    "mixtral": lambda: transformers.MixtralConfig(**TINY, intermediate_size=48, num_local_experts=4,
                                                  num_experts_per_tok=2, architectures=["MixtralForCausalLM"]),
    "qwen2-moe": lambda: transformers.Qwen2MoeConfig(**TINY, intermediate_size=80, moe_intermediate_size=24,
                                                     shared_expert_intermediate_size=40, num_experts=6,
                                                     num_experts_per_tok=2, architectures=["Qwen2MoeForCausalLM"]),
    "qwen3-moe": lambda: transformers.Qwen3MoeConfig(**TINY, head_dim=32, intermediate_size=80,
                                                     moe_intermediate_size=24, num_experts=8, num_experts_per_tok=3,
                                                     norm_topk_prob=True, architectures=["Qwen3MoeForCausalLM"]),
}
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
            torch.manual_seed(0)
            model = getattr(transformers, MODELS[name]().architectures[0])(MODELS[name]()).eval()
            model.save_pretrained(str(path))
            for file in ("tokenizer.json", "tokenizer_config.json"):
                shutil.copy(Path(smollm2_path) / file, path / file)
            made[name] = (path, _hf_greedy(model, prompts))
        return made[name]

    return make


def _hf_greedy(model, prompts: list[list[int]]) -> list[list[int]]:
    outs = []
    with torch.inference_mode():
        for ids in prompts:
            out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                 max_new_tokens=MAX_NEW_TOKENS, min_new_tokens=MAX_NEW_TOKENS, do_sample=False,
                                 eos_token_id=[], pad_token_id=0)
            outs.append(out[0, len(ids):].tolist())
    return outs


@pytest.mark.parametrize("name", ["mixtral", "qwen2-moe"])
def test_offline_greedy_tokens_equal_transformers(name, moe_model, prompts):
    path, expected = moe_model(name)
    llm = LLM(str(path), dtype="float32", **ENGINE)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW_TOKENS, ignore_eos=True)
    got = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    assert got == expected
    assert llm.engine.core.scheduler.num_preemptions_total > 0, "the small KV pool should have forced preemption"
    stats = llm.get_kv_cache_stats()
    assert stats["num_free_blocks"] == stats["num_total_blocks"], "KV blocks leaked"


def test_server_greedy_tokens_equal_transformers(moe_model, prompts):
    path, expected = moe_model("qwen3-moe")
    tok = transformers.AutoTokenizer.from_pretrained(str(path))
    args = ["--dtype", "float32", "--served-model-name", "tiny-qwen3-moe"]
    for key, value in ENGINE.items():
        args += [f"--{key.replace('_', '-')}", str(value)]
    srv = RemoteServer(path, args)
    try:
        client = srv.openai_client()

        def complete(prompt: list[int]):
            return client.completions.create(model="tiny-qwen3-moe", prompt=prompt, max_tokens=MAX_NEW_TOKENS,
                                             temperature=0.0, extra_body={"ignore_eos": True})

        with ThreadPoolExecutor(len(prompts)) as pool:  # all at once: batched, chunked, preempted
            completions = list(pool.map(complete, prompts))
        for completion, want in zip(completions, expected):
            assert completion.usage.completion_tokens == MAX_NEW_TOKENS
            assert completion.choices[0].text == tok.decode(want)
        metrics = httpx.get(srv.url("/metrics"), timeout=10).text
        preempted = [line for line in metrics.splitlines() if line.startswith("brigade:num_preemptions_total")]
        assert preempted and float(preempted[0].split()[-1]) > 0, preempted
    finally:
        srv.stop()
