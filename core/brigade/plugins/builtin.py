"""The core's own plugin: the CPU platform, the reference attention backend, the Llama-family (Gemma 2/3 and
Phi-3 among them) and mixture-of-experts models and the built-in logits processors, registered through the same
hooks as any outside package.

Everything is registered as a lazy ``"module:Attr"`` path, so loading this plugin imports nothing heavy
and does not depend on the import order of the core's modules.
"""

from __future__ import annotations

from brigade.plugins.hookspecs import HOOKSPEC_VERSION, RegisterComponent, RegisterPlatform, hookimpl

BRIGADE_HOOKSPEC_VERSION = HOOKSPEC_VERSION

LLAMA_FAMILY = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")
"""HF architectures served by brigade.model_executor.models.llama (same block, different configs)."""

DENSE_FAMILY = {
    "Qwen3ForCausalLM": "brigade.model_executor.models.qwen3:Qwen3ForCausalLM",
    "Gemma2ForCausalLM": "brigade.model_executor.models.gemma:Gemma2ForCausalLM",
    "Gemma3ForCausalLM": "brigade.model_executor.models.gemma:Gemma3ForCausalLM",
    "Phi3ForCausalLM": "brigade.model_executor.models.phi3:Phi3ForCausalLM",
}
"""Llama-family architectures with a block of their own -> their classes."""

MOE_FAMILY = {
    "MixtralForCausalLM": "brigade.model_executor.models.mixtral:MixtralForCausalLM",
    "Qwen2MoeForCausalLM": "brigade.model_executor.models.qwen_moe:Qwen2MoeForCausalLM",
    "Qwen3MoeForCausalLM": "brigade.model_executor.models.qwen_moe:Qwen3MoeForCausalLM",
    "GptOssForCausalLM": "brigade.model_executor.models.gpt_oss:GptOssForCausalLM",
    "DeepseekV2ForCausalLM": "brigade.model_executor.models.deepseek:DeepseekV2ForCausalLM",
    "DeepseekV3ForCausalLM": "brigade.model_executor.models.deepseek:DeepseekV3ForCausalLM",
}
"""HF mixture-of-experts architectures -> their classes (brigade.model_executor.models.sparse_moe's block)."""

BUILTIN_LOGITS_PROCESSORS = {
    # name -> class in brigade.sample.logits_processors (each class's ``name`` attribute says the same).
    "allowed_token_ids": "brigade.sample.logits_processors:AllowedTokenIdsLogitsProcessor",
    "bad_words": "brigade.sample.logits_processors:BadWordsLogitsProcessor",
    "logit_bias": "brigade.sample.logits_processors:LogitBiasLogitsProcessor",
    "min_tokens": "brigade.sample.logits_processors:MinTokensLogitsProcessor",
    "min_p": "brigade.sample.logits_processors:MinPLogitsProcessor",
}


@hookimpl(trylast=True)
def register_platforms(register: RegisterPlatform) -> None:
    register("cpu", "brigade.platforms.cpu:detect_cpu")


@hookimpl(trylast=True)
def register_attention_backends(register: RegisterComponent) -> None:
    register("reference", "brigade.attention.reference:ReferenceAttentionBackend")
    register("cpu", "brigade.attention.cpu:CpuAttentionBackend")


@hookimpl(trylast=True)
def register_models(register: RegisterComponent) -> None:
    for architecture in LLAMA_FAMILY:
        register(architecture, "brigade.model_executor.models.llama:LlamaForCausalLM")
    for architecture, path in {**DENSE_FAMILY, **MOE_FAMILY}.items():
        register(architecture, path)


@hookimpl(trylast=True)
def register_logits_processors(register: RegisterComponent) -> None:
    for name, path in BUILTIN_LOGITS_PROCESSORS.items():
        register(name, path)
