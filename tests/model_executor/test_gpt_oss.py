"""gpt-oss (``GptOssForCausalLM``) against transformers' own class on a tiny random-weight checkpoint (fp32, CPU):
4 layers alternating sliding (window 16) and full attention, non-zero sinks, YaRN rope, 4 experts top-2 with random
biases and weights large enough that the clamped SwiGLU clamps. Greedy tokens are transformers' for prompts several
windows long, batched under chunked prefill, preemption and prefix caching, on one rank and over two gloo ranks
(``-tp 2``, and ``-tp 2 --enable-expert-parallel``). Also: YaRN's frequencies and attention factor equal
transformers' ``_compute_yarn_parameters``; the experts (router, biases, activation) equal ``GptOssMLP``; an MXFP4
checkpoint (random FP4 codes and E8M0 scales packed as the format defines) loads as transformers dequantizes it;
a config Brigade cannot serve is refused in one line."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import safetensors.torch
import torch
import transformers
from moe_checkpoints import greedy_reference

from brigade import LLM, SamplingParams
from brigade.config import ConfigError

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "distributed"))
from parallel_check import run_check  # noqa: E402

WINDOW = 16
CONFIG = dict(vocab_size=256, hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
              head_dim=16, intermediate_size=32, num_local_experts=4, num_experts_per_tok=2, sliding_window=WINDOW,
              max_position_embeddings=256, rms_norm_eps=1e-5, initializer_range=0.1, tie_word_embeddings=False,
              layer_types=["sliding_attention", "full_attention"] * 2, bos_token_id=None, eos_token_id=None,
              pad_token_id=None,
              rope_parameters=dict(rope_type="yarn", rope_theta=150000.0, factor=4.0, beta_fast=32.0, beta_slow=1.0,
                                   truncate=False, original_max_position_embeddings=64))
PROMPT_LENS = (40, 70, 100, 23, 55)  # 1.5 to 6 windows
MAX_NEW_TOKENS = 64
# 28 blocks: two KV cache groups (sliding, full) of 2 layers share 2 KV tensors, so a block id costs 2 layers' pages:
# the memory of 14 blocks of all 4 layers.
ENGINE = dict(dtype="float32", max_model_len=192, block_size=16, num_gpu_blocks_override=28,
              max_num_batched_tokens=32, max_num_seqs=5, enable_prefix_caching=True, skip_tokenizer_init=True)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def gpt_oss_config(**fields) -> transformers.GptOssConfig:
    return transformers.GptOssConfig(**{**CONFIG, **fields}, architectures=["GptOssForCausalLM"])


def build_model(config, seed: int = 0) -> transformers.GptOssForCausalLM:
    """transformers' model with every parameter random, the ones it zeroes too: sinks, expert biases; the gate/up
    weights are scaled so that gate and up pass the SwiGLU limit on some channels."""
    torch.manual_seed(seed)
    model = transformers.GptOssForCausalLM(config).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.sinks.normal_(0.0, 1.0)
            experts = layer.mlp.experts
            experts.gate_up_proj.normal_(0.0, 1.0)
            experts.gate_up_proj_bias.normal_(0.0, 0.5)
            experts.down_proj_bias.normal_(0.0, 0.5)
            layer.mlp.router.bias.normal_(0.0, 0.5)
    return model


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """(folder, transformers' model) of the tiny gpt-oss, saved as safetensors."""
    path = tmp_path_factory.mktemp("gpt-oss")
    model = build_model(gpt_oss_config())
    model.save_pretrained(str(path))
    return path, model


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(3)
    return [torch.randint(0, 256, (n,), generator=gen).tolist() for n in PROMPT_LENS]


def test_yarn_matches_transformers():
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from brigade.model_executor.layers.rotary_embedding import attention_factor, compute_inv_freq, get_rope_parameters
    cases = [dict(), dict(truncate=True), dict(factor=32.0, original_max_position_embeddings=4096, truncate=False),
             dict(attention_factor=1.3), dict(beta_fast=8.0, beta_slow=2.0)]
    for extra in cases:
        config = gpt_oss_config(rope_parameters={**CONFIG["rope_parameters"], **extra})
        want_freq, want_factor = ROPE_INIT_FUNCTIONS["yarn"](config)
        rope = get_rope_parameters(config)
        got_freq = compute_inv_freq(16, rope, config.max_position_embeddings)
        assert torch.equal(got_freq, want_freq), extra
        assert attention_factor(16, rope, config.max_position_embeddings) == pytest.approx(want_factor, rel=1e-12)


def test_router_and_experts_match_transformers(checkpoint):
    """Brigade's sparse block (router with bias, top-k then softmax, biased clamped-SwiGLU experts on FusedMoE)
    loaded from the checkpoint gives ``GptOssMLP``'s output, clamps included."""
    from brigade.attention.reference import ReferenceAttentionBackend
    from brigade.model_executor.models.gpt_oss import GptOssForCausalLM
    from brigade.model_executor.weight_utils import safetensors_weights_iterator

    path, hf = checkpoint
    model = GptOssForCausalLM(hf.config, dtype=torch.float32, attn_backend=ReferenceAttentionBackend)
    loaded = model.load_weights(safetensors_weights_iterator(str(path)))
    assert "model.layers.0.mlp.experts.gate_up_proj" in loaded and "model.layers.3.self_attn.sinks" in loaded
    x = torch.randn(37, 64, generator=torch.Generator().manual_seed(1)) * 2
    for i in range(4):
        want, _ = hf.model.layers[i].mlp(x[None])
        got = model.model.layers[i].mlp.moe(x)
        torch.testing.assert_close(got, want[0], rtol=1e-5, atol=1e-5)
    gate_up = x @ hf.model.layers[0].mlp.experts.gate_up_proj[0] + hf.model.layers[0].mlp.experts.gate_up_proj_bias[0]
    assert (gate_up[:, ::2] > 7.0).any() and (gate_up[:, 1::2].abs() > 7.0).any(), "the clamps should act"
    sinks = model.model.layers[1].self_attn.attn.sinks
    assert torch.equal(sinks, hf.model.layers[1].self_attn.sinks.float()) and sinks.abs().min() > 0


def test_greedy_tokens_equal_transformers(checkpoint, prompts):
    path, hf = checkpoint
    expected = greedy_reference(hf, prompts, MAX_NEW_TOKENS)
    llm = LLM(str(path), **ENGINE)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW_TOKENS, ignore_eos=True)
    got = [list(o.outputs[0].token_ids) for o in llm.generate([{"prompt_token_ids": p} for p in prompts], params,
                                                               use_tqdm=False)]
    assert got == expected
    again = [list(o.outputs[0].token_ids) for o in llm.generate([{"prompt_token_ids": p} for p in prompts[1:3]],
                                                                 params, use_tqdm=False)]
    assert again == expected[1:3]  # their full prompt blocks come from the prefix cache
    assert llm.engine.core.scheduler.num_preemptions_total > 0, "the 28-block pool should have forced preemption"
    stats = llm.get_kv_cache_stats()
    assert stats["num_free_blocks"] == stats["num_total_blocks"], "KV blocks leaked"
    llm.engine.core.shutdown()


def test_tp2_and_expert_parallel_greedy_tokens_match_transformers(checkpoint, prompts):
    path, hf = checkpoint
    short = [p[:40] for p in prompts[:3]]  # 2.5 windows each, 24 new tokens: four 64-token requests' worth
    expected = greedy_reference(hf, short, 24)
    got = run_check(path, "fork", "auto", "2x1,2x1+ep", prompts=short, max_tokens=24, max_model_len=64,
                    max_num_batched_tokens=16, num_gpu_blocks_override=24, block_size=8)
    for layout in ("2x1", "2x1+ep"):
        seen = got[layout]
        assert seen["tokens"] == expected, layout
        assert seen["again"] == expected[2:], layout
        assert seen["preemptions"] > 0, layout
        assert seen["kv"]["num_free_blocks"] == seen["kv"]["num_total_blocks"], seen["kv"]
        assert not any(seen["alive"]), "workers must exit on shutdown"


def _pack_mxfp4(shape: tuple[int, ...], gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Random MXFP4 tensors for a weight of ``shape`` [E, out, in]: blocks [E, out, in/32, 16] uint8 (two codes a
    byte, the even element in the low nibble) and scales [E, out, in/32] uint8 (E8M0, exponents -6 to 1)."""
    *rows, cols = shape
    codes = torch.randint(0, 16, (*rows, cols // 32, 32), generator=gen, dtype=torch.uint8)
    blocks = codes[..., 0::2] | (codes[..., 1::2] << 4)
    scales = torch.randint(127 - 6, 127 + 2, (*rows, cols // 32), generator=gen, dtype=torch.uint8)
    return blocks, scales


def test_mxfp4_checkpoint_dequantizes_as_transformers(checkpoint, tmp_path):
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    from brigade.config import ModelConfig
    from brigade.attention.reference import ReferenceAttentionBackend
    from brigade.model_executor.loader import load_model

    path, hf = checkpoint  # hidden 64 and intermediate 32: whole MXFP4 blocks of 32 along both inputs
    tensors = safetensors.torch.load_file(str(next(Path(path).glob("*.safetensors"))))
    gen = torch.Generator().manual_seed(5)
    want = {}
    for name in [n for n in tensors if n.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
        experts, rows, cols = tensors.pop(name).shape  # transformers' [E, in, out]
        tensors[f"{name}_blocks"], tensors[f"{name}_scales"] = _pack_mxfp4((experts, cols, rows), gen)
        want[name] = convert_moe_packed_tensors(tensors[f"{name}_blocks"], tensors[f"{name}_scales"],
                                                dtype=torch.float32)  # transformers' layout, [E, in, out]
    safetensors.torch.save_file(tensors, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    raw = hf.config.to_dict()
    raw["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": ["router", "self_attn",
                                                                                      "lm_head", "embed_tokens"]}
    (tmp_path / "config.json").write_text(json.dumps(raw))
    hf_config = transformers.AutoConfig.from_pretrained(str(tmp_path))
    model = load_model(ModelConfig(model=str(tmp_path)), hf_config, dtype=torch.float32,
                       device=torch.device("cpu"), attn_backend=ReferenceAttentionBackend)
    for name, dequantized in want.items():
        experts = model.get_submodule(name.rsplit(".", 1)[0])
        if name.endswith("gate_up_proj"):
            w13 = dequantized.transpose(1, 2)  # [E, 2I, H], rows interleaving gate and up
            assert torch.equal(experts.w13_weight, torch.cat([w13[:, 0::2], w13[:, 1::2]], dim=1)), name
        else:
            assert torch.equal(experts.w2_weight, dequantized.transpose(1, 2)), name
    assert model.model.layers[0].mlp.experts.w13_weight.abs().max() > 1.0  # real scales, not all ones


def test_unservable_config_is_refused_in_one_line(checkpoint):
    from brigade.config import BrigadeConfig, ModelConfig
    from brigade.model_executor.models.gpt_oss import GptOssForCausalLM

    path, _ = checkpoint
    brigade_config = BrigadeConfig(model_config=ModelConfig(model=str(path)))
    bad_rope = gpt_oss_config(rope_parameters=dict(rope_type="dynamic", rope_theta=1e4, factor=2.0))
    with pytest.raises(ConfigError) as err:
        GptOssForCausalLM.check_config(bad_rope, brigade_config)
    assert "'dynamic'" in str(err.value) and "yarn" in str(err.value) and "\n" not in str(err.value)
    bad_layers = gpt_oss_config()
    bad_layers.layer_types = ["sliding_attention", "chunked_attention", "full_attention", "full_attention"]
    with pytest.raises(ConfigError, match="chunked_attention"):
        GptOssForCausalLM.check_config(bad_layers, brigade_config)
    GptOssForCausalLM.check_config(gpt_oss_config(), brigade_config)  # the tiny model itself is served
