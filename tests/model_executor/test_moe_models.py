"""The mixture-of-experts models (Mixtral, Qwen2-MoE, Qwen3-MoE) against transformers' own classes on tiny
random-weight checkpoints, through the paged KV cache (the three steps of test_llama.py: prefill, decode, decode
mixed with a prefill; every scheduled token's logits in fp32), the router against transformers' routers on random
hidden states, the stacked expert weights against the checkpoint's per-expert tensors, and the start-up refusals
of what Brigade cannot run, one line each."""

from __future__ import annotations

import pytest
import torch
import transformers
from moe_checkpoints import moe_config
from test_llama import load_with_transformers, run_three_steps

from brigade.attention.reference import ReferenceAttentionBackend
from brigade.config import BrigadeConfig, ConfigError, LoRAConfig, ModelConfig, ParallelConfig
from brigade.model_executor.layers.fused_moe import FusedMoE, fused_moe_reference
from brigade.model_executor.layers.linear_method import QuantizationConfig
from brigade.model_executor.layers.moe_router import select_experts
from brigade.model_executor.loader import check_model_config, get_hf_config, load_model
from brigade.model_executor.models.sparse_moe import SparseMoeBlock

TINY = dict(vocab_size=160, num_hidden_layers=3, max_position_embeddings=128, initializer_range=0.02)

CASES = {
    "mixtral": lambda: moe_config("mixtral", **TINY),
    # layer 1 is dense (mlp_only_layers), layers 0 and 2 sparse with a shared expert; top-k not renormalised
    "qwen2-moe": lambda: moe_config("qwen2-moe", **TINY, mlp_only_layers=[1]),
    # decoder_sparse_step 2: only layer 1 is sparse; q/k norms; top-k renormalised
    "qwen3-moe": lambda: moe_config("qwen3-moe", **TINY, decoder_sparse_step=2),
}
SPARSE_LAYERS = {"mixtral": [0, 1, 2], "qwen2-moe": [0, 2], "qwen3-moe": [1]}


# One intra-op thread: transformers' MoE adds each expert's output with ``index_add_``, slow in parallel on 2 cores.
pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.mark.parametrize("case", sorted(CASES))
def test_matches_transformers_through_paged_cache(case, tmp_path, paged_steps_for, save_random_hf_model):
    path = save_random_hf_model(tmp_path / case, CASES[case]())
    hf_config, model, hf_model = load_with_transformers(path)
    assert type(model).__name__ == hf_config.architectures[0]
    sparse = [i for i, layer in enumerate(model.model.layers) if isinstance(layer.mlp, SparseMoeBlock)]
    assert sparse == SPARSE_LAYERS[case]

    # The stacked experts hold the checkpoint's per-expert tensors (transformers stacks them the same way).
    for i in sparse:
        ours = model.model.layers[i].mlp.experts
        theirs = hf_model.model.layers[i].mlp.experts
        assert torch.equal(ours.w13_weight, theirs.gate_up_proj) and torch.equal(ours.w2_weight, theirs.down_proj)
    run_three_steps(model, hf_model, paged_steps_for(hf_config), hf_config.vocab_size)


ROUTERS = {
    "mixtral": (lambda c: transformers.models.mixtral.modeling_mixtral.MixtralTopKRouter(c), CASES["mixtral"], True),
    "qwen2-moe": (lambda c: transformers.models.qwen2_moe.modeling_qwen2_moe.Qwen2MoeTopKRouter(c),
                  CASES["qwen2-moe"], False),
    "qwen3-moe": (lambda c: transformers.models.qwen3_moe.modeling_qwen3_moe.Qwen3MoeTopKRouter(c),
                  CASES["qwen3-moe"], True),
}


@pytest.mark.parametrize("case", sorted(ROUTERS))
def test_router_matches_transformers(case):
    make_router, make_config, renormalize = ROUTERS[case]
    config = make_config()
    torch.manual_seed(0)
    router = make_router(config)
    with torch.no_grad():
        router.weight.normal_(0.0, 1.0)
    hidden = torch.randn(257, config.hidden_size)
    with torch.no_grad():
        logits, want_weights, want_ids = router(hidden)
        weights, ids = select_experts(hidden @ router.weight.T, config.num_experts_per_tok, renormalize)
    assert torch.equal(ids, want_ids)
    torch.testing.assert_close(weights, want_weights.float(), rtol=1e-6, atol=1e-7)
    if renormalize:
        torch.testing.assert_close(weights.sum(-1), torch.ones(257))
    else:
        assert (weights.sum(-1) < 0.99).any()  # the raw softmax probabilities of the chosen experts


def test_fused_moe_reference_is_the_sum_over_each_tokens_experts():
    torch.manual_seed(1)
    num_experts, hidden, inter, top_k = 5, 16, 12, 2
    w13 = torch.randn(num_experts, 2 * inter, hidden)
    w2 = torch.randn(num_experts, hidden, inter)
    x = torch.randn(7, hidden)
    weights, ids = select_experts(torch.randn(7, num_experts), top_k, renormalize=False)
    got = fused_moe_reference(x, w13, w2, weights, ids)
    for t in range(7):
        want = torch.zeros(hidden)
        for j in range(top_k):
            gate, up = (w13[ids[t, j]] @ x[t]).split(inter)
            want += weights[t, j] * (w2[ids[t, j]] @ (torch.nn.functional.silu(gate) * up))
        torch.testing.assert_close(got[t], want, rtol=1e-5, atol=1e-5)


def test_expert_weight_loader_refuses_what_does_not_fit():
    layer = FusedMoE(4, 2, 8, 6, dtype=torch.float32)
    with pytest.raises(ValueError, match="expert 4 is out of range: the layer has 4 experts"):
        layer.weight_loader(layer.w13_weight, torch.zeros(6, 8), (4, "w1"))
    with pytest.raises(ValueError, match=r"expert 1's w2 of shape \(8, 5\) does not fit its slice of shape \(8, 6\)"):
        layer.weight_loader(layer.w2_weight, torch.zeros(8, 5), (1, "w2"))
    with pytest.raises(ValueError, match="projection 'w2' does not belong"):
        layer.weight_loader(layer.w13_weight, torch.zeros(8, 6), (1, "w2"))


def test_a_missing_expert_tensor_is_named(tmp_path, save_random_hf_model):
    from safetensors.torch import load_file, save_file

    path = save_random_hf_model(tmp_path / "m", CASES["mixtral"]())
    tensors = load_file(str(path / "model.safetensors"))
    del tensors["model.layers.1.block_sparse_moe.experts.3.w3.weight"]
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"model\.layers\.1\.mlp\.experts\.w13_weight \(shard \(3, 'w3'\)\)"):
        load_model(ModelConfig(model=str(path)), get_hf_config(str(path)), dtype=torch.float32,
                   device=torch.device("cpu"), attn_backend=ReferenceAttentionBackend)


def _config(path, **kwargs) -> BrigadeConfig:
    return BrigadeConfig(model_config=ModelConfig(model=str(path)), **kwargs)


@pytest.mark.parametrize("case,overrides,kwargs,needle", [
    ("mixtral", {"scoring_func": "sigmoid"}, {}, "Mixtral: router scoring function 'sigmoid' is not supported"),
    ("qwen3-moe", {"topk_method": "group_limited_greedy", "n_group": 4}, {},
     "Qwen3Moe: grouped or 'group_limited_greedy' expert selection is not supported"),
    ("qwen2-moe", {"hidden_act": "gelu"}, {}, "Qwen2Moe: experts with activation 'gelu' are not supported"),
    ("mixtral", {"num_experts_per_tok": 5}, {},
     "num_experts_per_tok 5 must be between 1 and the number of experts (4)"),
    ("qwen2-moe", {}, {"parallel_config": ParallelConfig(tensor_parallel_size=4)}, None),
    ("qwen2-moe", {}, {"lora_config": LoRAConfig()}, "Qwen2Moe: LoRA on mixture-of-experts models is not supported"),
    ("mixtral", {"quantization_config": {"quant_method": "gptq", "bits": 4}}, {},
     "Mixtral: quantized mixture-of-experts checkpoints (gptq) are not supported yet; serve the unquantized "
     "checkpoint, with --quantization fp8"),
    ("qwen3-moe", {"moe_intermediate_size": 30}, {"parallel_config": ParallelConfig(tensor_parallel_size=4)},
     "Qwen3Moe: the experts' intermediate size 30 does not divide over -tp 4; choose a -tp that divides it, or use "
     "--enable-expert-parallel"),
])
def test_unsupported_moe_configs_are_one_line(case, overrides, kwargs, needle, tmp_path):
    hf_config = CASES[case]()
    for key, value in overrides.items():
        setattr(hf_config, key, value)
    config = _config(tmp_path, **kwargs)
    if needle is None:  # expert parallelism over the 4 TP ranks: 6 experts do not divide
        config.parallel_config.enable_expert_parallel = True
        needle = "Qwen2Moe: 6 experts do not divide over the expert-parallel group of 4 ranks (-tp 4 with"
    with pytest.raises(ConfigError) as info:
        check_model_config(hf_config, config)
    assert needle in str(info.value) and "\n" not in str(info.value)


class DenseOnlyQuantization(QuantizationConfig):
    """A quantization method with linear layers only (no ``get_moe_method``), as a plugin may register."""

    name = "dense-only"

    @classmethod
    def from_hf_config(cls, hf_config):
        return cls()

    def get_linear_method(self, prefix):
        return None


def test_a_quantization_without_an_expert_method_is_one_line_when_the_block_is_built():
    with pytest.raises(ConfigError) as info:
        SparseMoeBlock(hidden_size=8, num_experts=4, top_k=2, intermediate_size=6, renormalize=True,
                       shared_intermediate_size=0, dtype=torch.float32, quant_config=DenseOnlyQuantization(),
                       prefix="model.layers.0.mlp")
    assert "quantization dense-only has no method for mixture-of-experts layers (model.layers.0.mlp.experts" \
        in str(info.value) and "\n" not in str(info.value)


def test_supported_configs_pass_the_check(tmp_path):
    for case in CASES:
        check_model_config(CASES[case](), _config(tmp_path))


def test_tensor_parallel_rank_holds_its_slice_of_gate_and_up_each_and_of_down():
    """Rank 1 of -tp 2: rows [3, 6) of each expert's gate and of its up (w13 stays gate rows then up rows), and
    columns [3, 6) of its down."""
    layer = FusedMoE(4, 2, 8, 6, dtype=torch.float32, tp_rank=1, tp_size=2)
    gate, up, down = torch.randn(6, 8), torch.randn(6, 8), torch.randn(8, 6)
    layer.weight_loader(layer.w13_weight, gate, (2, "w1"))
    layer.weight_loader(layer.w13_weight, up, (2, "w3"))
    layer.weight_loader(layer.w2_weight, down, (2, "w2"))
    assert layer.w13_weight.shape == (4, 6, 8) and layer.w2_weight.shape == (4, 8, 3)
    assert torch.equal(layer.w13_weight[2], torch.cat([gate[3:], up[3:]]))
    assert torch.equal(layer.w2_weight[2], down[:, 3:])


def test_expert_parallel_rank_holds_whole_experts_and_zeroes_the_others_routing():
    """Rank 1 of an expert-parallel group of 2 over 4 experts holds experts 2 and 3 whole; another rank's expert
    is skipped unread (a tensor that would not fit is not even looked at); its routing sees local ids, and the
    other rank's assignments at weight 0."""
    layer = FusedMoE(4, 2, 8, 6, dtype=torch.float32, ep_rank=1, ep_size=2)
    assert layer.w13_weight.shape == (2, 12, 8) and layer.w2_weight.shape == (2, 8, 6)
    assert {e for e, _ in layer.w13_weight.shard_ids} == {2, 3}
    layer.weight_loader(layer.w13_weight, torch.zeros(1), (0, "w1"))  # expert 0 lives on rank 0
    down = torch.randn(8, 6)
    layer.weight_loader(layer.w2_weight, down, (3, "w2"))
    assert torch.equal(layer.w2_weight[1], down)
    weights, ids = torch.tensor([[0.7, 0.3], [0.6, 0.4]]), torch.tensor([[3, 0], [1, 2]])
    local_weights, local_ids = layer.local_routing(weights, ids)
    assert local_ids.tolist() == [[1, 0], [0, 0]]
    assert local_weights.tolist() == [[pytest.approx(0.7), 0.0], [0.0, pytest.approx(0.4)]]


def test_dummy_expert_weights_do_not_depend_on_the_layout():
    """--load-format dummy draws each stacked parameter over the whole layer's shape, then a TP or EP rank keeps its
    part: the same experts as one rank draws."""
    from brigade.model_executor.weight_utils import initialize_dummy_weights

    whole = FusedMoE(4, 2, 8, 6, dtype=torch.float32)
    tp1 = FusedMoE(4, 2, 8, 6, dtype=torch.float32, tp_rank=1, tp_size=2)
    ep1 = FusedMoE(4, 2, 8, 6, dtype=torch.float32, ep_rank=1, ep_size=2)
    for layer in (whole, tp1, ep1):
        initialize_dummy_weights(layer, seed=3)
    w13, w2 = whole.w13_weight, whole.w2_weight
    assert torch.equal(tp1.w13_weight, torch.cat([w13[:, 3:6], w13[:, 9:12]], dim=1))
    assert torch.equal(tp1.w2_weight, w2[:, :, 3:])
    assert torch.equal(ep1.w13_weight, w13[2:]) and torch.equal(ep1.w2_weight, w2[2:])
