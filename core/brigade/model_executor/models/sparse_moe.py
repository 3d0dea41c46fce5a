"""What the mixture-of-experts decoders (Mixtral, Qwen2-MoE, Qwen3-MoE, gpt-oss, DeepSeek) share: the sparse MoE
block, the decoder layer around it, the causal LM base that maps expert checkpoint names, and the start-up check of
the config.

The attention half of each layer is the Llama family's (``llama.LlamaAttention``, or Qwen3-MoE's subclass with
q/k norms); only the feed-forward half changes: a router picks each token's ``top_k`` experts
(``layers/moe_router.py``), the experts run as one ``FusedMoE`` op (``layers/fused_moe.py``), and Qwen2-MoE adds a
shared expert whose output is scaled by a sigmoid gate. Layers a config keeps dense (Qwen's ``mlp_only_layers``
and ``decoder_sparse_step``) use ``llama.LlamaMLP``. DeepSeek (``deepseek``) brings its own attention, router and
ungated shared experts.
"""

from __future__ import annotations

import re
from functools import partial
from typing import Any, ClassVar

import torch
from torch import nn

from brigade.config import ConfigError
from brigade.distributed import get_dp_group, get_ep_group, get_tp_group
from brigade.model_executor.layers.expert_load import ExpertLoad
from brigade.model_executor.layers.fused_moe import DOWN, GATE, UP, FusedMoE
from brigade.model_executor.layers.layernorm import RMSNorm
from brigade.model_executor.layers.linear import Linear
from brigade.model_executor.layers.linear_method import QuantizationConfig, UnquantizedLinearMethod
from brigade.model_executor.layers.moe_activation import SILU, MoEActivation
from brigade.model_executor.layers.moe_dispatch import ExpertDispatch, agree_num_tokens, dp_step
from brigade.model_executor.layers.moe_router import TopKRouter
from brigade.model_executor.models.interface import ModelCapabilities
from brigade.model_executor.models.llama import LlamaDecoderLayer, LlamaForCausalLM, LlamaMLP

# experts.{e}.{projection}.weight -> the stacked parameter and the projection's shard id
_EXPERT = re.compile(r"\.experts\.(\d+)\.(gate_proj|up_proj|down_proj|w1|w3|w2)\.(weight|bias)$")
_EXPERT_PROJ = {"gate_proj": GATE, "w1": GATE, "up_proj": UP, "w3": UP, "down_proj": DOWN, "w2": DOWN}


class SparseMoeBlock(nn.Module):
    """``sum over the top_k experts of w_e * expert_e(x)`` (+ ``sigmoid(shared_gate(x)) * shared_expert(x)``).

    Submodules carry the checkpoint's names: ``gate`` (the router, [E, H], never quantized, whole on every rank),
    ``experts`` (``FusedMoE``), and, with a shared expert, ``shared_expert`` (a ``LlamaMLP``, column/row-sharded
    like a dense MLP under TP) and ``shared_expert_gate`` ([1, H], whole on every rank, never quantized).
    Under a quantization config the experts take its ``get_moe_method`` and the shared expert its linear method,
    like any dense MLP. gpt-oss's variant (``router_bias``, ``softmax_after_topk``, ``activation``,
    ``expert_bias``): a router with a bias whose softmax comes after the top-k, and experts with biases and its
    clamped SwiGLU.

    Under ``-tp N`` the experts are sliced on their intermediate dimension, or, with ``--enable-expert-parallel``,
    spread whole over the expert-parallel group (``FusedMoE``). Either way every rank computes a partial sum of
    the block's output for all tokens (the shared expert's partial scaled by the replicated sigmoid gate, which
    distributes over the sum), and one all-reduce per layer over the TP group adds them. When the EP group spans
    data-parallel engines (``-dp`` above 1), the experts' partial first goes through ``ExpertDispatch``: every
    DP rank's tokens are gathered, run through this rank's experts, and summed back over the DP ranks.

    Raises:
        ConfigError: a quantization config with no method for the experts (``get_moe_method`` returns None).
    """

    def __init__(self, *, hidden_size: int, num_experts: int, top_k: int, intermediate_size: int,
                 renormalize: bool, shared_intermediate_size: int, dtype: torch.dtype,
                 quant_config: QuantizationConfig | None, prefix: str, expert_parallel: bool = False,
                 router_bias: bool = False, softmax_after_topk: bool = False, activation: MoEActivation = SILU,
                 expert_bias: bool = False):
        super().__init__()
        self.top_k = top_k
        self.renormalize = renormalize
        self.gate = Linear(hidden_size, num_experts, bias=router_bias, dtype=dtype,
                           quant_method=UnquantizedLinearMethod())
        self.router = TopKRouter(top_k, renormalize, softmax_after_topk)
        moe_method = None
        if quant_config is not None:
            moe_method = quant_config.get_moe_method(f"{prefix}.experts")
            if moe_method is None:
                raise ConfigError(f"quantization {quant_config.name} has no method for mixture-of-experts layers "
                                  f"({prefix}.experts would stay in the model dtype); serve this model without "
                                  "--quantization, or with --quantization fp8")
        experts = dict(dtype=dtype, quant_method=moe_method, activation=activation, bias=expert_bias)
        self.group = get_tp_group()  # the final all-reduce: the TP ranks of this DP rank
        self.dispatch: ExpertDispatch | None = None  # experts spread over DP engines: their tokens come and go
        if expert_parallel:
            ep = get_ep_group()
            self.experts = FusedMoE(num_experts, top_k, hidden_size, intermediate_size, ep_rank=ep.rank_in_group,
                                    ep_size=ep.world_size, **experts)
            if get_dp_group().world_size > 1:
                self.dispatch = ExpertDispatch(get_dp_group())
        else:
            self.experts = FusedMoE(num_experts, top_k, hidden_size, intermediate_size,
                                    tp_rank=self.group.rank_in_group, tp_size=self.group.world_size,
                                    **experts)
        self.shared_expert = self.shared_expert_gate = None
        if shared_intermediate_size:
            self.shared_expert = LlamaMLP(hidden_size, shared_intermediate_size, bias=False, dtype=dtype,
                                          quant_config=quant_config, prefix=f"{prefix}.shared_expert")
            self.shared_expert_gate = Linear(hidden_size, 1, dtype=dtype, quant_method=UnquantizedLinearMethod())
        self.expert_load: tuple[ExpertLoad, int] | None = None  # (the model's counts, this layer's row)

    def moe(self, x: torch.Tensor) -> torch.Tensor:
        """Args: x [T, hidden], the normalized stream (whole on every rank). Returns [T, hidden] in x's dtype."""
        counts = num_tokens = None
        if self.expert_load is not None:  # the router adds this layer's routing to the expert-load counts
            load, row = self.expert_load
            counts, num_tokens = load.counts[row], load.num_tokens
        topk_weights, topk_ids = self.router(self.gate(x), counts, num_tokens)  # [T, k] each
        if self.dispatch is None:
            out = self.experts(x, topk_weights, topk_ids)  # this rank's experts' share
        else:  # every DP rank's tokens through this rank's experts, and this DP rank's rows back, summed
            out = self.dispatch(self.experts, x, topk_weights, topk_ids)
        shared_out = self.shared_output(x)
        if shared_out is not None:
            out = out + shared_out
        return self.group.all_reduce(out)  # a no-op with one rank

    def shared_output(self, x: torch.Tensor) -> torch.Tensor | None:
        """This rank's partial of the shared expert's output ([T, hidden], before the TP all-reduce) scaled by its
        sigmoid gate (Qwen2-MoE), or None without a shared expert. DeepSeek's ungated shared experts override it."""
        if self.shared_expert is None:
            return None
        shared = self.shared_expert
        shared_out = shared.down_proj.forward_partial(shared.act_fn(shared.gate_up_proj(x)))
        return torch.sigmoid(self.shared_expert_gate(x)) * shared_out

    def forward(self, h: torch.Tensor, rest: torch.Tensor | None, norm: RMSNorm
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``stream + moe(norm(stream))`` for the residual stream ``h + rest``, as ``LlamaMLP.forward``: returns
        ``(out, stream)``, the add left to the next norm's fused add-and-normalize kernel."""
        if rest is None:
            x, stream = norm(h), h
        else:
            x, stream = norm(h, rest)
        return self.moe(x), stream


class MoEDecoderLayer(LlamaDecoderLayer):
    """``LlamaDecoderLayer`` whose ``mlp`` is a ``SparseMoeBlock`` on the layers the config makes sparse (a dense
    ``LlamaMLP`` on the others). Subclasses say which attention (``attention_cls``) and where the layer is
    sparse (``is_sparse``)."""

    def __init__(self, config: Any, *, expert_parallel: bool = False, **kwargs: Any):
        """``expert_parallel``: the sparse block spreads whole experts over the EP group
        (``--enable-expert-parallel``); other arguments: ``LlamaDecoderLayer``'s."""
        object.__setattr__(self, "expert_parallel", expert_parallel)  # read by build_mlp, before Module init
        super().__init__(config, **kwargs)

    def build_mlp(self, config: Any, *, layer_idx: int, dtype: torch.dtype, quant_config: QuantizationConfig | None,
                  prefix: str) -> nn.Module:
        if not self.is_sparse(config, layer_idx):
            return LlamaMLP(config.hidden_size, config.intermediate_size, bias=False, dtype=dtype,
                            quant_config=quant_config, prefix=prefix)
        return SparseMoeBlock(hidden_size=config.hidden_size, dtype=dtype, quant_config=quant_config, prefix=prefix,
                              expert_parallel=self.expert_parallel, **moe_spec(config))

    @staticmethod
    def is_sparse(config: Any, layer_idx: int) -> bool:
        """Whether layer ``layer_idx`` has experts; Mixtral: every layer."""
        return True


def moe_spec(config: Any) -> dict[str, Any]:
    """The ``SparseMoeBlock`` arguments a config gives (Mixtral's, Qwen MoE's and gpt-oss's field names)."""
    model_type = getattr(config, "model_type", None)
    if model_type == "gpt_oss":  # transformers' GptOssMLP: router bias, top-k then softmax, biased clamped SwiGLU
        activation = MoEActivation("swigluoai", alpha=float(getattr(config, "swiglu_alpha", 1.702)),
                                   limit=float(getattr(config, "swiglu_limit", 7.0)))
        return dict(num_experts=config.num_local_experts, top_k=config.num_experts_per_tok,
                    intermediate_size=config.intermediate_size, renormalize=True, shared_intermediate_size=0,
                    router_bias=True, softmax_after_topk=True, activation=activation, expert_bias=True)
    if model_type in ("deepseek_v2", "deepseek_v3"):  # the routed experts; the router is DeepSeek's own
        return dict(num_experts=config.n_routed_experts, top_k=config.num_experts_per_tok,
                    intermediate_size=config.moe_intermediate_size,
                    renormalize=bool(getattr(config, "norm_topk_prob", False)),
                    shared_intermediate_size=config.moe_intermediate_size * (config.n_shared_experts or 0))
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
    # Experts sliced (-tp) or spread (--enable-expert-parallel) over the ranks; not split into stages (docs/moe.md).
    capabilities: ClassVar[ModelCapabilities] = ModelCapabilities(tensor_parallel=True, expert_parallel=True,
                                                                  fold_norms=True)
    # Quantization configs see the merged names (online FP8 quantizes the experts; quantized checkpoints are refused).
    packed_modules_mapping: ClassVar[dict[str, list[str]]] = {
        **LlamaForCausalLM.packed_modules_mapping,
        "experts.w13_weight": ["gate_proj", "up_proj"],
        "experts.w2_weight": ["down_proj"],
    }

    def __init__(self, hf_config: Any, *, expert_parallel: bool = False, **kwargs: Any):
        """``expert_parallel``: spread whole experts over the EP group (``--enable-expert-parallel``) instead of
        slicing every expert over the TP group. Other arguments: ``LlamaForCausalLM``'s. The sparse layers count
        their routing into ``expert_load`` (``ExpertLoad``: one row per sparse layer)."""
        super().__init__(hf_config, layer_cls=partial(self.decoder_layer_cls, expert_parallel=expert_parallel),
                         **kwargs)
        self.expert_parallel = expert_parallel
        blocks = [(i, layer.mlp) for i, layer in enumerate(self.model.layers)
                  if isinstance(getattr(layer, "mlp", None), SparseMoeBlock)]
        self.expert_load = ExpertLoad([i for i, _ in blocks], moe_spec(hf_config)["num_experts"])
        for row, (_, block) in enumerate(blocks):
            block.expert_load = (self.expert_load, row)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: Any, intermediate: Any = None) -> Any:
        """``LlamaForCausalLM.forward``; when experts spread over data-parallel engines, inside ``dp_step`` with the
        step's size agreed over the DP ranks (every rank's forward pass, real or dummy, calls it together)."""
        dp = get_dp_group()
        if dp.world_size == 1 or not self.expert_parallel:
            return super().forward(input_ids, positions, ctx, intermediate)
        with dp_step(agree_num_tokens(dp, input_ids.shape[0])):
            return super().forward(input_ids, positions, ctx, intermediate)

    def checkpoint_name(self, hf_name: str) -> tuple[str, Any]:
        match = _EXPERT.search(hf_name)
        if match is None:
            return super().checkpoint_name(hf_name)
        proj = _EXPERT_PROJ[match.group(2)]
        param = ("w2_" if proj == DOWN else "w13_") + match.group(3)
        return f"{hf_name[:match.start()]}.experts.{param}", (int(match.group(1)), proj)

    @classmethod
    def check_config(cls, hf_config: Any, config: Any) -> None:
        """Refuse, in one line, an MoE config Brigade cannot run as its checkpoint means (``BrigadeConfig``
        ``config``): another router or scoring function, an activation other than SiLU, ``top_k`` outside
        ``[1, num_experts]``, experts that do not divide over the expert-parallel group (``-tp`` with
        ``--enable-expert-parallel``), an expert width ``-tp`` does not divide (without it), LoRA, a quantized
        checkpoint (``quantization_config`` in config.json: serialized FP8, GPTQ, AWQ experts are not loaded;
        online ``--quantization fp8`` on an unquantized checkpoint is supported, and a method with no expert
        layout is refused when the model is built, ``SparseMoeBlock``).

        Raises:
            ConfigError: naming the unsupported setting and what Brigade runs (a rope type: ``LlamaForCausalLM``'s).
        """
        super().check_config(hf_config, config)
        check_moe_config(hf_config, config)


def check_moe_config(hf_config: Any, config: Any, *, dequantized: frozenset[str] = frozenset(),
                     own_router: bool = False) -> None:
    """See ``MoEForCausalLM.check_config``; a checkpoint quantized in one of the ``dequantized`` formats (which the
    model class dequantizes at load) is accepted. ``own_router``: the model class checks its router's scoring and
    expert selection itself (DeepSeek's grouped router)."""
    arch = type(hf_config).__name__.removesuffix("Config") or "this model"
    spec = moe_spec(hf_config)
    num_experts, top_k = spec["num_experts"], spec["top_k"]
    scoring = getattr(hf_config, "scoring_func", None)
    if not own_router and scoring not in (None, "softmax"):
        raise ConfigError(f"{arch}: router scoring function {scoring!r} is not supported; Brigade's MoE router is "
                          "a softmax over the experts then top-k (scoring_func 'softmax')")
    topk_method = getattr(hf_config, "topk_method", None)
    if not own_router and (topk_method not in (None, "greedy") or (getattr(hf_config, "n_group", None) or 1) > 1):
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
    tp, dp = parallel.tensor_parallel_size, parallel.data_parallel_size
    ep_size = tp * dp  # the EP group: the DP x TP ranks of a stage
    if parallel.enable_expert_parallel and num_experts % ep_size:
        sizes = f"-tp {tp}" if dp == 1 else f"-dp {dp} x -tp {tp}"
        raise ConfigError(f"{arch}: {num_experts} experts do not divide over the expert-parallel group of "
                          f"{ep_size} ranks ({sizes} with --enable-expert-parallel); choose sizes whose product "
                          f"divides {num_experts}, or drop --enable-expert-parallel to slice every expert instead")
    inter = spec["intermediate_size"]
    if not parallel.enable_expert_parallel and inter % parallel.tensor_parallel_size:
        raise ConfigError(f"{arch}: the experts' intermediate size {inter} does not divide over -tp "
                          f"{parallel.tensor_parallel_size}; choose a -tp that divides it, or use "
                          "--enable-expert-parallel to give each rank whole experts")
    if config.lora_config is not None:
        raise ConfigError(f"{arch}: LoRA on mixture-of-experts models is not supported yet; serve it without "
                          "--enable-lora")
    checkpoint_quant = getattr(hf_config, "quantization_config", None)
    method = None
    if checkpoint_quant:
        method = checkpoint_quant.get("quant_method") if isinstance(checkpoint_quant, dict) else \
            getattr(checkpoint_quant, "quant_method", None)
    if checkpoint_quant and method not in dequantized:
        # Their expert tensors (codes and scales per expert) have no loader yet.
        raise ConfigError(f"{arch}: quantized mixture-of-experts checkpoints ({method}) are not supported yet; "
                          "serve the unquantized checkpoint, with --quantization fp8 to quantize its experts "
                          "and linear layers at load")
