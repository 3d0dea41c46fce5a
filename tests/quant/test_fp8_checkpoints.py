"""Serialized FP8 checkpoints chosen from config.json without a flag, on the CPU, against transformers.

SmolLM2-135M-Instruct is written by llm-compressor as each compressed-tensors FP8 scheme users publish: ``FP8``
(static per-tensor), ``FP8_DYNAMIC`` (per-channel weights, per-token activations) and ``FP8_BLOCK`` (128x128 weight
blocks); a small random-weight Llama (hidden 256, heads of 64) as ``quant_method: "fp8"`` per-tensor (static
``input_scale``) and block (``weight_scale_inv``) checkpoints, written by hand (``fp8_checkpoint``). Brigade's
log-probabilities of each token of one fixed text (prompt logprobs, fp32) must stay within the FP8 tolerance stated
per case of transformers' on the same checkpoint (transformers runs compressed-tensors checkpoints itself,
quantizing activations as the scheme says, except FP8_BLOCK's groups on SmolLM2, quantized by a hook; for
``quant_method: "fp8"``, which transformers runs only on GPUs, the reference is the dequantized fp32 weights, so the
tolerance also covers Brigade's activation rounding), and closer to it than to the unquantized model. Bad scales and
unsupported schemes are one line.
"""

from __future__ import annotations

import json

import pytest
import torch
from fp8_checkpoint import compressed_tensors_checkpoint, fp8_checkpoint, llm_compressor_checkpoint, tiny_llama
from safetensors.torch import load_file, save_file

from brigade import LLM, SamplingParams
from brigade_fp8.method import Fp8LinearMethod

GEN = torch.Generator().manual_seed(1)
TEXT = torch.randint(0, 512, (64,), generator=GEN).tolist()
CALIBRATION = [torch.randint(0, 512, (48,), generator=GEN).tolist() for _ in range(2)]


def _fake_quant(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return (x / scale).clamp(-448.0, 448.0).to(torch.float8_e4m3fn).float() * scale


def fp8_activation_hooks(model, input_scales: dict[str, torch.Tensor] | None, group: int | None) -> None:
    """Quantize every linear layer's input to FP8 and back (fake quantization) in a transformers model: with the
    layer's static scale from ``input_scales`` (checkpoint name -> scale), or dynamically per ``group`` columns."""
    for name, module in model.named_modules():
        if not isinstance(module, torch.nn.Linear) or name == "lm_head":
            continue
        if input_scales is not None:
            scale = input_scales[name + ".input_scale"].float()
            module.register_forward_pre_hook(lambda mod, args, s=scale: (_fake_quant(args[0], s),))
        else:
            def hook(mod, args):
                k = args[0].shape[-1]  # the last group of a row may be short (SmolLM2's 576 columns, groups of 128)
                x = torch.nn.functional.pad(args[0], (0, -k % group)).unflatten(-1, (-1, group))
                return (_fake_quant(x, x.abs().amax(-1, keepdim=True) / 448.0).flatten(-2)[..., :k],)
            module.register_forward_pre_hook(hook)
            scheme = getattr(module, "quantization_scheme", None)
            if scheme is not None:  # compressed-tensors' own activation quantization is replaced by the hook
                scheme.input_activations = None


def hf_logprobs(path, activations=None, text: list[int] = TEXT) -> torch.Tensor:
    """transformers' log-probability of each token of ``text`` after the first, fp32 on the CPU: [len - 1];
    ``activations`` (the arguments of ``fp8_activation_hooks``) adds the FP8 activation rounding to a dequantized
    checkpoint."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    if activations is not None:
        fp8_activation_hooks(model, *activations)
    with torch.inference_mode():
        logits = model(torch.tensor([text])).logits[0].float()
    return torch.log_softmax(logits[:-1], -1).gather(1, torch.tensor(text[1:])[:, None])[:, 0]


def brigade_logprobs(path, text: list[int] = TEXT) -> tuple[torch.Tensor, torch.nn.Module]:
    """Brigade's prompt logprobs of ``text`` (fp32, CPU, the checkpoint's method chosen from its config.json) and
    the loaded model."""
    llm = LLM(str(path), dtype="float32", skip_tokenizer_init=True, max_model_len=256, kv_cache_memory_gib=0.05)
    out = llm.generate([text], SamplingParams(max_tokens=1, prompt_logprobs=0), use_tqdm=False)[0]
    rows = out.prompt_logprobs[1:]
    model = llm.engine.core.executor.worker.model_runner.model
    return torch.tensor([row[t].logprob for row, t in zip(rows, text[1:])]), model


@pytest.fixture(scope="module")
def unquantized(tmp_path_factory):
    path = tmp_path_factory.mktemp("fp32")
    tiny_llama().save_pretrained(path)
    return hf_logprobs(path)


def _check(path, reference: torch.Tensor, unquantized: torch.Tensor, tol: float,
           text: list[int] = TEXT) -> torch.nn.Module:
    got, model = brigade_logprobs(path, text)
    err = (got - reference).abs().max().item()
    drift = (got - unquantized).abs().max().item()
    assert err < tol, (err, drift)
    assert err < drift, (err, drift)  # Brigade follows the quantized model, not the original weights
    qkv = model.model.layers[0].self_attn.qkv_proj
    assert isinstance(qkv.quant_method, Fp8LinearMethod)
    assert qkv.weight.dtype == torch.float8_e4m3fn
    assert model.lm_head.weight.dtype == torch.float32 or model.lm_head.weight is model.model.embed_tokens.weight
    return model


SMOLLM2_TEXT = ("The library opens at nine in the morning. Students come in with their laptops and look for a quiet "
                "table near the windows, where the light is good and nobody talks. By noon every seat is taken.")
SMOLLM2_CALIBRATION = ["Write a short poem about the moon.", "What is the capital of France? Paris is the capital.",
                       "def add(a, b):\n    return a + b"]


@pytest.fixture(scope="module")
def smollm2_texts(smollm2_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_path)
    return tokenizer(SMOLLM2_TEXT)["input_ids"], [tokenizer(t)["input_ids"] for t in SMOLLM2_CALIBRATION]


@pytest.fixture(scope="module")
def smollm2_fp32(smollm2_path, smollm2_texts):
    return hf_logprobs(smollm2_path, text=smollm2_texts[0])


# SmolLM2-135M-Instruct written by llm-compressor in each scheme (fp32 weights in, FP8 checkpoint out), served by
# Brigade and by transformers (which runs compressed-tensors checkpoints on the CPU by decompressing them and
# quantizing the activations as the scheme says). Each FP8 layer of Brigade equals transformers' on the same input
# to fp32 rounding (2e-6 of 9-43 measured), but with activations rounded to e4m3 at every layer a 30-layer model
# is chaotic: an input perturbed by 1e-7 (relative) moves transformers' own logprobs of the text by 0.13 nats on
# average and 0.43 at most (SmolLM2 in fp32 without FP8: 0.0). So the tolerance is that sensitivity: mean
# |difference| under 0.2 and largest under 1.0 nats (FP8_DYNAMIC's largest is 0.93 with the current llm-compressor
# and compressed-tensors builds, on one of the 40 tokens), and well closer to the checkpoint than to the unquantized
# model (quantization moves them by 0.21-0.29 on average).
@pytest.mark.parametrize("scheme", ["FP8", "FP8_DYNAMIC", "FP8_BLOCK"])
def test_llm_compressor_checkpoint_of_smollm2_tracks_transformers(scheme, tmp_path, smollm2_path, smollm2_texts,
                                                                  smollm2_fp32):
    from transformers import AutoModelForCausalLM

    text, calibration = smollm2_texts
    model = AutoModelForCausalLM.from_pretrained(smollm2_path, dtype=torch.float32)
    path = llm_compressor_checkpoint(model, tmp_path / scheme, scheme, calibration)
    config = json.loads((path / "config.json").read_text())["quantization_config"]
    assert config["quant_method"] == "compressed-tensors" and config["format"] == "float-quantized"
    # compressed-tensors cannot quantize 1x128 activation groups of a 576-column input (it needs whole groups), so
    # for FP8_BLOCK transformers runs the library's decompressed weights with the groups quantized by a hook.
    reference = hf_logprobs(path, (None, 128) if scheme == "FP8_BLOCK" else None, text)
    got, model = brigade_logprobs(path, text)
    err, drift = (got - reference).abs(), (got - smollm2_fp32).abs()
    assert err.mean() < 0.2 and err.max() < 1.0, (err.mean(), err.max())
    assert err.mean() < 0.75 * drift.mean(), (err.mean(), drift.mean())  # it runs the quantized model
    qkv = model.model.layers[0].self_attn.qkv_proj
    assert isinstance(qkv.quant_method, Fp8LinearMethod) and qkv.weight.dtype == torch.float8_e4m3fn
    assert (qkv.input_scale is not None) == (scheme == "FP8")
    # SmolLM2's q/k/v (576, 192, 192 rows) end inside 128-row blocks: one scale row per output row.
    assert qkv.weight_scale.shape == {"FP8": (960,), "FP8_DYNAMIC": (960,), "FP8_BLOCK": (960, 5)}[scheme]


@pytest.mark.parametrize("block,static", [(None, True), ((128, 128), False)], ids=["per-tensor-static", "block"])
def test_fp8_checkpoint_tracks_its_dequantized_weights(block, static, tmp_path, unquantized):
    path, ref = fp8_checkpoint(tiny_llama(), tmp_path / "fp8", tmp_path / "ref", block=block,
                               calibration=CALIBRATION if static else None)
    scales = load_file(str(path / "model.safetensors")) if static else None
    model = _check(path, hf_logprobs(ref, (scales, None if static else block[1])), unquantized, 0.08)
    qkv = model.model.layers[0].self_attn.qkv_proj
    assert qkv.weight_scale.shape == ((qkv.output_size,) if block is None else (qkv.output_size // block[0], 2))


@pytest.fixture(scope="module")
def fp8_dynamic_dir(tmp_path_factory):
    return compressed_tensors_checkpoint(tiny_llama(), tmp_path_factory.mktemp("ct") / "m", "FP8_DYNAMIC",
                                         CALIBRATION)


@pytest.mark.parametrize("value,needle", [
    (float("nan"), "weight_scale has 1 value(s) that are not finite and positive (e.g. nan)"),
    (0.0, "weight_scale has 1 value(s) that are not finite and positive (e.g. 0.0)"),
])
def test_bad_scale_is_one_line_at_load(fp8_dynamic_dir, tmp_path, value, needle):
    bad = tmp_path / "bad"
    bad.mkdir()
    for f in fp8_dynamic_dir.iterdir():
        (bad / f.name).write_bytes(f.read_bytes())
    tensors = load_file(str(bad / "model.safetensors"))
    tensors["model.layers.1.mlp.down_proj.weight_scale"][5] = value
    save_file(tensors, str(bad / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError) as info:
        brigade_logprobs(bad)
    message = str(info.value)
    assert "FP8 layer model.layers.1.mlp.down_proj: " + needle in message and "\n" not in message


def test_wrong_scale_shape_is_one_line_at_load(fp8_dynamic_dir, tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    for f in fp8_dynamic_dir.iterdir():
        (bad / f.name).write_bytes(f.read_bytes())
    tensors = load_file(str(bad / "model.safetensors"))
    tensors["model.layers.0.self_attn.o_proj.weight_scale"] = torch.ones(1)
    save_file(tensors, str(bad / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError) as info:
        brigade_logprobs(bad)
    assert "model.layers.0.self_attn.o_proj.weight_scale" in str(info.value)
    assert "does not fit parameter of shape (256, 1)" in str(info.value) and "\n" not in str(info.value)


# ---- refused at start-up, in one line ------------------------------------------------------------------

def _ct(weights: dict, inputs: dict | None, fmt: str = "float-quantized") -> dict:
    group = {"targets": ["Linear"], "weights": weights, "input_activations": inputs, "format": fmt}
    return {"quant_method": "compressed-tensors", "format": fmt, "config_groups": {"group_0": group},
            "ignore": ["lm_head"], "quantization_status": "compressed"}


FLOAT8 = {"num_bits": 8, "type": "float", "symmetric": True, "dynamic": False}
TOKEN = {"num_bits": 8, "type": "float", "symmetric": True, "dynamic": True, "strategy": "token"}


@pytest.mark.parametrize("qc,needle", [
    (_ct({**FLOAT8, "type": "int", "strategy": "channel"}, {**TOKEN, "type": "int"}, "int-quantized"),
     "compressed-tensors checkpoint: format 'int-quantized' (group 'group_0') is not supported; brigade-fp8 runs"),
    (_ct({**FLOAT8, "type": "int", "num_bits": 4, "strategy": "group", "group_size": 128}, None, "float-quantized"),
     "compressed-tensors checkpoint: group 'group_0' weights 4-bit int group is not supported"),
    (_ct({**FLOAT8, "strategy": "channel"}, None),
     "compressed-tensors checkpoint: group 'group_0' with weight-only FP8 (no input_activations) is not supported"),
    (_ct({**FLOAT8, "strategy": "channel"}, {**TOKEN, "dynamic": False}),
     "compressed-tensors checkpoint: its quantization_config is invalid: 2 validation errors"),  # the library's
    ({**_ct({**FLOAT8, "strategy": "channel"}, TOKEN), "kv_cache_scheme": {**FLOAT8, "type": "int"}},
     "compressed-tensors checkpoint: a kv_cache_scheme other than static per-tensor FP8 (8-bit int tensor) is not"),
    ({"quant_method": "fp8", "activation_scheme": "static", "weight_block_size": [128, 128]},
     "FP8 checkpoint with weight_block_size and activation_scheme 'static' is not supported"),
    ({"quant_method": "fp8", "weight_block_size": [128]},
     "FP8 checkpoint with weight_block_size [128] is not supported; expected two positive integers"),
    ({"quant_method": "fp8", "fmt": "e5m2"}, "FP8 checkpoint with fmt 'e5m2' is not supported"),
], ids=["int8", "w4a16", "weight-only", "invalid-for-the-library", "kv-cache", "block-static", "bad-block", "e5m2"])
def test_unsupported_fp8_checkpoints_are_refused_by_serves_checks(smollm2_path, tmp_path, qc, needle):
    from quant_model_utils import serve_check_refusal

    refusal = serve_check_refusal(smollm2_path, tmp_path / "m", qc)
    assert needle in refusal, refusal
