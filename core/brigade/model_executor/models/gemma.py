"""Gemma 2 and Gemma 3 (text): the Llama block with Gemma's norms, GeGLU, scaled embeddings and attention options
(Gemma Team 2024, "Gemma 2: Improving Open Language Models at a Practical Size", arXiv:2408.00118; Gemma Team 2025,
"Gemma 3 Technical Report", arXiv:2503.19786; transformers' ``modeling_gemma2`` and ``modeling_gemma3``).

What differs from ``llama``:

* every norm is ``GemmaRMSNorm`` (``1 + weight``), and each layer has four: before and after attention, before and
  after the feed-forward (the "after" ones normalize the branch's output before the residual add);
* the MLP is ``down(gelu_tanh(gate(x)) * up(x))``;
* the embedding is multiplied by ``sqrt(hidden_size)``, rounded to the model dtype as transformers does;
* queries are scaled by ``query_pre_attn_scalar ** -0.5``, not ``head_dim ** -0.5``;
* layers alternate sliding-window and global attention (``config.layer_types``; else Gemma 2's even layers slide,
  Gemma 3's slide but every ``sliding_window_pattern``-th);
* Gemma 2 soft-caps the attention scores (``attn_logit_softcapping``) and the final logits
  (``final_logit_softcapping``); Gemma 3 has neither by default, but q/k norms per head (``q_norm``, ``k_norm``) and
  a rope per layer type: ``rope_local_base_freq`` on sliding layers, ``rope_theta`` (maybe linearly scaled) on global
  ones;
* the LM head is tied to the embedding.

Tensor parallel like Llama (q/k norms replicated: each rank normalizes whole heads) and pipeline parallel (the last
stage holds the embedding for its tied head). No norm folding: ``1 + weight`` is not a projection's input scale.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import nn

from brigade.attention.backend import AttentionBackend, AttentionContext
from brigade.config.errors import ConfigError
from brigade.model_executor.layers.activation import GeluTanhAndMul
from brigade.model_executor.layers.layernorm import GemmaRMSNorm
from brigade.model_executor.layers.linear import MergedColumnLinear, RowParallelLinear
from brigade.model_executor.layers.linear_method import QuantizationConfig, get_linear_method
from brigade.model_executor.layers.rotary_embedding import RotaryEmbedding
from brigade.model_executor.models.interface import ModelCapabilities
from brigade.model_executor.models.llama import LlamaAttention, LlamaForCausalLM, LlamaModel, layer_sliding_window

# transformers' names of the tanh-approximated GELU, the only activation Gemma's checkpoints use.
_GELU_TANH = ("gelu_pytorch_tanh", "gelu_tanh")


def gemma_layer_type(config: Any, layer_idx: int) -> str:
    """Layer ``layer_idx``'s attention type: ``config.layer_types`` when present, else transformers' rule (Gemma 2:
    even layers ``"sliding_attention"``; Gemma 3: all but every ``sliding_window_pattern``-th, default 6)."""
    types = getattr(config, "layer_types", None)
    if types:
        return types[layer_idx]
    if getattr(config, "model_type", None) == "gemma2":
        sliding = layer_idx % 2 == 0
    else:
        sliding = bool((layer_idx + 1) % int(getattr(config, "sliding_window_pattern", 6)))
    return "sliding_attention" if sliding else "full_attention"


def _activation(config: Any) -> str:
    return getattr(config, "hidden_activation", None) or getattr(config, "hidden_act", None) or "gelu_pytorch_tanh"


class GemmaMLP(nn.Module):
    """GeGLU feed-forward: ``down(gelu_tanh(gate(x)) * up(x))``, gate and up in one GEMM."""

    def __init__(self, hidden_size: int, intermediate_size: int, *, dtype: torch.dtype,
                 quant_config: QuantizationConfig | None, prefix: str):
        super().__init__()
        self.gate_up_proj = MergedColumnLinear(
            hidden_size, [intermediate_size, intermediate_size], bias=False, dtype=dtype,
            quant_method=get_linear_method(quant_config, f"{prefix}.gate_up_proj"))
        self.down_proj = RowParallelLinear(intermediate_size, hidden_size, bias=False, dtype=dtype,
                                           quant_method=get_linear_method(quant_config, f"{prefix}.down_proj"))
        self.act_fn = GeluTanhAndMul()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Args: x [T, hidden], normalized. Returns [T, hidden] (all-reduced under tensor parallelism)."""
        return self.down_proj(self.act_fn(self.gate_up_proj(x)))


class GemmaAttention(LlamaAttention):
    """Llama's projections and ``Attention`` with Gemma's options: query scale ``query_pre_attn_scalar ** -0.5``,
    the window of its layer type, soft-capped scores; Gemma 3 (``qk_norm``) normalizes each query and key head.

    Its ``forward`` takes the normalized input and returns o_proj's output, not the residual stream: Gemma
    normalizes that output again before the residual add."""

    qk_norm: ClassVar[bool] = False

    def __init__(self, config: Any, **kwargs: Any):
        super().__init__(config, **kwargs)
        if self.qk_norm:
            self.q_norm = GemmaRMSNorm(self.head_size, config.rms_norm_eps, dtype=kwargs["dtype"])
            self.k_norm = GemmaRMSNorm(self.head_size, config.rms_norm_eps, dtype=kwargs["dtype"])

    def attention_options(self, config: Any, layer_idx: int) -> dict[str, Any]:
        kind = gemma_layer_type(config, layer_idx)
        return {"scale": float(config.query_pre_attn_scalar) ** -0.5,
                "sliding_window": layer_sliding_window(config, layer_idx, kind),
                "logits_soft_cap": getattr(config, "attn_logit_softcapping", None) or None}

    def forward(self, positions: torch.Tensor, x: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        """Args: positions [T] int64; x [T, hidden], the input norm's output. Returns o_proj's output [T, hidden]."""
        q, k, v = self.qkv_proj.split(self.qkv_proj(x))  # [T, H*D], [T, Hkv*D], [T, Hkv*D] (this rank's heads)
        if self.qk_norm:
            q = self.q_norm(q.reshape(-1, self.head_size)).view(q.shape[0], -1)  # each head over D
            k = self.k_norm(k.reshape(-1, self.head_size)).view(k.shape[0], -1)
        return self.o_proj(self.attn(q, k, v, ctx, positions=positions, rotary_emb=self.rotary_emb))


class Gemma3Attention(GemmaAttention):
    qk_norm: ClassVar[bool] = True


class GemmaDecoderLayer(nn.Module):
    """Sandwich-norm block: ``h += post_attn_norm(attn(input_norm(h))); h += post_ff_norm(mlp(pre_ff_norm(h)))``.

    The residual stream travels as a pair ``(h, rest)`` whose sum is the stream, as in ``LlamaDecoderLayer``: each
    add is made by the next norm (``GemmaRMSNorm`` with ``residual``)."""

    attention_cls: ClassVar[type[GemmaAttention]] = GemmaAttention

    def __init__(self, config: Any, *, layer_idx: int, rotary_emb: RotaryEmbedding, head_size: int,
                 dtype: torch.dtype, attn_backend: type[AttentionBackend],
                 quant_config: QuantizationConfig | None, prefix: str):
        super().__init__()
        hidden, eps = config.hidden_size, config.rms_norm_eps
        self.input_layernorm = GemmaRMSNorm(hidden, eps, dtype=dtype)
        self.self_attn = self.attention_cls(config, layer_idx=layer_idx, rotary_emb=rotary_emb, head_size=head_size,
                                            dtype=dtype, attn_backend=attn_backend, quant_config=quant_config,
                                            prefix=f"{prefix}.self_attn")
        self.post_attention_layernorm = GemmaRMSNorm(hidden, eps, dtype=dtype)
        self.pre_feedforward_layernorm = GemmaRMSNorm(hidden, eps, dtype=dtype)
        self.mlp = GemmaMLP(hidden, config.intermediate_size, dtype=dtype, quant_config=quant_config,
                            prefix=f"{prefix}.mlp")
        self.post_feedforward_layernorm = GemmaRMSNorm(hidden, eps, dtype=dtype)

    def forward(self, positions: torch.Tensor, h: torch.Tensor, rest: torch.Tensor | None,
                ctx: AttentionContext) -> tuple[torch.Tensor, torch.Tensor]:
        """Args: (h, rest) [T, hidden], the HF layer's input as a pair. Returns the HF layer's output the same way:
        ``(post_ff_norm(mlp(...)), stream after attention)``."""
        x, stream = (self.input_layernorm(h), h) if rest is None else self.input_layernorm(h, rest)
        attn = self.post_attention_layernorm(self.self_attn(positions, x, ctx))
        x, stream = self.pre_feedforward_layernorm(attn, stream)
        return self.post_feedforward_layernorm(self.mlp(x)), stream


class Gemma3DecoderLayer(GemmaDecoderLayer):
    attention_cls: ClassVar[type[GemmaAttention]] = Gemma3Attention


class GemmaModel(LlamaModel):
    """``LlamaModel`` with Gemma's final norm, its embedding times ``sqrt(hidden_size)`` and its layer types (each
    type its rope: Gemma 3's local and global bases)."""

    norm_cls: ClassVar[type[nn.Module]] = GemmaRMSNorm

    def __init__(self, config: Any, **kwargs: Any):
        super().__init__(config, **kwargs)
        # A Python float already rounded to the model dtype: a tensor made per step would be a host-to-device copy,
        # which a CUDA graph cannot capture.
        self.normalizer = torch.tensor(float(config.hidden_size) ** 0.5, dtype=kwargs["dtype"]).item()

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """[T] ids -> [T, hidden]: the rows times ``sqrt(hidden_size)``, the factor first rounded to the model dtype
        (transformers' ``normalizer``: 48.0 not 47.99 in bf16 for hidden 2304)."""
        return self.embed_tokens(input_ids) * self.normalizer

    @staticmethod
    def layer_type(config: Any, layer_idx: int) -> str:
        return gemma_layer_type(config, layer_idx)


class Gemma2ForCausalLM(LlamaForCausalLM):
    """Gemma 2 (``Gemma2ForCausalLM``): ``GemmaModel`` of ``GemmaDecoderLayer``s, final logits soft-capped."""

    capabilities: ClassVar[ModelCapabilities] = ModelCapabilities(tensor_parallel=True, pipeline_parallel=True)
    decoder_layer_cls: ClassVar[type[nn.Module]] = GemmaDecoderLayer
    model_cls: ClassVar[type[LlamaModel]] = GemmaModel

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """Final norm and LM head, then ``cap * tanh(logits / cap)`` with ``final_logit_softcapping`` (when set).
        Args: [N, hidden]. Returns [N, vocab] in the model dtype."""
        logits = super().compute_logits(hidden_states)
        cap = getattr(self.config, "final_logit_softcapping", None)
        if cap:
            logits = torch.tanh(logits / cap) * cap
        return logits

    @classmethod
    def check_config(cls, hf_config: Any, config: Any) -> None:
        """Refuse what this class does not compute as the checkpoint means: a rope type Brigade lacks, another
        activation than tanh-GELU, bidirectional attention (EmbeddingGemma).

        Raises:
            ConfigError: one line naming the setting.
        """
        super().check_config(hf_config, config)
        if _activation(hf_config) not in _GELU_TANH:
            raise ConfigError(f"{cls.__name__}: activation {_activation(hf_config)!r} is not supported; Gemma's MLP "
                              "runs gelu_pytorch_tanh")
        if getattr(hf_config, "use_bidirectional_attention", False):
            raise ConfigError(f"{cls.__name__}: bidirectional attention (use_bidirectional_attention) is not "
                              "supported; Brigade serves causal decoders")


class Gemma3ForCausalLM(Gemma2ForCausalLM):
    """Gemma 3, text only (``Gemma3ForCausalLM``, model_type ``gemma3_text``): Gemma 2's model with q/k norms and a
    rope per layer type."""

    decoder_layer_cls: ClassVar[type[nn.Module]] = Gemma3DecoderLayer
