"""Llama-family decoder (Llama 2/3, Mistral, Qwen2; Qwen3 in ``qwen3``) over the paged-attention interface.

One code path serves the three architectures; they differ only in config values:

* Qwen2 has biases on q/k/v (and never on o_proj); Llama has ``attention_bias`` (all four) and
  ``mlp_bias``; Mistral has neither.
* ``head_dim`` is read from the config when present (Mistral-Nemo, Qwen), else hidden / heads.
* ``sliding_window`` (Mistral v0.1, Qwen2 with ``use_sliding_window``): each layer ``config.layer_types`` marks
  ``"sliding_attention"`` (every layer when the config has no ``layer_types``) attends to the last
  ``sliding_window`` tokens only (``layer_sliding_window``); the attention backend applies the window.

Tokens of all requests of a step are concatenated in one dimension (``[num_tokens, ...]``); the
attention backend alone knows where each request starts, through ``ctx.metadata``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any, ClassVar

import torch
from torch import nn

from brigade.attention.backend import AttentionBackend, AttentionContext
from brigade.config.engine_config import sliding_window
from brigade.config.errors import ConfigError
from brigade.model_executor.layers.activation import SiluAndMul
from brigade.model_executor.layers.attention import Attention
from brigade.model_executor.layers.layernorm import RMSNorm
from brigade.model_executor.layers.linear import MergedColumnLinear, QKVLinear, RowParallelLinear
from brigade.model_executor.layers.linear_method import QuantizationConfig, get_linear_method
from brigade.model_executor.layers.rotary_embedding import RopeParameters, RotaryEmbedding, get_rope_parameters
from brigade.model_executor.kv_scales import kv_scale_target, load_kv_scale
from brigade.model_executor.layers.vocab import LMHead, VocabEmbedding
from brigade.model_executor.models.interface import CausalLM, ModelCapabilities
from brigade.model_executor.models.pipeline import IntermediateTensors, MissingLayer, StageLayout, stage_inputs
from brigade.model_executor.weight_utils import default_weight_loader


# HF projection name -> (Brigade merged parameter's module, shard id)
_STACKED_PARAMS: tuple[tuple[str, str, str | int], ...] = (
    (".q_proj.", ".qkv_proj.", "q"),
    (".k_proj.", ".qkv_proj.", "k"),
    (".v_proj.", ".qkv_proj.", "v"),
    (".gate_proj.", ".gate_up_proj.", 0),
    (".up_proj.", ".gate_up_proj.", 1),
)
# Checkpoint tensors that are not weights: precomputed RoPE tables some exporters save.
_SKIPPED = re.compile(r"rotary_emb\.(inv_freq|cos_cached|sin_cached)$")


def layer_type(config: Any, layer_idx: int) -> str:
    """Layer ``layer_idx``'s attention type, ``"full_attention"`` or ``"sliding_attention"``: ``config.layer_types``
    when the config has it (transformers 5 fills it for Qwen2 from ``max_window_layers``, for Gemma from its
    pattern), else sliding for every layer when the config asks for a window (Mistral, Mixtral, Phi-3)."""
    types = getattr(config, "layer_types", None)
    if types:
        return types[layer_idx]
    return "full_attention" if sliding_window(config) is None else "sliding_attention"


def layer_sliding_window(config: Any, layer_idx: int, kind: str | None = None) -> int | None:
    """The window of layer ``layer_idx`` (``kind``: its type, default ``layer_type``), or None for full attention:
    ``config.sliding_window`` on a sliding layer, unless the config switches windows off (``use_sliding_window``
    false, a window of 0)."""
    if (kind or layer_type(config, layer_idx)) != "sliding_attention":
        return None
    return sliding_window(config)


class LlamaMLP(nn.Module):
    """SwiGLU feed-forward: ``down(silu(gate(x)) * up(x))`` with gate and up in one GEMM."""

    def __init__(self, hidden_size: int, intermediate_size: int, *, bias: bool, dtype: torch.dtype,
                 quant_config: QuantizationConfig | None, prefix: str):
        super().__init__()
        self.gate_up_proj = MergedColumnLinear(
            hidden_size, [intermediate_size, intermediate_size], bias=bias, dtype=dtype,
            quant_method=get_linear_method(quant_config, f"{prefix}.gate_up_proj"))
        self.down_proj = RowParallelLinear(intermediate_size, hidden_size, bias=bias, dtype=dtype,
                                           quant_method=get_linear_method(quant_config, f"{prefix}.down_proj"))
        self.act_fn = SiluAndMul()

    def forward(self, h: torch.Tensor, rest: torch.Tensor | None, norm: RMSNorm
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``stream + mlp(norm(stream))`` for the residual stream ``h + rest`` (rest None: ``h``).

        Args: h, rest [T, hidden]. Returns the new stream as ``(h, rest)`` the same way. Where the platform
        has the kernels for this batch (the CUDA platform at one token), the norm runs inside the gate/up GEMM,
        SiLU-and-mul inside the down GEMM and the residual add in its epilogue; otherwise the norm kernel makes
        the pending add, and the add after the down projection is left pending for the next norm.
        """
        gate_up, stream = self.gate_up_proj.forward_normed(h, rest, norm)
        out = self.down_proj.forward_silu_mul(gate_up, residual=stream)
        return out if out is not None else self.down_proj.forward_add(self.act_fn(gate_up), stream)


class LlamaAttention(nn.Module):
    """Self-attention block: fused QKV projection, rotary embedding, paged attention, output projection."""

    def __init__(self, config: Any, *, layer_idx: int, rotary_emb: RotaryEmbedding, head_size: int,
                 dtype: torch.dtype, attn_backend: type[AttentionBackend],
                 quant_config: QuantizationConfig | None, prefix: str):
        super().__init__()
        hidden_size = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = getattr(config, "num_key_value_heads", None) or self.num_heads
        self.head_size = head_size
        qkv_bias, o_bias = _attention_biases(config)
        self.qkv_proj = QKVLinear(hidden_size, head_size, self.num_heads, self.num_kv_heads, bias=qkv_bias,
                                  dtype=dtype, quant_method=get_linear_method(quant_config, f"{prefix}.qkv_proj"))
        self.o_proj = RowParallelLinear(self.num_heads * head_size, hidden_size, bias=o_bias, dtype=dtype,
                                        quant_method=get_linear_method(quant_config, f"{prefix}.o_proj"))
        self.rotary_emb = rotary_emb  # shared by all layers: one cos/sin table per model
        # This rank's heads (all of them with one rank): the KV cache holds its KV heads only.
        self.attn = Attention(self.qkv_proj.num_heads, head_size, self.qkv_proj.num_kv_heads, layer_idx=layer_idx,
                              backend_cls=attn_backend, **self.attention_options(config, layer_idx))

    def attention_options(self, config: Any, layer_idx: int) -> dict[str, Any]:
        """The ``Attention`` variant of this layer: ``scale`` (``head_size ** -0.5``) and ``sliding_window``
        (``layer_sliding_window``); Gemma adds its query scale and soft-capping."""
        return {"scale": self.head_size ** -0.5, "sliding_window": layer_sliding_window(config, layer_idx)}

    def forward(self, positions: torch.Tensor, h: torch.Tensor, rest: torch.Tensor | None, ctx: AttentionContext,
                norm: RMSNorm) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``stream + attn(norm(stream))`` for the residual stream ``h + rest`` (rest None: ``h``).

        Args: positions [T] int64; h, rest [T, hidden]. Returns the new stream as ``(h, rest)``: the norm may
        run inside the qkv GEMM and the add in o_proj's epilogue, or the add is left for the next norm.
        """
        qkv, stream = self.qkv_proj.forward_normed(h, rest, norm)
        q, k, v = self.qkv_proj.split(qkv)  # [T, H*D], [T, Hkv*D], [T, Hkv*D]
        # The backend applies the rotation (and may fuse it into its KV-cache write).
        attn = self.attn(q, k, v, ctx, positions=positions, rotary_emb=self.rotary_emb)
        return self.o_proj.forward_add(attn, stream)


class LlamaDecoderLayer(nn.Module):
    """Pre-norm block: ``h += attn(norm(h)); h += mlp(norm(h))``.

    The residual stream travels as a pair ``(h, rest)`` whose sum is the stream: each add is done either in
    the epilogue of the projection that ends its branch (o_proj, down_proj; ``rest`` is then None) or by the
    next norm's fused add-and-normalize kernel, whichever the platform has for the batch.

    Subclasses change the two halves through ``attention_cls`` (Qwen3's and Qwen3-MoE's q/k norms per head) and
    ``build_mlp`` (the MoE models' sparse block); the norms, the residual pair and ``forward`` stay these."""

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
        self.mlp = self.build_mlp(config, layer_idx=layer_idx, dtype=dtype, quant_config=quant_config,
                                  prefix=f"{prefix}.mlp")

    def build_mlp(self, config: Any, *, layer_idx: int, dtype: torch.dtype, quant_config: QuantizationConfig | None,
                  prefix: str) -> nn.Module:
        """The feed-forward half: a module called ``mlp(h, rest, norm)`` like ``LlamaMLP.forward``."""
        return LlamaMLP(config.hidden_size, config.intermediate_size, bias=bool(getattr(config, "mlp_bias", False)),
                        dtype=dtype, quant_config=quant_config, prefix=prefix)

    def forward(self, positions: torch.Tensor, h: torch.Tensor, rest: torch.Tensor | None,
                ctx: AttentionContext) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Args: (h, rest) [T, hidden], the HF layer's input as a pair (see the class docstring). Returns the
        HF layer's output the same way."""
        h, rest = self.self_attn(positions, h, rest, ctx, self.input_layernorm)
        return self.mlp(h, rest, self.post_attention_layernorm)

    def fold_norms(self) -> int:
        """Fold the norms' weights into the projections that read them (``LinearBase.fold_input_norm``): the
        input norm into qkv, the post-attention norm into a dense MLP's gate/up (an MoE block keeps its norm: the
        router and every expert read its output). Returns how many were folded (a quantized projection keeps its
        norm)."""
        folded = int(self.self_attn.qkv_proj.fold_input_norm(self.input_layernorm))
        if isinstance(self.mlp, LlamaMLP):
            folded += int(self.mlp.gate_up_proj.fold_input_norm(self.post_attention_layernorm))
        return folded


class LlamaModel(nn.Module):
    """Embedding and decoder layers; the final norm is applied by ``LlamaForCausalLM.compute_logits`` to the
    rows it scores only, which lets a platform fuse it into the LM head.

    Subclasses change the final norm (``norm_cls``), the embedding (``embed``: Gemma scales it), the layer types
    (``layer_type``: each type gets its rotary embedding, from ``get_rope_parameters(config, type)``) and the
    rotary layout (``is_neox_style``)."""

    norm_cls: ClassVar[type[nn.Module]] = RMSNorm

    def __init__(self, config: Any, *, dtype: torch.dtype, attn_backend: type[AttentionBackend],
                 quant_config: QuantizationConfig | None, prefix: str = "model",
                 layer_cls: Callable[..., nn.Module] = LlamaDecoderLayer, max_model_len: int | None = None):
        """``layer_cls``: the decoder layer, built with ``LlamaDecoderLayer``'s arguments (the MoE models pass
        theirs, bound to their own options with ``functools.partial``). ``max_model_len``: the longest sequence
        served (LongRoPE picks its factors from it)."""
        super().__init__()
        head_size = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        ropes: list[tuple[RopeParameters, RotaryEmbedding]] = []  # one table per distinct rope of the layers

        def rotary_for(layer_idx: int) -> RotaryEmbedding:
            rope = get_rope_parameters(config, self.layer_type(config, layer_idx))
            for known, emb in ropes:
                if known == rope:
                    return emb
            ropes.append((rope, RotaryEmbedding(head_size, int(head_size * rope.partial_rotary_factor),
                                                config.max_position_embeddings, rope,
                                                is_neox_style=self.is_neox_style(config),
                                                max_model_len=max_model_len)))
            return ropes[-1][1]

        self.stage = StageLayout.of(config.num_hidden_layers)
        self.hidden_size = config.hidden_size
        tied = bool(getattr(config, "tie_word_embeddings", False))
        # The first stage embeds; the last needs the matrix too when its LM head is tied to it.
        self.embed_tokens = VocabEmbedding(config.vocab_size, config.hidden_size, dtype=dtype) \
            if self.stage.is_first or (tied and self.stage.is_last) else None
        self.layers = nn.ModuleList([
            layer_cls(config, layer_idx=i, rotary_emb=rotary_for(i), head_size=head_size, dtype=dtype,
                      attn_backend=attn_backend, quant_config=quant_config, prefix=f"{prefix}.layers.{i}")
            if self.stage.holds(i) else MissingLayer()
            for i in range(config.num_hidden_layers)])
        self.norm = self.norm_cls(config.hidden_size, config.rms_norm_eps, dtype=dtype)
        # This stage's layers as a plain list (not registered twice; no ModuleList built per forward).
        self.stage_layers = list(self.layers)[self.stage.start:self.stage.end]

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: AttentionContext,
                intermediate: IntermediateTensors | None = None) -> torch.Tensor | IntermediateTensors:
        """This stage's layers (every layer without a pipeline). Args: input_ids, positions [T]; ``intermediate``
        the previous stage's stream (later stages). Returns [T, hidden], or on a stage before the last the
        ``IntermediateTensors`` to send on."""
        if self.stage.is_first:
            h, rest = self.embed(input_ids), None  # [T, hidden]
        else:
            h, rest = stage_inputs(intermediate, input_ids.shape[0], self.hidden_size, self.norm.weight.dtype,
                                   input_ids.device)
        for layer in self.stage_layers:
            h, rest = layer(positions, h, rest, ctx)
        if not self.stage.is_last:
            return {"hidden_states": h} if rest is None else {"hidden_states": h, "residual": rest}
        return h if rest is None else h + rest

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """[T] int64 token ids -> [T, hidden] embeddings in the model dtype."""
        return self.embed_tokens(input_ids)

    @staticmethod
    def layer_type(config: Any, layer_idx: int) -> str:
        """Layer ``layer_idx``'s attention type (``llama.layer_type``), which picks its rope parameters."""
        return layer_type(config, layer_idx)

    @staticmethod
    def is_neox_style(config: Any) -> bool:
        """Whether the rotary embedding pairs channel ``i`` with ``i + rotary_dim / 2`` (Llama's layout) rather than
        ``2i`` with ``2i + 1`` (GPT-J's, DeepSeek's)."""
        return True


class LlamaForCausalLM(CausalLM):
    """A Llama-family causal LM (also registered as MistralForCausalLM and Qwen2ForCausalLM).

    Parameter names follow HF's with q/k/v merged into ``qkv_proj`` and gate/up into ``gate_up_proj``;
    ``load_weights`` does the mapping. Layer ``i`` uses ``ctx.kv_caches[i]``.
    """

    capabilities: ClassVar[ModelCapabilities] = ModelCapabilities(
        tensor_parallel=True,  # column/row-parallel layers, vocabulary split
        pipeline_parallel=True,  # a stage's layers only (``pipeline.StageLayout``)
        lora=True, fold_norms=True)

    # Merged layer -> the HF projections inside it, in shard order. Quantization configs receive the
    # merged prefix (``...self_attn.qkv_proj``) and use this to match checkpoint names and ignore lists.
    packed_modules_mapping: ClassVar[dict[str, list[str]]] = {
        "qkv_proj": ["q_proj", "k_proj", "v_proj"],
        "gate_up_proj": ["gate_proj", "up_proj"],
    }
    decoder_layer_cls: ClassVar[type[nn.Module]] = LlamaDecoderLayer
    """The decoder layer ``LlamaModel`` stacks (subclasses with another block set theirs)."""
    model_cls: ClassVar[type[LlamaModel]] = LlamaModel
    """The embedding-and-layers module (Gemma's scales its embedding and uses its own norm)."""

    def __init__(self, hf_config: Any, *, dtype: torch.dtype, attn_backend: type[AttentionBackend],
                 quant_config: QuantizationConfig | None = None,
                 layer_cls: Callable[..., nn.Module] | None = None, max_model_len: int | None = None):
        """Args as ``CausalLM``; ``layer_cls`` builds each decoder layer (default ``decoder_layer_cls``; the MoE
        models pass theirs bound to their own options)."""
        super().__init__(hf_config, dtype=dtype, attn_backend=attn_backend, quant_config=quant_config,
                         max_model_len=max_model_len)
        self.config = hf_config
        self.dtype = dtype
        self.model = self.model_cls(hf_config, dtype=dtype, attn_backend=attn_backend, quant_config=quant_config,
                                    layer_cls=layer_cls or self.decoder_layer_cls, max_model_len=max_model_len)
        self.tie_word_embeddings = bool(getattr(hf_config, "tie_word_embeddings", False))
        self.lm_head = LMHead(hf_config.vocab_size, hf_config.hidden_size, dtype=dtype) \
            if self.model.stage.is_last else None  # only the last pipeline stage scores
        if self.tie_word_embeddings and self.lm_head is not None:
            self.lm_head.tie_to(self.model.embed_tokens)

    @classmethod
    def check_config(cls, hf_config: Any, config: Any) -> None:
        """Refuse a rope type Brigade does not implement, on any layer type, in one line naming the architecture.

        Raises:
            ConfigError: ``get_rope_parameters``'s refusal.
        """
        for kind in sorted({cls.model_cls.layer_type(hf_config, i) for i in range(hf_config.num_hidden_layers)}):
            try:
                get_rope_parameters(hf_config, kind)
            except ValueError as e:
                raise ConfigError(f"{cls.__name__}: {e}") from None

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: AttentionContext,
                intermediate: IntermediateTensors | None = None) -> torch.Tensor | IntermediateTensors:
        """Run every layer (this pipeline stage's) on the step's tokens.

        Args:
            input_ids: [T] int64 token ids of all scheduled tokens, requests back to back.
            positions: [T] int64 absolute position of each token in its request.
            ctx: the step's attention metadata and one KV cache per layer.
            intermediate: on a pipeline stage after the first, what the previous stage returned.

        Returns:
            [T, hidden_size] hidden states in the model dtype: the last layer's output, before the final norm
            (``compute_logits`` applies it); on a stage before the last, the ``IntermediateTensors`` to send on.
        """
        return self.model(input_ids, positions, ctx, intermediate)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """Final norm and LM head. Args: hidden_states [N, hidden] rows of ``forward``'s output (usually each
        request's last token). Returns [N, vocab] in the model dtype."""
        return self.lm_head.forward_normed(hidden_states, self.model.norm)

    def fold_norm_weights(self) -> int:
        """Fold every RMSNorm's weight into the projection that reads its output (the platform asked, see
        ``linear_method.fold_norms_wanted``): the same function, the norm then a plain ``x / rms(x)`` a GEMM
        can apply while it reads ``x``. Returns the number of norms folded (the final norm stays when the LM
        head is tied to the embedding, and a quantized projection keeps its norm). Call once, after loading.
        """
        folded = sum(layer.fold_norms() for layer in self.model.layers if not isinstance(layer, MissingLayer))
        return folded + int(self.lm_head is not None and self.lm_head.fold_input_norm(self.model.norm))

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Load HF-named checkpoint tensors into the merged parameters.

        Skips precomputed RoPE tables and, with tied embeddings, ``lm_head.weight`` (the head shares
        the embedding). The fp8 KV cache's per-layer ``k_scale``/``v_scale`` go to the attention layers
        (``kv_scales``). Returns the set of checkpoint names that were loaded.

        Raises:
            ValueError: a checkpoint tensor matches no parameter, does not fit its parameter, or a
                parameter (or one shard of a merged one) received no tensor at all; a bad KV-cache scale.
        """
        params = dict(self.named_parameters())
        loaded_names: set[str] = set()
        filled: dict[str, set[str | int | None]] = {}
        for hf_name, tensor in weights:
            if _SKIPPED.search(hf_name) or (self.tie_word_embeddings and hf_name == "lm_head.weight"):
                continue
            if (scale_of := kv_scale_target(hf_name)) is not None:  # the fp8 KV cache's k/v scale of a layer
                if self._on_this_stage(scale_of[0] + "."):
                    load_kv_scale(self, *scale_of, hf_name, tensor)
                    loaded_names.add(hf_name)
                continue
            name, shard_id = self.checkpoint_name(hf_name)
            param = params.get(name)
            if param is None and not self._on_this_stage(name):
                continue  # another pipeline stage's layer, embedding or head
            if param is None:
                raise ValueError(f"checkpoint tensor {hf_name!r} matches no parameter of {type(self).__name__} "
                                 f"(looked for {name!r}); is this checkpoint for another architecture?")
            loader = getattr(param, "weight_loader", default_weight_loader)
            try:
                if shard_id is None:
                    loader(param, tensor)
                else:
                    loader(param, tensor, shard_id)
            except ValueError as e:
                raise ValueError(f"cannot load {hf_name!r}: {e}") from None
            loaded_names.add(hf_name)
            filled.setdefault(name, set()).add(shard_id)
        _check_complete(params, filled)
        return loaded_names

    def checkpoint_name(self, hf_name: str) -> tuple[str, Any]:
        """The parameter a checkpoint tensor loads into and its shard id (None for a whole tensor): q/k/v into
        ``qkv_proj``, gate/up into ``gate_up_proj``. Subclasses map more names (the MoE models' experts)."""
        return _to_brigade_name(hf_name)

    def _on_this_stage(self, name: str) -> bool:
        """Whether the parameter ``name`` belongs to this pipeline stage (always, without a pipeline)."""
        stage = self.model.stage
        if name.startswith("model.embed_tokens."):
            return self.model.embed_tokens is not None
        if name.startswith("lm_head."):
            return self.lm_head is not None
        match = re.match(r"model\.layers\.(\d+)\.", name)
        return match is None or stage.holds(int(match.group(1)))


def _to_brigade_name(hf_name: str) -> tuple[str, str | int | None]:
    for hf_part, merged_part, shard_id in _STACKED_PARAMS:
        if hf_part in hf_name:
            return hf_name.replace(hf_part, merged_part), shard_id
    return hf_name, None


def _check_complete(params: dict[str, nn.Parameter], filled: dict[str, set[str | int | None]]) -> None:
    missing = []
    for name, param in params.items():
        seen = filled.get(name)
        if seen is None and getattr(param, "required_in_checkpoint", True) is False:
            continue
        if seen is None:
            missing.append(name)
            continue
        expected = getattr(param, "shard_ids", None)
        if expected is not None and None not in seen:
            missing.extend(f"{name} (shard {s!r})" for s in expected if s not in seen)
    if missing:
        shown = ", ".join(missing[:8]) + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
        raise ValueError(f"the checkpoint lacks {len(missing)} weight(s): {shown}")


def _attention_biases(config: Any) -> tuple[bool, bool]:
    """(q/k/v bias, o_proj bias). Qwen2 configs have no attention_bias but bias q/k/v (Qwen2-MoE: unless
    ``qkv_bias`` is false)."""
    if getattr(config, "model_type", None) in ("qwen2", "qwen2_moe"):
        return bool(getattr(config, "qkv_bias", True)), False
    bias = bool(getattr(config, "attention_bias", False))
    return bias, bias
