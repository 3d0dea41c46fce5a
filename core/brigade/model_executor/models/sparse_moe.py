"""What the mixture-of-experts decoders (Mixtral, Qwen2-MoE, Qwen3-MoE) share: the sparse MoE block, the decoder
layer around it, the causal LM base that maps expert checkpoint names, and the start-up check of the config.

The attention half of each layer is the Llama family's (``llama.LlamaAttention``, or Qwen3-MoE's subclass with
q/k norms); only the feed-forward half changes: a router picks each token's ``top_k`` experts
(``layers/moe_router.py``), the experts run as one ``FusedMoE`` op (``layers/fused_moe.py``), and Qwen2-MoE adds a
shared expert whose output is scaled by a sigmoid gate. Layers a config keeps dense (Qwen's ``mlp_only_layers``
and ``decoder_sparse_step``) use ``llama.LlamaMLP``.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

import torch
from torch import nn

from brigade.attention.backend import AttentionBackend, AttentionContext
from brigade.config import ConfigError
from brigade.model_executor.layers.fused_moe import DOWN, GATE, UP, FusedMoE
from brigade.model_executor.layers.layernorm import RMSNorm
from brigade.model_executor.layers.linear import Linear
from brigade.model_executor.layers.linear_method import QuantizationConfig, UnquantizedLinearMethod
from brigade.model_executor.layers.moe_router import select_experts
from brigade.model_executor.layers.rotary_embedding import RotaryEmbedding
from brigade.model_executor.models.llama import LlamaAttention, LlamaForCausalLM, LlamaMLP

# experts.{e}.{projection}.weight -> the stacked parameter and the projection's shard id
_EXPERT = re.compile(r"\.experts\.(\d+)\.(gate_proj|up_proj|down_proj|w1|w3|w2)\.weight$")
_EXPERT_PROJ = {"gate_proj": GATE, "w1": GATE, "up_proj": UP, "w3": UP, "down_proj": DOWN, "w2": DOWN}


class SparseMoeBlock(nn.Module):
    """``sum over the top_k experts of w_e * expert_e(x)`` (+ ``sigmoid(shared_gate(x)) * shared_expert(x)``).

    Submodules carry the checkpoint's names: ``gate`` (the router, [E, H], never quantized), ``experts``
    (``FusedMoE``), and, with a shared expert, ``shared_expert`` (a ``LlamaMLP``) and ``shared_expert_gate``
    ([1, H]).
    """

    def __init__(self, *, hidden_size: int, num_experts: int, top_k: int, intermediate_size: int,
                 renormalize: bool, shared_intermediate_size: int, dtype: torch.dtype,
                 quant_config: QuantizationConfig | None, prefix: str):
        super().__init__()
        self.top_k = top_k
        self.renormalize = renormalize
        self.gate = Linear(hidden_size, num_experts, dtype=dtype, quant_method=UnquantizedLinearMethod())
        self.experts = FusedMoE(num_experts, top_k, hidden_size, intermediate_size, dtype=dtype)
        self.shared_expert = self.shared_expert_gate = None
        if shared_intermediate_size:
            self.shared_expert = LlamaMLP(hidden_size, shared_intermediate_size, bias=False, dtype=dtype,
                                          quant_config=quant_config, prefix=f"{prefix}.shared_expert")
            self.shared_expert_gate = Linear(hidden_size, 1, dtype=dtype, quant_method=UnquantizedLinearMethod())

    def moe(self, x: torch.Tensor) -> torch.Tensor:
        """Args: x [T, hidden], the normalized stream. Returns [T, hidden] in x's dtype."""
        topk_weights, topk_ids = select_experts(self.gate(x), self.top_k, self.renormalize)  # [T, k] each
        out = self.experts(x, topk_weights, topk_ids)
        if self.shared_expert is not None:
            shared = self.shared_expert
            shared_out = shared.down_proj(shared.act_fn(shared.gate_up_proj(x)))
            out = out + torch.sigmoid(self.shared_expert_gate(x)) * shared_out
        return out

    def forward(self, h: torch.Tensor, rest: torch.Tensor | None, norm: RMSNorm
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``stream + moe(norm(stream))`` for the residual stream ``h + rest``, as ``LlamaMLP.forward``: returns
        ``(out, stream)``, the add left to the next norm's fused add-and-normalize kernel."""
        if rest is None:
            x, stream = norm(h), h
        else:
            x, stream = norm(h, rest)
        return self.moe(x), stream


class MoEDecoderLayer(nn.Module):
    """Pre-norm block ``h += attn(norm(h)); h += mlp(norm(h))`` whose ``mlp`` is a ``SparseMoeBlock`` (or a dense
    ``LlamaMLP`` on the layers the config keeps dense). The residual stream travels as ``LlamaDecoderLayer``'s
    pair ``(h, rest)``. Subclasses say which attention (``attention_cls``) and where the layer is sparse."""

    attention_cls: ClassVar[type[nn.Module]] = LlamaAttention

    def __init__(self, config: Any, *, layer_idx: int, rotary_emb: RotaryEmbedding, head_size: int,
                 dtype: torch.dtype, attn_backend: type[AttentionBackend],
                 quant_config: QuantizationConfig | None, prefix: str):
        super().__init__()
        eps = config.rms_norm_eps
        self.input_layernorm = RMSNorm(config.hidden_size, eps, dtype=dtype)
        self.self_attn = self.attention_cls(config, layer_idx=layer_idx, rotary_emb=rotary_emb, head_size=head_size,
                                            dtype=dtype, attn_backend=attn_backend, quant_config=quant_config,
                                            prefix=f"{prefix}.self_attn")
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps, dtype=dtype)
        mlp_prefix = f"{prefix}.mlp"
        if self.is_sparse(config, layer_idx):
            spec = moe_spec(config)
            self.mlp = SparseMoeBlock(hidden_size=config.hidden_size, dtype=dtype, quant_config=quant_config,
                                      prefix=mlp_prefix, **spec)
        else:
            self.mlp = LlamaMLP(config.hidden_size, config.intermediate_size, bias=False, dtype=dtype,
                                quant_config=quant_config, prefix=mlp_prefix)

    @staticmethod
    def is_sparse(config: Any, layer_idx: int) -> bool:
        """Whether layer ``layer_idx`` has experts; Mixtral: every layer."""
        return True

    def forward(self, positions: torch.Tensor, h: torch.Tensor, rest: torch.Tensor | None,
                ctx: AttentionContext) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Args: positions [T] int64; (h, rest) [T, hidden]. Returns the layer's output as such a pair."""
        h, rest = self.self_attn(positions, h, rest, ctx, self.input_layernorm)
        return self.mlp(h, rest, self.post_attention_layernorm)

    def fold_norms(self) -> int:
        """Fold the input norm into qkv and, on a dense layer, the post-attention norm into gate/up; an MoE block
        keeps its norm (the router and every expert read its output). Returns how many were folded."""
        folded = int(self.self_attn.qkv_proj.fold_input_norm(self.input_layernorm))
        if isinstance(self.mlp, LlamaMLP):
            folded += int(self.mlp.gate_up_proj.fold_input_norm(self.post_attention_layernorm))
        return folded


def moe_spec(config: Any) -> dict[str, Any]:
    """The ``SparseMoeBlock`` arguments a config gives (Mixtral's and Qwen MoE's field names)."""
    model_type = getattr(config, "model_type", None)
    if model_type == "mixtral":
        return dict(num_experts=config.num_local_experts, top_k=config.num_experts_per_tok,
                    intermediate_size=config.intermediate_size, renormalize=True, shared_intermediate_size=0)
    return dict(num_experts=config.num_experts, top_k=config.num_experts_per_tok,
                intermediate_size=config.moe_intermediate_size,
                renormalize=bool(getattr(config, "norm_topk_prob", False)),
                shared_intermediate_size=int(getattr(config, "shared_expert_intermediate_size", 0) or 0))


class MoEForCausalLM(LlamaForCausalLM):
    """The Llama-family causal LM with ``MoEDecoderLayer``s: the expert tensors of the checkpoint
    (``...experts.{e}.{gate_proj|up_proj|down_proj|w1|w3|w2}.weight``) load into the stacked ``FusedMoE``
    parameters, one expert and projection at a time; every other name loads as in ``LlamaForCausalLM``."""

    decoder_layer_cls: ClassVar[type[nn.Module]] = MoEDecoderLayer
    # The experts are not sharded over tensor-parallel ranks nor split into pipeline stages yet (docs/moe.md).
    supports_tensor_parallel: ClassVar[bool] = False
    supports_pipeline_parallel: ClassVar[bool] = False
    # Quantization configs see the merged names; the experts' own tensors are not quantized.
    packed_modules_mapping: ClassVar[dict[str, list[str]]] = {
        **LlamaForCausalLM.packed_modules_mapping,
        "experts.w13_weight": ["gate_proj", "up_proj"],
        "experts.w2_weight": ["down_proj"],
    }

    def checkpoint_name(self, hf_name: str) -> tuple[str, Any]:
        match = _EXPERT.search(hf_name)
        if match is None:
            return super().checkpoint_name(hf_name)
        proj = _EXPERT_PROJ[match.group(2)]
        param = "w2_weight" if proj == DOWN else "w13_weight"
        return f"{hf_name[:match.start()]}.experts.{param}", (int(match.group(1)), proj)

    @classmethod
    def check_config(cls, hf_config: Any, config: Any) -> None:
        """Refuse, in one line, an MoE config Brigade cannot run as its checkpoint means (``BrigadeConfig``
        ``config``): another router or scoring function, an activation other than SiLU, ``top_k`` outside
        ``[1, num_experts]``, experts that do not divide over the expert-parallel group, LoRA.

        Raises:
            ConfigError: naming the unsupported setting and what Brigade runs.
        """
        check_moe_config(hf_config, config)


def check_moe_config(hf_config: Any, config: Any) -> None:
    """See ``MoEForCausalLM.check_config``."""
    arch = type(hf_config).__name__.removesuffix("Config") or "this model"
    spec = moe_spec(hf_config)
    num_experts, top_k = spec["num_experts"], spec["top_k"]
    scoring = getattr(hf_config, "scoring_func", None)
    if scoring not in (None, "softmax"):
        raise ConfigError(f"{arch}: router scoring function {scoring!r} is not supported; Brigade's MoE router is "
                          "a softmax over the experts then top-k (scoring_func 'softmax')")
    topk_method = getattr(hf_config, "topk_method", None)
    if topk_method not in (None, "greedy") or (getattr(hf_config, "n_group", None) or 1) > 1:
        raise ConfigError(f"{arch}: grouped or {topk_method!r} expert selection is not supported; Brigade picks "
                          "the top-k experts over all of them (topk_method 'greedy', n_group 1)")
    act = getattr(hf_config, "hidden_act", "silu")
    if act != "silu":
        raise ConfigError(f"{arch}: experts with activation {act!r} are not supported; Brigade's experts are "
                          "SwiGLU (hidden_act 'silu')")
    if not 1 <= top_k <= num_experts:
        raise ConfigError(f"{arch}: num_experts_per_tok {top_k} must be between 1 and the number of experts "
                          f"({num_experts})")
    parallel = config.parallel_config
    if getattr(parallel, "enable_expert_parallel", False):
        ep_size = parallel.data_parallel_size * parallel.tensor_parallel_size
        if num_experts % ep_size:
            raise ConfigError(f"{arch}: {num_experts} experts do not divide over the expert-parallel group of "
                              f"{ep_size} ranks (DP x TP); choose sizes whose product divides {num_experts}")
    if config.lora_config is not None:
        raise ConfigError(f"{arch}: LoRA on mixture-of-experts models is not supported yet; serve it without "
                          "--enable-lora")
