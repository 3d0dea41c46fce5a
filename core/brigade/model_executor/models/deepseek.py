"""DeepSeek-V2 and DeepSeek-V3 (arXiv:2405.04434, arXiv:2412.19437): multi-head latent attention and DeepSeekMoE,
following transformers' ``modeling_deepseek_v2`` / ``modeling_deepseek_v3``.

* Attention (MLA, ``layers/mla_attention.py``): queries through a low-rank pair ``q_a_proj`` -> ``q_a_layernorm``
  -> ``q_b_proj`` (``q_lora_rank``; without it, as in V2-Lite, one ``q_proj``), each head ``qk_nope_head_dim``
  plain then ``qk_rope_head_dim`` rotated channels. ``kv_a_proj_with_mqa`` gives the compressed KV
  (``kv_lora_rank``, then ``kv_a_layernorm``) and one rotated key shared by all heads; both are cached as one
  latent per token (``MLAAttentionSpec``). ``kv_b_proj`` expands the latent to keys and values (prefill) or is
  absorbed into the query and output (decode). The softmax scale is ``qk_head_dim ** -0.5``, times
  ``mscale(factor, mscale_all_dim) ** 2`` under YaRN (transformers' ``yarn_apply_mscale``); the rotary embedding
  is GPT-J style (interleaved pairs: V2, and V3 with ``rope_interleave``), with YaRN's own ``mscale`` factor.
* MoE: the first ``first_k_dense_replace`` layers are dense SwiGLU MLPs; the others route each token to
  ``num_experts_per_tok`` of ``n_routed_experts`` experts (``layers/grouped_router.py``: V2's softmax, greedy or
  group-limited; V3's sigmoid with ``e_score_correction_bias``, noaux_tc), weights times
  ``routed_scaling_factor``, plus ``n_shared_experts`` always-on experts (one MLP ``moe_intermediate_size *
  n_shared_experts`` wide, ungated). The routed experts run on ``FusedMoE``, sliced (-tp) or spread
  (--enable-expert-parallel) like every MoE model's (``sparse_moe``).
* Tensor parallelism splits the query heads (q_b_proj / q_proj, kv_b_proj by rows, o_proj by columns); the latent
  projections are whole on every rank, and so is the latent cache.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import torch
from torch import nn

from brigade.attention.backend import AttentionBackend, AttentionContext
from brigade.config import ConfigError
from brigade.interfaces.kv_cache_spec import KVCacheSpec
from brigade.model_executor.layers.grouped_router import GroupedTopKRouter
from brigade.model_executor.layers.layernorm import RMSNorm
from brigade.model_executor.layers.linear import Linear, MergedColumnLinear, RowParallelLinear
from brigade.model_executor.layers.linear_method import QuantizationConfig
from brigade.model_executor.layers.mla_attention import MLAAttention
from brigade.model_executor.layers.rotary_embedding import RotaryEmbedding, get_rope_parameters
from brigade.model_executor.models.interface import ModelCapabilities
from brigade.model_executor.models.llama import LlamaMLP, LlamaModel
from brigade.model_executor.models.sparse_moe import (MoEDecoderLayer, MoEForCausalLM, SparseMoeBlock,
                                                      check_moe_config, moe_spec)

LATENT_NORM_EPS = 1e-6  # q_a_layernorm and kv_a_layernorm: transformers' RMSNorm default, not rms_norm_eps


def softmax_scale(config: Any) -> float:
    """``qk_head_dim ** -0.5``, times ``(0.1 * mscale_all_dim * ln(factor) + 1) ** 2`` when the rope is scaled
    with ``mscale_all_dim`` and ``factor`` > 1 (DeepSeek's YaRN attention temperature; transformers'
    ``yarn_apply_mscale``)."""
    scale = (config.qk_nope_head_dim + config.qk_rope_head_dim) ** -0.5
    rope = get_rope_parameters(config)
    mscale_all_dim = rope.scaling.get("mscale_all_dim")
    factor = float(rope.scaling.get("factor") or 1.0)
    if rope.rope_type != "default" and mscale_all_dim and factor > 1:
        mscale = 0.1 * mscale_all_dim * math.log(factor) + 1.0
        scale *= mscale * mscale
    return scale


def router_options(config: Any) -> dict[str, Any]:
    """``GroupedTopKRouter``'s arguments from a V2 or V3 config (V3 configs may omit the scoring function and the
    top-k method: sigmoid and noaux_tc)."""
    v3 = config.model_type == "deepseek_v3"
    scoring = getattr(config, "scoring_func", None) or ("sigmoid" if v3 else "softmax")
    method = getattr(config, "topk_method", None) or ("noaux_tc" if v3 else "greedy")
    grouped = method in ("group_limited_greedy", "noaux_tc")
    return dict(scoring_func=scoring, num_groups=(config.n_group or 1) if grouped else 1,
                topk_group=(config.topk_group or 1) if grouped else 1,
                renormalize=bool(getattr(config, "norm_topk_prob", False)),
                routed_scaling_factor=float(config.routed_scaling_factor), use_correction_bias=method == "noaux_tc")


class DeepseekAttention(nn.Module):
    """MLA block: low-rank query and latent KV projections, rotary on the decoupled channels, latent attention,
    output projection. Submodules carry the checkpoint's names."""

    def __init__(self, config: Any, *, layer_idx: int, rotary_emb: RotaryEmbedding, head_size: int,
                 dtype: torch.dtype, attn_backend: type[AttentionBackend],
                 quant_config: QuantizationConfig | None, prefix: str):
        """Args as ``LlamaAttention``'s (``head_size`` is the rotary width; ``attn_backend`` is not used: the
        latent attention is this model's own)."""
        super().__init__()
        hidden, heads = config.hidden_size, config.num_attention_heads
        self.nope, self.rope = config.qk_nope_head_dim, config.qk_rope_head_dim
        self.kv_lora_rank = config.kv_lora_rank
        qk_head_dim = self.nope + self.rope
        bias = bool(getattr(config, "attention_bias", False))
        self.q_lora_rank = config.q_lora_rank
        if self.q_lora_rank is None:
            self.q_proj = MergedColumnLinear(hidden, [heads * qk_head_dim], dtype=dtype)
        else:
            self.q_a_proj = Linear(hidden, self.q_lora_rank, bias=bias, dtype=dtype)
            self.q_a_layernorm = RMSNorm(self.q_lora_rank, LATENT_NORM_EPS, dtype=dtype)
            self.q_b_proj = MergedColumnLinear(self.q_lora_rank, [heads * qk_head_dim], dtype=dtype)
        self.kv_a_proj_with_mqa = Linear(hidden, self.kv_lora_rank + self.rope, bias=bias, dtype=dtype)
        self.kv_a_layernorm = RMSNorm(self.kv_lora_rank, LATENT_NORM_EPS, dtype=dtype)
        self.kv_b_proj = MergedColumnLinear(self.kv_lora_rank, [heads * (self.nope + config.v_head_dim)],
                                            dtype=dtype)
        self.o_proj = RowParallelLinear(heads * config.v_head_dim, hidden, bias=bias, dtype=dtype)
        self.rotary_emb = rotary_emb  # shared by all layers
        self.num_heads = self.kv_b_proj.output_size // (self.nope + config.v_head_dim)  # this rank's
        self.attn = MLAAttention(self.num_heads, self.nope, self.rope, config.v_head_dim, self.kv_lora_rank,
                                 scale=softmax_scale(config), layer_idx=layer_idx)

    def forward(self, positions: torch.Tensor, h: torch.Tensor, rest: torch.Tensor | None, ctx: AttentionContext,
                norm: RMSNorm) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``stream + attn(norm(stream))`` for the residual stream ``h + rest``, as ``LlamaAttention.forward``.
        Args: positions [T] int64; h, rest [T, hidden]."""
        x, stream = (norm(h), h) if rest is None else norm(h, rest)
        num_tokens = x.shape[0]
        if self.q_lora_rank is None:
            q = self.q_proj(x)
        else:
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        q = q.view(num_tokens, self.num_heads, self.nope + self.rope)
        kv_a = self.kv_a_proj_with_mqa(x)  # [T, kv_lora_rank + rope]
        c = self.kv_a_layernorm(kv_a[:, :self.kv_lora_rank].contiguous())
        q_pe, k_pe = self.rotary_emb(positions, q[..., self.nope:].contiguous(),
                                     kv_a[:, self.kv_lora_rank:].contiguous())  # [T, H, rope], [T, rope]
        q = torch.cat([q[..., :self.nope], q_pe.view(num_tokens, self.num_heads, self.rope)], dim=-1)
        latent = torch.cat([c, k_pe.view(num_tokens, self.rope)], dim=-1)  # [T, kv_lora_rank + rope]
        attn = self.attn(q, latent, self.kv_b_proj.weight, ctx)  # [T, H * v]
        return self.o_proj.forward_add(attn, stream)


class DeepseekMoE(SparseMoeBlock):
    """``SparseMoeBlock`` with DeepSeek's grouped router (``router``, its bias loaded from
    ``mlp.gate.e_score_correction_bias``) and ungated shared experts (``shared_experts``, column/row-sharded
    under TP like a dense MLP)."""

    def __init__(self, config: Any, *, dtype: torch.dtype, quant_config: QuantizationConfig | None, prefix: str,
                 expert_parallel: bool):
        spec = moe_spec(config)
        super().__init__(hidden_size=config.hidden_size, num_experts=spec["num_experts"], top_k=spec["top_k"],
                         intermediate_size=spec["intermediate_size"], renormalize=spec["renormalize"],
                         shared_intermediate_size=0, dtype=dtype, quant_config=quant_config, prefix=prefix,
                         expert_parallel=expert_parallel)
        self.router = GroupedTopKRouter(spec["num_experts"], spec["top_k"], **router_options(config))
        shared = spec["shared_intermediate_size"]
        self.shared_experts = LlamaMLP(config.hidden_size, shared, bias=bool(getattr(config, "mlp_bias", False)),
                                       dtype=dtype, quant_config=quant_config,
                                       prefix=f"{prefix}.shared_experts") if shared else None

    def shared_output(self, x: torch.Tensor) -> torch.Tensor | None:
        if self.shared_experts is None:
            return None
        mlp = self.shared_experts
        return mlp.down_proj.forward_partial(mlp.act_fn(mlp.gate_up_proj(x)))


class DeepseekDecoderLayer(MoEDecoderLayer):
    """MLA, then a dense MLP on the first ``first_k_dense_replace`` layers and ``DeepseekMoE`` on the others."""

    attention_cls: ClassVar[type[nn.Module]] = DeepseekAttention

    def build_mlp(self, config: Any, *, layer_idx: int, dtype: torch.dtype, quant_config: QuantizationConfig | None,
                  prefix: str) -> nn.Module:
        if not self.is_sparse(config, layer_idx):
            return LlamaMLP(config.hidden_size, config.intermediate_size,
                            bias=bool(getattr(config, "mlp_bias", False)), dtype=dtype, quant_config=quant_config,
                            prefix=prefix)
        return DeepseekMoE(config, dtype=dtype, quant_config=quant_config, prefix=prefix,
                           expert_parallel=self.expert_parallel)

    @staticmethod
    def is_sparse(config: Any, layer_idx: int) -> bool:
        return layer_idx >= (config.first_k_dense_replace or 0)

    def fold_norms(self) -> int:
        return 0  # the norms stay (the class does not declare fold_norms)


class DeepseekModel(LlamaModel):
    """Llama's embedding and layer stack with DeepSeek's rotary layout."""

    @staticmethod
    def is_neox_style(config: Any) -> bool:
        """V2 rotates interleaved pairs (transformers' complex rotation), V3 too unless ``rope_interleave`` is
        false. Only ``q_pe . k_pe`` is ever used, so the pairs' order in the output does not matter."""
        return config.model_type == "deepseek_v3" and not getattr(config, "rope_interleave", True)


class DeepseekV2ForCausalLM(MoEForCausalLM):
    """DeepSeek-V2 (and V2-Lite: no ``q_lora_rank``). Checkpoint names are transformers'; ``mlp.gate`` is the
    router's linear layer, its ``e_score_correction_bias`` goes to ``mlp.router``."""

    decoder_layer_cls: ClassVar[type[nn.Module]] = DeepseekDecoderLayer
    model_cls: ClassVar[type[LlamaModel]] = DeepseekModel
    capabilities: ClassVar[ModelCapabilities] = ModelCapabilities(tensor_parallel=True, expert_parallel=True)
    packed_modules_mapping: ClassVar[dict[str, list[str]]] = {"gate_up_proj": ["gate_proj", "up_proj"]}

    def kv_cache_specs(self, block_size: int, cache_dtype: torch.dtype) -> dict[int, KVCacheSpec]:
        """One ``MLAAttentionSpec`` per layer: ``kv_lora_rank + qk_rope_head_dim`` values a token."""
        return {m.layer_idx: m.kv_cache_spec(block_size, cache_dtype)
                for m in self.modules() if isinstance(m, MLAAttention)}

    def checkpoint_name(self, hf_name: str) -> tuple[str, Any]:
        if ".self_attn.q_proj." in hf_name:  # V2-Lite's full-rank query: not Llama's q of a merged qkv
            return hf_name, None
        if hf_name.endswith(".mlp.gate.e_score_correction_bias"):
            return hf_name.replace(".mlp.gate.", ".mlp.router."), None
        return super().checkpoint_name(hf_name)

    @classmethod
    def check_config(cls, hf_config: Any, config: Any) -> None:
        """Refuse, in one line, what this class cannot serve as the checkpoint means: a rope type Brigade lacks,
        a router scoring function or top-k method other than DeepSeek's, groups that do not divide the experts,
        query heads ``-tp`` does not divide, quantization (FP8 block checkpoints and ``--quantization``), an fp8
        KV cache; then ``check_moe_config``'s checks (expert parallel sizes, LoRA, activation).

        Raises:
            ConfigError: naming the setting and what Brigade runs.
        """
        arch = cls.__name__.removesuffix("ForCausalLM")
        try:
            get_rope_parameters(hf_config)
        except ValueError as e:
            raise ConfigError(f"{arch}: {e}") from None
        _check_router(arch, hf_config)
        tp = config.parallel_config.tensor_parallel_size
        if hf_config.num_attention_heads % tp:
            raise ConfigError(f"{arch}: {hf_config.num_attention_heads} attention heads do not divide over -tp {tp}; "
                              "choose a -tp that divides them")
        checkpoint_quant = getattr(hf_config, "quantization_config", None)
        if checkpoint_quant or config.model_config.quantization is not None:
            what = "quantized checkpoints (FP8 block scales)" if checkpoint_quant else \
                f"--quantization {config.model_config.quantization}"
            raise ConfigError(f"{arch}: {what} are not supported yet; serve a bf16 checkpoint without --quantization")
        if config.cache_config.fp8_kv_cache:
            raise ConfigError(f"{arch}: an fp8 KV cache is not supported for latent attention yet; drop "
                              "--kv-cache-dtype fp8")
        check_moe_config(hf_config, config, own_router=True)


class DeepseekV3ForCausalLM(DeepseekV2ForCausalLM):
    """DeepSeek-V3 (and R1): sigmoid routing with the balancing bias, groups, the dense first layers."""


def _check_router(arch: str, hf_config: Any) -> None:
    """Refuse a scoring function or top-k method the grouped router lacks, groups that do not divide the experts,
    or more experts per token than the eligible groups hold."""
    options = router_options(hf_config)
    scoring, v3 = options["scoring_func"], hf_config.model_type == "deepseek_v3"
    method = getattr(hf_config, "topk_method", None) or ("noaux_tc" if v3 else "greedy")
    known = ("noaux_tc",) if v3 else ("greedy", "group_limited_greedy")
    want = "sigmoid" if v3 else "softmax"
    if scoring != want:
        raise ConfigError(f"{arch}: router scoring function {scoring!r} is not supported; Brigade runs {arch}'s "
                          f"scoring_func {want!r}")
    if method not in known:
        raise ConfigError(f"{arch}: topk_method {method!r} is not supported; Brigade runs "
                          f"{' or '.join(map(repr, known))}")
    experts, groups, top_k = hf_config.n_routed_experts, options["num_groups"], hf_config.num_experts_per_tok
    if experts % groups or not 1 <= options["topk_group"] <= groups:
        raise ConfigError(f"{arch}: n_group {groups} and topk_group {options['topk_group']} do not fit "
                          f"{experts} experts; n_group must divide them and topk_group be between 1 and n_group")
    if not top_k or top_k > options["topk_group"] * (experts // groups):
        raise ConfigError(f"{arch}: num_experts_per_tok {top_k} must be between 1 and the experts of the "
                          f"{options['topk_group']} eligible groups ({options['topk_group'] * (experts // groups)})")
