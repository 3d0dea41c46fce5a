"""Online FP8 (``--quantization fp8``) on mixture-of-experts models, end to end on the CPU in fp32.

Brigade quantizes the routed experts at load (``brigade_fp8.moe_method``: one fp32 scale per expert and output
channel) and runs them W8A16 through the reference fused MoE, and the attention and shared-expert projections W8A8
(``Fp8LinearMethod``: per-channel weights, per-token activations, emulated in fp32 on the CPU). The reference is
transformers on the same arithmetic: its stacked experts replaced by Brigade's own FP8 codes times their scales
(read from the engine's model, so the check also covers the load-time quantization), and each of its linear layers
that Brigade quantizes replaced by the same W8A8 product (``brigade_fp8.gemm.fp8_gemm_emulated``) on the same
per-channel codes. Greedy tokens must be identical, the experts must be ``float8_e4m3fn`` in memory (a quarter of
their fp32 bytes) and the start-up line must name what got which method. Under two gloo ranks, experts sliced
(``-tp 2``) give what whole experts per rank (``--enable-expert-parallel``) give, and both stay as close to the
unquantized model as ``-tp 1``."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest
import torch
from moe_checkpoints import moe_config, num_experts, save_moe_checkpoint
from torch import nn

from brigade import LLM, SamplingParams
from brigade_fp8.gemm import fp8_gemm_emulated
from brigade_fp8.quantize import FP8_DTYPE, quantize_fp8_per_channel

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "distributed"))
from parallel_check import MAX_TOKENS, PROMPTS, hf_prompt_logprobs, run_check  # noqa: E402

SMALL = dict(vocab_size=256, max_position_embeddings=128)

# One intra-op thread: transformers' MoE adds each expert's output with ``index_add_``, slow in parallel on 2 cores.
pytestmark = pytest.mark.usefixtures("one_torch_thread")


class W8A8Linear(nn.Module):
    """An HF ``nn.Linear`` computed as Brigade's online FP8 linear layer computes it on the CPU."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.qweight, self.scale = quantize_fp8_per_channel(linear.weight.data)
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = fp8_gemm_emulated(x.reshape(-1, x.shape[-1]), self.qweight, self.scale, None, self.bias)
        return out.reshape(*x.shape[:-1], -1)


def as_brigade_computes_it(hf_model, brigade_model) -> None:
    """Make ``hf_model`` compute what Brigade's FP8 model does: Brigade's dequantized experts, W8A8 projections."""
    for hf_layer, layer in zip(hf_model.model.layers, brigade_model.model.layers):
        experts = layer.mlp.experts
        hf_layer.mlp.experts.gate_up_proj.data = experts.w13_weight.float() * experts.w13_weight_scale[..., None]
        hf_layer.mlp.experts.down_proj.data = experts.w2_weight.float() * experts.w2_weight_scale[..., None]
        parents = [hf_layer.self_attn] + ([hf_layer.mlp.shared_expert] if hasattr(hf_layer.mlp, "shared_expert")
                                          else [])
        for parent in parents:
            for name, child in list(parent.named_children()):
                if isinstance(child, nn.Linear):
                    setattr(parent, name, W8A8Linear(child))


def hf_greedy(model) -> list[list[int]]:
    outs = []
    with torch.inference_mode():
        for prompt in PROMPTS:
            ids = torch.tensor([prompt])
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=MAX_TOKENS,
                                 min_new_tokens=MAX_TOKENS, do_sample=False, eos_token_id=[], pad_token_id=0)
            outs.append(out[0, len(prompt):].tolist())
    return outs


@pytest.mark.parametrize("family", ["mixtral", "qwen2-moe", "qwen3-moe"])
def test_fp8_experts_give_transformers_tokens_on_the_dequantized_weights(family, tmp_path, caplog):
    config = moe_config(family, **SMALL)
    hf_model = save_moe_checkpoint(config, tmp_path)
    with caplog.at_level(logging.INFO, logger="brigade"):
        llm = LLM(str(tmp_path), dtype="float32", quantization="fp8", max_model_len=64, skip_tokenizer_init=True,
                  block_size=8, num_gpu_blocks_override=16, max_num_batched_tokens=8)  # chunked prefill
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS],
                        SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True), use_tqdm=False)
    model = llm.engine.core.executor.worker.model_runner.model

    inter = getattr(config, "moe_intermediate_size", None) or config.intermediate_size
    e, h = num_experts(config), config.hidden_size
    for layer in model.model.layers:
        experts = layer.mlp.experts
        assert experts.w13_weight.dtype == experts.w2_weight.dtype == FP8_DTYPE
        assert experts.w13_weight_scale.shape == (e, 2 * inter) and experts.w2_weight_scale.shape == (e, h)
        assert experts.w13_weight_scale.dtype == experts.w2_weight_scale.dtype == torch.float32
        assert experts.w13_weight.numel() * experts.w13_weight.element_size() == e * 2 * inter * h  # 1 byte each
        assert layer.mlp.gate.weight.dtype == torch.float32  # the router stays in the model dtype
        if family == "qwen2-moe":
            assert layer.mlp.shared_expert.gate_up_proj.weight.dtype == FP8_DTYPE
            assert layer.mlp.shared_expert_gate.weight.dtype == torch.float32
    summary = [r.getMessage() for r in caplog.records if r.getMessage().startswith("quantization:")]
    # e.g. "quantization: fp8 for qkv_proj, o_proj and experts; gate, embeddings and lm_head in float32"
    fp8_part, rest = summary[-1].split(";", 1)
    assert "experts" in fp8_part and "gate" not in fp8_part.replace("gate_up", "") and "gate" in rest, summary

    as_brigade_computes_it(hf_model, model)
    assert [list(o.outputs[0].token_ids) for o in outs] == hf_greedy(hf_model)
    llm.engine.core.shutdown()


def test_fp8_experts_sliced_over_tp2_equal_whole_experts_and_stay_as_close_as_tp1(tmp_path):
    """Two gloo ranks: every expert sliced (-tp 2: w13's scales slice with its rows, w2's row maxima are reduced
    over the ranks) or whole experts per rank (-tp 2 --enable-expert-parallel). Both layouts run the same
    attention, so their FP8 experts must agree: the same tokens and prompt logprobs (to fp32 rounding) show that the
    sliced experts hold -tp 1's FP8 codes and scales (per-rank w2 scales would not). Against -tp 1 the attention's
    o_proj differs: it is W8A8 with per-token activation scales over each rank's input columns (as for dense
    models, tests/distributed/test_fp8_under_tp.py), which rounds differently, so there the logprobs are compared:
    -tp 2 stays as close to the unquantized model as -tp 1."""
    config = moe_config("mixtral", **SMALL)
    save_moe_checkpoint(config, tmp_path)
    got = run_check(tmp_path, "fork", "auto", "1x1,2x1,2x1+ep", request={"prompt_logprobs": True}, quantization="fp8")
    base = hf_prompt_logprobs(tmp_path)

    def gap(a, b):
        return max(abs(x - y) for p, q in zip(a, b) for x, y in zip(p, q))

    one, sliced, whole = (got[layout]["prompt_logprobs"] for layout in ("1x1", "2x1", "2x1+ep"))
    assert got["2x1"]["tokens"] == got["2x1+ep"]["tokens"] and gap(sliced, whole) < 1e-5, gap(sliced, whole)
    # quantized (not the unquantized model), and -tp 2 as close to it as -tp 1 (measured 0.18 and 0.15)
    assert 0.01 < gap(one, base) < 0.3 and gap(sliced, base) < 0.3 and gap(one, sliced) < 0.3, \
        (gap(one, base), gap(sliced, base), gap(one, sliced))
    fp8_bytes = config.num_hidden_layers * num_experts(config) * 3 * config.intermediate_size * config.hidden_size
    for layout in ("2x1", "2x1+ep"):
        # half of the FP8 experts per rank, plus their fp32 scales (under 10% here; a quarter of the fp32 bytes)
        assert all(fp8_bytes // 2 < b < 0.55 * fp8_bytes for b in got[layout]["expert_param_bytes"]), got[layout]
