"""Online ``--quantization fp8`` on Phi-3, whose checkpoint fuses q/k/v into ``qkv_proj`` and gate/up into
``gate_up_proj``: the fused tensors load whole into Brigade's merged layers and are quantized there (e4m3 weights,
one fp32 scale per output row, dequantizing to the checkpoint's tensor within e4m3's rounding), and the greedy tokens
of prompts past the 32-token window and the original length follow the unquantized model's, logprobs close."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

from brigade import LLM, SamplingParams

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "model_executor"))
from family_checkpoints import family_config, save_family_checkpoint  # noqa: E402

FP8_DTYPE = torch.float8_e4m3fn
PROJECTIONS = ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")


def _greedy(llm: LLM, prompts: list[list[int]]) -> list[tuple[list[int], list[float]]]:
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, logprobs=1)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [(list(o.outputs[0].token_ids), [lp[t].logprob for lp, t in zip(o.outputs[0].logprobs,
                                                                            o.outputs[0].token_ids)])
            for o in outs]


def test_fused_projections_quantize_and_follow_the_unquantized_model(tmp_path):
    path = tmp_path / "phi3"
    save_family_checkpoint(family_config("phi3"), path)
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 256, (n,), generator=gen).tolist() for n in (70, 90, 75)]
    kwargs = dict(dtype="float32", skip_tokenizer_init=True, max_model_len=128, block_size=16)
    base = _greedy(LLM(str(path), **kwargs), prompts)
    llm = LLM(str(path), quantization="fp8", **kwargs)
    got = _greedy(llm, prompts)

    model = llm.engine.core.executor.worker.model_runner.model
    checkpoint = load_file(str(path / "model.safetensors"))
    for i, layer in enumerate(model.model.layers):
        for name in PROJECTIONS:
            linear = layer.get_submodule(name)
            assert linear.weight.dtype == FP8_DTYPE and linear.weight_scale.shape == (linear.output_size,)
            want = checkpoint[f"model.layers.{i}.{name}.weight"]
            back = linear.weight.float() * linear.weight_scale[:, None]
            # e4m3 keeps 3 mantissa bits: each element within 1/16 of its row's largest magnitude
            bound = want.abs().amax(dim=1, keepdim=True) / 16
            assert ((back - want).abs() <= bound).all(), (i, name)
    drift = []
    for (tokens, logprobs), (want_tokens, want_logprobs) in zip(got, base):
        assert tokens[:4] == want_tokens[:4]
        drift += [abs(a - b) for a, b in zip(logprobs[:4], want_logprobs[:4])]
    assert 0 < max(drift) < 0.05, drift
