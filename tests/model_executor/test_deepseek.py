"""DeepSeek-V2 and -V3 (``DeepseekV2ForCausalLM``, ``DeepseekV3ForCausalLM``) against transformers' own classes on tiny
random-weight checkpoints (fp32, CPU): V2 with and without ``q_lora_rank`` (V2-Lite's full-rank query), V2 with
group-limited routing; V3 with sigmoid routing over 4 groups of 2 experts, a non-zero random balancing bias, a dense
first layer and YaRN rope with DeepSeek's ``mscale``/``mscale_all_dim``. Greedy tokens are transformers' for
batched prompts under chunked prefill, preemption and prefix caching, with every KV block back at the end, on one
rank and over two gloo ranks (V3 under ``-tp 2`` and ``-tp 2 --enable-expert-parallel``, V2-Lite under ``-tp 2``).
Also: the latent cache spec's size, the grouped router and the whole MoE block against transformers', the latent
attention's decode (weight absorption) against its prefill (expansion), and the one-line refusals."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import transformers
from moe_checkpoints import greedy_reference

from brigade import LLM, SamplingParams
from brigade.config import ConfigError

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "distributed"))
from parallel_check import run_check  # noqa: E402

COMMON = dict(vocab_size=256, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=3,
              num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=32, qk_nope_head_dim=16,
              qk_rope_head_dim=8, v_head_dim=16, max_position_embeddings=256, rms_norm_eps=1e-5,
              initializer_range=0.1, tie_word_embeddings=False, bos_token_id=None, eos_token_id=None,
              pad_token_id=None)
V2 = dict(COMMON, q_lora_rank=48, n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2,
          first_k_dense_replace=1, routed_scaling_factor=1.5, topk_method="group_limited_greedy", n_group=4,
          topk_group=1)  # both experts from the best group: group-limiting then changes the choice
V2_LITE = dict(COMMON, q_lora_rank=None, n_routed_experts=4, n_shared_experts=2, num_experts_per_tok=2,
               first_k_dense_replace=0, routed_scaling_factor=1.0, topk_method="greedy")
V3 = dict(COMMON, q_lora_rank=48, n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=3, n_group=4,
          topk_group=2, first_k_dense_replace=1, routed_scaling_factor=2.5, norm_topk_prob=True,
          rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0, mscale=1.0, mscale_all_dim=1.0,
                               beta_fast=32, beta_slow=1, original_max_position_embeddings=64))
PROMPT_LENS = (40, 70, 23, 55)
MAX_NEW_TOKENS = 24
ENGINE = dict(dtype="float32", max_model_len=128, block_size=16, num_gpu_blocks_override=14,
              max_num_batched_tokens=32, max_num_seqs=4, enable_prefix_caching=True, skip_tokenizer_init=True)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def build_model(kind: str, fields: dict, seed: int = 0):
    """transformers' model with random weights, the router's balancing bias too (V3)."""
    cls, cfg = ((transformers.DeepseekV3ForCausalLM, transformers.DeepseekV3Config) if kind == "v3" else
                (transformers.DeepseekV2ForCausalLM, transformers.DeepseekV2Config))
    torch.manual_seed(seed)
    config = cfg(**fields, architectures=[cls.__name__])
    model = cls(config).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            gate = getattr(layer.mlp, "gate", None)
            if gate is not None:
                gate.weight.normal_(0.0, 0.3)
                if hasattr(gate, "e_score_correction_bias"):
                    gate.e_score_correction_bias.uniform_(-0.2, 0.2)
    return model


def save(tmp_path_factory, kind: str, fields: dict, name: str):
    path = tmp_path_factory.mktemp(name)
    model = build_model(kind, fields)
    model.save_pretrained(str(path))
    return path, model


@pytest.fixture(scope="module")
def v3_checkpoint(tmp_path_factory):
    return save(tmp_path_factory, "v3", V3, "deepseek-v3")


@pytest.fixture(scope="module")
def v2_checkpoint(tmp_path_factory):
    return save(tmp_path_factory, "v2", V2, "deepseek-v2")


@pytest.fixture(scope="module")
def v2_lite_checkpoint(tmp_path_factory):
    return save(tmp_path_factory, "v2", V2_LITE, "deepseek-v2-lite")


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(3)
    return [torch.randint(0, 256, (n,), generator=gen).tolist() for n in PROMPT_LENS]


def test_latent_spec_holds_one_latent_per_token():
    from brigade.interfaces.kv_cache_spec import FullAttentionSpec, MLAAttentionSpec, group_layers

    spec = MLAAttentionSpec(16, 1, 512 + 64, "bfloat16")  # DeepSeek-V3's kv_lora_rank + qk_rope_head_dim
    assert spec.page_size_bytes == 16 * 576 * 2  # no factor 2: the latent is both K and V
    assert spec.kind == "mla" and isinstance(spec, FullAttentionSpec)
    assert spec.tensor_shape(None, 10) == (10, 16, 576)
    groups = group_layers({i: spec for i in range(3)})
    assert len(groups) == 1 and groups[0].layer_ids == (0, 1, 2)


def test_worker_lays_out_latent_tensors():
    """The worker's KV tensors follow the latent spec: [num_blocks, block_size, latent], one page a layer."""
    from brigade.attention.reference import ReferenceAttentionBackend
    from brigade.interfaces.kv_cache_spec import KVCacheConfig, MLAAttentionSpec, group_layers
    from brigade.worker.kv_cache import KVCacheTensors

    spec = MLAAttentionSpec(16, 1, 40, "float32")
    tensors = KVCacheTensors(ReferenceAttentionBackend, {0: spec, 1: spec, 2: spec}, torch.float32)
    groups = group_layers(tensors.specs)
    assert tensors.bytes_per_block(groups) == 3 * spec.page_size_bytes == 3 * 16 * 40 * 4
    caches = tensors.allocate(KVCacheConfig(num_blocks=5, groups=groups), torch.device("cpu"))
    assert [tuple(c.shape) for c in caches] == [(5, 16, 40)] * 3


def test_model_reports_latent_specs(v3_checkpoint):
    from brigade.attention.reference import ReferenceAttentionBackend
    from brigade.interfaces.kv_cache_spec import MLAAttentionSpec
    from brigade.model_executor.models.deepseek import DeepseekV3ForCausalLM

    _, hf = v3_checkpoint
    model = DeepseekV3ForCausalLM(hf.config, dtype=torch.float32, attn_backend=ReferenceAttentionBackend)
    specs = model.kv_cache_specs(16, torch.bfloat16)
    assert specs == {i: MLAAttentionSpec(16, 1, 32 + 8, "bfloat16") for i in range(3)}


@pytest.mark.parametrize("name", ["v2", "v3"])
def test_moe_block_matches_transformers(name, v2_checkpoint, v3_checkpoint):
    """The grouped router (softmax or sigmoid with bias), the routed experts on FusedMoE and the shared experts,
    loaded from the checkpoint, give transformers' MoE output."""
    from brigade.attention.reference import ReferenceAttentionBackend
    from brigade.model_executor.models.deepseek import DeepseekV2ForCausalLM, DeepseekV3ForCausalLM
    from brigade.model_executor.weight_utils import safetensors_weights_iterator

    path, hf = v2_checkpoint if name == "v2" else v3_checkpoint
    cls = DeepseekV2ForCausalLM if name == "v2" else DeepseekV3ForCausalLM
    model = cls(hf.config, dtype=torch.float32, attn_backend=ReferenceAttentionBackend)
    loaded = model.load_weights(safetensors_weights_iterator(str(path)))
    assert ("model.layers.1.mlp.gate.e_score_correction_bias" in loaded) == (name == "v3")
    x = torch.randn(37, 64, generator=torch.Generator().manual_seed(1))
    for i in (1, 2):
        want = hf.model.layers[i].mlp(x[None])[0]
        got = model.model.layers[i].mlp.moe(x)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_decode_absorption_equals_prefill_expansion():
    """One request's last token attended through the decode route (W_UK, W_UV absorbed) equals the same token
    attended through the prefill route (latents expanded to keys and values)."""
    from brigade.attention.backend import AttentionContext, AttentionMetadata
    from brigade.model_executor.layers.mla_attention import MLAAttention

    gen = torch.Generator().manual_seed(0)
    heads, nope, rope, v, rank, block, seq = 3, 8, 4, 6, 10, 4, 11
    mla = MLAAttention(heads, nope, rope, v, rank, scale=0.3, layer_idx=0)
    w_kv = torch.randn(heads * (nope + v), rank, generator=gen)
    q = torch.randn(seq, heads, nope + rope, generator=gen)
    latent = torch.randn(seq, rank + rope, generator=gen)
    blocks = torch.tensor([[2, 0, 3]], dtype=torch.int32)
    slots = torch.tensor([int(blocks[0, p // block]) * block + p % block for p in range(seq)])

    def step(q_rows, latent_rows, slot_rows, num_decodes):
        cache_metadata = AttentionMetadata(
            num_reqs=1, num_actual_tokens=len(q_rows), max_query_len=len(q_rows), max_seq_len=seq,
            num_decodes=num_decodes, query_start_loc=torch.tensor([0, len(q_rows)], dtype=torch.int32),
            seq_lens=torch.tensor([seq], dtype=torch.int32), block_table=blocks, slot_mapping=slot_rows,
            query_start_loc_cpu=torch.tensor([0, len(q_rows)], dtype=torch.int32),
            seq_lens_cpu=torch.tensor([seq], dtype=torch.int32))
        return mla(q_rows, latent_rows, w_kv, AttentionContext(cache_metadata, [cache]))

    cache = torch.zeros(4, block, rank + rope)
    prefill = step(q, latent, slots, 0)  # the whole sequence, expanded
    decode = step(q[-1:], latent[-1:], slots[-1:], 1)  # the last token again, absorbed
    torch.testing.assert_close(decode, prefill[-1:], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["v2", "v2_lite", "v3"])
def test_greedy_tokens_equal_transformers(name, request, prompts):
    path, hf = request.getfixturevalue(f"{name}_checkpoint")
    expected = greedy_reference(hf, prompts, MAX_NEW_TOKENS)
    llm = LLM(str(path), **ENGINE)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW_TOKENS, ignore_eos=True)
    got = [list(o.outputs[0].token_ids) for o in llm.generate([{"prompt_token_ids": p} for p in prompts], params,
                                                               use_tqdm=False)]
    assert got == expected
    again = llm.generate([{"prompt_token_ids": p} for p in prompts[:2]], params, use_tqdm=False)
    assert [list(o.outputs[0].token_ids) for o in again] == expected[:2]
    # The 14-block pool has evicted part of them since; what is left comes from the prefix cache.
    assert sum(o.num_cached_tokens for o in again) >= 32, "prompt blocks should come from the prefix cache"
    assert llm.engine.core.scheduler.num_preemptions_total > 0, "the 14-block pool should have forced preemption"
    stats = llm.get_kv_cache_stats()
    assert stats["num_free_blocks"] == stats["num_total_blocks"], "KV blocks leaked"
    llm.engine.core.shutdown()


@pytest.mark.parametrize("name,layouts", [("v3", "2x1,2x1+ep"), ("v2_lite", "2x1")])
def test_tp2_and_expert_parallel_greedy_tokens_match_transformers(name, layouts, request, prompts):
    """V3 under -tp 2 with and without expert parallelism; V2-Lite's full-rank q_proj split by heads under -tp 2."""
    path, hf = request.getfixturevalue(f"{name}_checkpoint")
    short = [p[:24] for p in prompts[:3]]
    expected = greedy_reference(hf, short, 16)
    got = run_check(path, "fork", "auto", layouts, prompts=short, max_tokens=16, max_model_len=64,
                    max_num_batched_tokens=16, num_gpu_blocks_override=10, block_size=8)
    for layout in layouts.split(","):
        seen = got[layout]
        assert seen["tokens"] == expected, layout
        assert seen["again"] == expected[2:], layout
        assert seen["preemptions"] > 0, layout
        assert seen["kv"]["num_free_blocks"] == seen["kv"]["num_total_blocks"], seen["kv"]
        assert not any(seen["alive"]), "workers must exit on shutdown"


@pytest.mark.parametrize("kind,fields,message", [
    ("v3", dict(V3, scoring_func="softmax"), "scoring function 'softmax' is not supported"),
    ("v3", dict(V3, topk_method="group_limited_greedy"), "topk_method 'group_limited_greedy' is not supported"),
    ("v2", dict(V2, topk_method="noaux_tc"), "topk_method 'noaux_tc' is not supported"),
    ("v2", dict(V2, n_group=3), "n_group 3 and topk_group 1 do not fit 8 experts"),
    ("v2", dict(V2, num_experts_per_tok=3), "num_experts_per_tok 3 must be between 1 and the experts"),
    ("v3", dict(V3, rope_parameters=dict(rope_type="dynamic", rope_theta=1e4, factor=2.0)), "rope type 'dynamic'"),
])
def test_unservable_config_is_refused_in_one_line(kind, fields, message, v3_checkpoint):
    from brigade.config import BrigadeConfig, ModelConfig
    from brigade.model_executor.models.deepseek import DeepseekV2ForCausalLM, DeepseekV3ForCausalLM

    path, _ = v3_checkpoint
    cfg = transformers.DeepseekV3Config if kind == "v3" else transformers.DeepseekV2Config
    cls = DeepseekV3ForCausalLM if kind == "v3" else DeepseekV2ForCausalLM
    with pytest.raises(ConfigError, match=message) as info:
        cls.check_config(cfg(**fields), BrigadeConfig(model_config=ModelConfig(model=str(path))))
    assert "\n" not in str(info.value)
