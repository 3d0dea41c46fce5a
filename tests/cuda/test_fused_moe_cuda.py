"""brigade-cuda's fused MoE on the GPU: the Triton kernels against the PyTorch reference on fresh random inputs
(bf16, relative error < 1e-2, never NaN) at Mixtral-8x7B's and Qwen3-30B-A3B's expert shapes and 1 to 4096 tokens;
captured in a CUDA graph and replayed on new inputs; bound by layers built on CUDA; and a tiny MoE model on the
whole engine (CUDA graphs, chunked prefill) against transformers' greedy tokens. FP8 experts (online
``--quantization fp8``: W8A16, per-channel scales) against the reference on the same dequantized weights at 1 to 512
tokens (bf16, relative error < 2e-2, never NaN), in a CUDA graph, and bound by a layer quantized by brigade-fp8's
``Fp8MoEMethod``. Skipped without CUDA (CI)."""

from __future__ import annotations

import pytest
import torch
from moe_checkpoints import greedy_reference, moe_config, save_moe_checkpoint

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
pytest.importorskip("triton")

from brigade.model_executor.layers.fused_moe import FusedMoE, fused_moe_reference  # noqa: E402
from brigade.model_executor.layers.moe_router import select_experts  # noqa: E402
from brigade_cuda.ops.fused_moe import fused_moe, moe_align_block_size, pick_tile  # noqa: E402
from brigade_fp8.moe_method import Fp8MoEMethod  # noqa: E402
from brigade_fp8.quantize import FP8_DTYPE, fp8_scale_from_amax, quantize_fp8_rows  # noqa: E402

# name -> (experts, hidden, intermediate, top_k, renormalize), the public configs' expert shapes
SHAPES = {"mixtral-8x7b": (8, 4096, 14336, 2, True), "qwen3-30b-a3b": (128, 2048, 768, 8, True)}
TOKENS = [1, 8, 64, 512, 4096]


@pytest.fixture(scope="module")
def experts():
    """``make(name) -> (w13, w2)`` in bf16 on the GPU, random, scaled so activations stay O(1); one per shape."""
    made = {}

    def make(name):
        if name not in made:
            made.clear()  # one shape's weights at a time (Mixtral's are 2.8 GB in bf16)
            num_experts, hidden, inter, _, _ = SHAPES[name]
            gen = torch.Generator(device="cuda").manual_seed(0)
            w13 = (torch.randn(num_experts, 2 * inter, hidden, device="cuda", generator=gen) / hidden ** 0.5)
            w2 = (torch.randn(num_experts, hidden, inter, device="cuda", generator=gen) / inter ** 0.5)
            made[name] = (w13.bfloat16(), w2.bfloat16())
        return made[name]

    return make


def _routed(num_tokens: int, name: str, seed: int):
    num_experts, hidden, _, top_k, renormalize = SHAPES[name]
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(num_tokens, hidden, device="cuda", generator=gen).bfloat16()
    logits = torch.randn(num_tokens, num_experts, device="cuda", generator=gen)
    weights, ids = select_experts(logits, top_k, renormalize)
    return x, weights, ids


@pytest.mark.parametrize("num_tokens", TOKENS)
@pytest.mark.parametrize("name", sorted(SHAPES))
def test_triton_fused_moe_matches_the_reference(name, num_tokens, experts, rel_err):
    w13, w2 = experts(name)
    x, weights, ids = _routed(num_tokens, name, seed=num_tokens)
    out = fused_moe(x, w13, w2, weights, ids)
    # the reference in fp32 on the same bf16 values
    ref = fused_moe_reference(x.float(), w13.float(), w2.float(), weights, ids)
    assert out.dtype == torch.bfloat16 and out.shape == x.shape
    assert not out.isnan().any()
    assert rel_err(out, ref) < 1e-2, (name, num_tokens, pick_tile(num_tokens, *SHAPES[name][:3], SHAPES[name][3]))


def _fp8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[E, N, K] -> (codes [E, N, K] float8_e4m3fn, scales [E, N] fp32), as ``Fp8MoEMethod`` quantizes."""
    scale = fp8_scale_from_amax(w.abs().amax(dim=2))
    return quantize_fp8_rows(w, scale), scale


@pytest.mark.parametrize("num_tokens", [1, 8, 64, 512])
@pytest.mark.parametrize("name", sorted(SHAPES))
def test_triton_fp8_fused_moe_matches_the_reference(name, num_tokens, experts, rel_err):
    """W8A16: FP8 expert tiles converted to bf16 in registers, scales in the epilogue, against the reference
    (fp32) on the same FP8 codes dequantized."""
    (q13, s13), (q2, s2) = (_fp8(w) for w in experts(name))
    x, weights, ids = _routed(num_tokens, name, seed=100 + num_tokens)
    out = fused_moe(x, q13, q2, weights, ids, w13_scale=s13, w2_scale=s2)
    ref = fused_moe_reference(x.float(), q13, q2, weights, ids, w13_scale=s13, w2_scale=s2)
    assert out.dtype == torch.bfloat16 and out.shape == x.shape
    assert not out.isnan().any()
    assert rel_err(out, ref) < 2e-2, (name, num_tokens, pick_tile(num_tokens, *SHAPES[name][:3], SHAPES[name][3]))


def test_fp8_fused_moe_replays_in_a_cuda_graph(experts, rel_err):
    name = "qwen3-30b-a3b"
    (q13, s13), (q2, s2) = (_fp8(w) for w in experts(name))
    x, weights, ids = _routed(24, name, seed=11)
    fused_moe(x, q13, q2, weights, ids, w13_scale=s13, w2_scale=s2)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fused_moe(x, q13, q2, weights, ids, w13_scale=s13, w2_scale=s2)
    x2, weights2, ids2 = _routed(24, name, seed=12)
    x.copy_(x2)
    weights.copy_(weights2)
    ids.copy_(ids2)
    graph.replay()
    ref = fused_moe_reference(x.float(), q13, q2, weights, ids, w13_scale=s13, w2_scale=s2)
    assert rel_err(out, ref) < 2e-2


def test_fp8_layer_built_on_cuda_binds_the_triton_kernel(cuda_ops_registered, rel_err):
    """A bf16 layer quantized by ``Fp8MoEMethod`` (as the loader does after loading) runs the W8A16 kernel."""
    with torch.device("cuda"):
        layer = FusedMoE(8, 2, 256, 512, dtype=torch.bfloat16, quant_method=Fp8MoEMethod())
    layer.w13_weight.data.normal_(0, 256 ** -0.5)
    layer.w2_weight.data.normal_(0, 512 ** -0.5)
    layer.quant_method.process_weights_after_loading(layer)
    assert layer.impl_name == "cuda" and layer.w13_weight.dtype == layer.w2_weight.dtype == FP8_DTYPE
    assert layer.w13_weight_scale.shape == (8, 1024) and layer.w2_weight_scale.shape == (8, 256)
    x = torch.randn(5, 256, device="cuda").bfloat16()
    weights, ids = select_experts(torch.randn(5, 8, device="cuda"), 2, True)
    out = layer(x, weights, ids)
    assert not out.isnan().any() and rel_err(out, layer.forward_native(x, weights, ids)) < 2e-2


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_alignment_covers_every_assignment_once(name):
    num_experts, _, _, top_k, _ = SHAPES[name]
    _, _, ids = _routed(300, name, seed=5)
    sorted_ids, expert_ids, num_post = moe_align_block_size(ids, num_experts, 16)
    used, padding = int(num_post), ids.numel()
    real = sorted_ids[:used][sorted_ids[:used] < padding]
    assert sorted(real.tolist()) == list(range(padding))
    flat = ids.reshape(-1)
    blocks = sorted_ids[:used].view(-1, 16).long()
    owner = expert_ids[:used // 16].long()
    ok = blocks < padding
    assert (flat[blocks.clamp(max=padding - 1)][ok] == owner[:, None].expand_as(blocks)[ok]).all()


def test_fused_moe_replays_in_a_cuda_graph(experts, rel_err):
    name = "qwen3-30b-a3b"
    w13, w2 = experts(name)
    x, weights, ids = _routed(24, name, seed=1)
    fused_moe(x, w13, w2, weights, ids)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fused_moe(x, w13, w2, weights, ids)
    for seed in (2, 3):  # new tokens and new routes, same shapes
        x2, weights2, ids2 = _routed(24, name, seed=seed)
        x.copy_(x2)
        weights.copy_(weights2)
        ids.copy_(ids2)
        graph.replay()
        ref = fused_moe_reference(x.float(), w13.float(), w2.float(), weights, ids)
        assert rel_err(out, ref) < 1e-2


def test_layers_built_on_cuda_bind_the_triton_kernel(cuda_ops_registered, rel_err):
    with torch.device("cuda"):
        layer = FusedMoE(8, 2, 256, 512, dtype=torch.bfloat16)
    assert layer.impl_name == "cuda"
    layer.w13_weight.data.normal_(0, 256 ** -0.5)
    layer.w2_weight.data.normal_(0, 512 ** -0.5)
    x = torch.randn(5, 256, device="cuda").bfloat16()
    weights, ids = select_experts(torch.randn(5, 8, device="cuda"), 2, True)
    assert rel_err(layer(x, weights, ids), layer.forward_native(x, weights, ids)) < 1e-2


# The tiny MoE families of tests/moe_checkpoints.py, wider, with more experts.
WIDE = dict(vocab_size=512, hidden_size=256, max_position_embeddings=1024)
MODELS = {
    "mixtral": lambda: moe_config("mixtral", **WIDE, intermediate_size=96, num_local_experts=8),
    "qwen3-moe": lambda: moe_config("qwen3-moe", **WIDE, head_dim=64, intermediate_size=160,
                                    moe_intermediate_size=48, num_experts=16, num_experts_per_tok=4),
}


def test_expert_parallel_rank_share_on_cuda(cuda_ops_registered, rel_err):
    """A rank holding experts 4..7 of 8 (--enable-expert-parallel): the Triton kernel, given the local routing
    (other ranks' assignments at weight 0), gives the reference's share of those experts."""
    with torch.device("cuda"):
        layer = FusedMoE(8, 2, 256, 512, dtype=torch.bfloat16, ep_rank=1, ep_size=2)
    assert layer.impl_name == "cuda" and layer.w13_weight.shape[0] == 4
    layer.w13_weight.data.normal_(0, 256 ** -0.5)
    layer.w2_weight.data.normal_(0, 512 ** -0.5)
    x = torch.randn(33, 256, device="cuda").bfloat16()
    weights, ids = select_experts(torch.randn(33, 8, device="cuda"), 2, True)
    local_weights, local_ids = layer.local_routing(weights, ids)
    want = fused_moe_reference(x, layer.w13_weight, layer.w2_weight, local_weights, local_ids)
    assert rel_err(layer(x, weights, ids), want) < 1e-2


@pytest.mark.parametrize("eager", [False, True], ids=["cudagraphs", "eager"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_moe_engine_greedy_equals_transformers_on_gpu(name, eager, tmp_path):
    from brigade import LLM, SamplingParams

    config = MODELS[name]()
    model = save_moe_checkpoint(config, tmp_path)
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 512, (n,), generator=gen).tolist() for n in (3, 17, 64, 129, 7, 250)]
    expected = greedy_reference(model.cuda(), prompts, 24)
    del model
    llm = LLM(str(tmp_path), dtype="float32", skip_tokenizer_init=True, kv_cache_memory_gib=2,
              max_model_len=512, max_num_batched_tokens=128, enforce_eager=eager)
    moe = llm.engine.core.executor.worker.model_runner.model.model.layers[0].mlp.experts
    assert moe.impl_name == "cuda"
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    got = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    assert got == expected
    # Expert load counted on the device, graph padding rows left out: every forwarded token (the prompt and all
    # but the last output token) once per expert of its top-k, in each (sparse) layer.
    reported = llm.engine.core.executor.worker.model_runner.expert_counts.reported
    forwarded = sum(len(p) + 24 - 1 for p in prompts)
    assert reported.sum(dim=1).tolist() == [forwarded * config.num_experts_per_tok] * config.num_hidden_layers
    del llm
    torch.cuda.empty_cache()


@pytest.mark.parametrize("num_tokens", [1, 8, 512, 4096])
@pytest.mark.parametrize("name", sorted(SHAPES))
def test_router_kernel_matches_the_native_router_and_counts_real_rows(name, num_tokens, cuda_ops_registered):
    """The Triton top-k router (``moe_topk_router``) against ``TopKRouter.forward_native``: the same experts, weights
    within fp32 rounding, and the expert-load counts of the real rows only, also when replayed in a CUDA graph on new
    logits. fp32 logits: bf16 ones tie often, and ``torch.topk`` does not promise an order among ties."""
    from brigade.model_executor.layers.moe_router import TopKRouter

    num_experts, _, _, top_k, renormalize = SHAPES[name]
    with torch.device("cuda"):
        router = TopKRouter(top_k, renormalize)
    assert router.impl_name == "cuda"
    gen = torch.Generator(device="cuda").manual_seed(num_tokens)
    logits = torch.randn(num_tokens, num_experts, device="cuda", generator=gen)
    real = torch.tensor(max(1, num_tokens - 3), device="cuda")
    counts = torch.randint(0, 9, (num_experts,), device="cuda", generator=gen)
    want_counts = counts.clone()
    want_w, want_ids = router.forward_native(logits, want_counts, real)
    got_w, got_ids = router(logits, counts, real)
    assert got_ids.dtype == torch.int64 and got_w.dtype == torch.float32
    assert torch.equal(got_ids, want_ids)
    torch.testing.assert_close(got_w, want_w, rtol=1e-5, atol=1e-6)
    assert torch.equal(counts, want_counts)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out_w, out_ids = router(logits, counts, real)
    logits.copy_(torch.randn(num_tokens, num_experts, device="cuda", generator=gen))
    graph.replay()
    want_w, want_ids = router.forward_native(logits, want_counts, real)
    assert torch.equal(out_ids, want_ids) and torch.equal(counts, want_counts)
    torch.testing.assert_close(out_w, want_w, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("num_tokens", [1, 8, 64, 512])
def test_triton_fused_moe_with_gpt_oss_experts_matches_the_reference(num_tokens, rel_err):
    """gpt-oss's experts (clamped SwiGLU, gate/up and down biases) at gpt-oss-20b's shape (32 experts, hidden and
    intermediate 2880, top 4): the kernels' ``ACTIVATION``/``HAS_BIAS`` variant against the reference (fp32)."""
    from brigade.model_executor.layers.moe_activation import MoEActivation

    num_experts, hidden, inter, top_k = 32, 2880, 2880, 4
    gen = torch.Generator(device="cuda").manual_seed(num_tokens)
    # Weights large enough that the clamp at 7 acts on some activations.
    w13 = (torch.randn(num_experts, 2 * inter, hidden, device="cuda", generator=gen) * 4 / hidden ** 0.5).bfloat16()
    w2 = (torch.randn(num_experts, hidden, inter, device="cuda", generator=gen) / inter ** 0.5).bfloat16()
    b13 = torch.randn(num_experts, 2 * inter, device="cuda", generator=gen).bfloat16()
    b2 = torch.randn(num_experts, hidden, device="cuda", generator=gen).bfloat16()
    x = torch.randn(num_tokens, hidden, device="cuda", generator=gen).bfloat16()
    logits = torch.randn(num_tokens, num_experts, device="cuda", generator=gen)
    weights, ids = select_experts(logits, top_k, True)
    act = MoEActivation(name="swigluoai")
    out = fused_moe(x, w13, w2, weights, ids, w13_bias=b13, w2_bias=b2, activation=act)
    ref = fused_moe_reference(x.float(), w13.float(), w2.float(), weights, ids, w13_bias=b13.float(),
                              w2_bias=b2.float(), activation=act)
    assert out.dtype == torch.bfloat16 and not out.isnan().any()
    assert rel_err(out, ref) < 1e-2, num_tokens
