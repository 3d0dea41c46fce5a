"""LLM: the offline API. ``LLM(model).generate(prompts, SamplingParams(...))`` with a progress bar."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import msgspec
from tqdm import tqdm

from brigade.config import BrigadeConfig, config_from_kwargs
from brigade.engine.llm_engine import LLMEngine
from brigade.lora.request import LoRARequest
from brigade.outputs import RequestOutput
from brigade.sampling_params import RequestOutputKind, SamplingParams
from brigade.tokenizer import apply_chat_template

PromptType = str | list[int]


class LLM:
    """Runs a model in this process over the same EngineCore the server uses.

    Args:
        model: path of an HF-format model directory.
        **kwargs: engine arguments named like the config fields (dtype, max_model_len, block_size,
            enable_prefix_caching, max_num_seqs, max_num_batched_tokens, kv_cache_memory_gib, seed, ...).
            LoRA as in vLLM: ``enable_lora=True``, ``max_loras`` (default 1), ``max_cpu_loras`` (adapters kept in
            host memory; default ``max_loras``), ``max_lora_rank`` (default 16), optionally
            ``lora_modules={name: path}``; then ``generate(..., lora_request=LoRARequest(...))``.
    """

    def __init__(self, model: str, **kwargs):
        self._start(config_from_kwargs(model, **kwargs))

    @classmethod
    def from_config(cls, config: BrigadeConfig) -> LLM:
        """Build from a complete BrigadeConfig (the CLI's path)."""
        llm = cls.__new__(cls)
        llm._start(config)
        return llm

    def _start(self, config: BrigadeConfig) -> None:
        self.config = config
        self.engine = LLMEngine(config)
        self._counter = itertools.count()

    def get_tokenizer(self):
        return self.engine.tokenizer

    def generate(self, prompts: PromptType | Sequence[PromptType],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None, *,
                 use_tqdm: bool = True, priority: Sequence[int] | None = None,
                 lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None) -> list[RequestOutput]:
        """Generate for every prompt, all submitted at once; outputs come back in prompt order.

        Args:
            prompts: a string, a list of token ids, or a list of either.
            sampling_params: one for all prompts, or one per prompt (default: SamplingParams()).
            lora_request: the LoRA adapter for all prompts, or one per prompt (None: the base model); an
                adapter not yet registered is loaded first (needs ``enable_lora=True``).
        Raises:
            InvalidParamError: a prompt or parameter does not fit the model (nothing is run then).
            LoRAError: an adapter cannot be served (nothing is run then).
        """
        if isinstance(prompts, str) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        prompts = list(prompts)
        if sampling_params is None:
            sampling_params = SamplingParams()
        params_list = [sampling_params] * len(prompts) if isinstance(sampling_params, SamplingParams) \
            else list(sampling_params)
        if len(params_list) != len(prompts):
            raise ValueError(f"got {len(prompts)} prompts but {len(params_list)} sampling params")
        loras = [lora_request] * len(prompts) if lora_request is None or isinstance(lora_request, LoRARequest) \
            else list(lora_request)
        if len(loras) != len(prompts):
            raise ValueError(f"got {len(prompts)} prompts but {len(loras)} LoRA requests")
        for lora in dict.fromkeys(r for r in loras if r is not None):  # every adapter checked before any request
            self.engine.add_lora(lora)
        ids = []
        try:
            for i, (prompt, params) in enumerate(zip(prompts, params_list)):
                params = msgspec.structs.replace(params, output_kind=RequestOutputKind.FINAL_ONLY)
                request_id = str(next(self._counter))
                self.engine.add_request(request_id, prompt, params, priority=priority[i] if priority else 0,
                                        lora_request=loras[i])
                ids.append(request_id)
        except Exception:
            for request_id in ids:
                self.engine.abort_request(request_id)
            raise
        outputs = self._run(ids, use_tqdm)
        for output, lora in zip(outputs, loras):
            output.lora_request = lora
        return outputs

    def chat(self, messages: list[dict] | list[list[dict]], sampling_params: SamplingParams | None = None, *,
             use_tqdm: bool = True, chat_template: str | None = None, add_generation_prompt: bool = True,
             tools: list[dict] | None = None, lora_request: LoRARequest | None = None) -> list[RequestOutput]:
        """Render each conversation with the chat template, then generate (on ``lora_request``'s adapter)."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        tokenizer = self.engine.tokenizer
        prompts = [tokenizer.encode(apply_chat_template(tokenizer, conv, add_generation_prompt=add_generation_prompt,
                                                        tools=tools, chat_template=chat_template),
                                    add_special_tokens=False) for conv in conversations]
        return self.generate(prompts, sampling_params, use_tqdm=use_tqdm, lora_request=lora_request)

    def _run(self, request_ids: list[str], use_tqdm: bool) -> list[RequestOutput]:
        finished: dict[str, RequestOutput] = {}
        bar = tqdm(total=len(request_ids), desc="Processed prompts", disable=not use_tqdm, dynamic_ncols=True)
        num_out_tokens = 0
        try:
            while self.engine.has_unfinished_requests():
                for output in self.engine.step():
                    if output.finished:
                        finished[output.request_id] = output
                        num_out_tokens += sum(len(c.token_ids) for c in output.outputs)
                        bar.update(1)
                        elapsed = bar.format_dict["elapsed"] or 1e-9
                        bar.set_postfix_str(f"output: {num_out_tokens / elapsed:.1f} tok/s")
        finally:
            bar.close()
        return [finished[i] for i in request_ids]

    def get_kv_cache_stats(self) -> dict:
        """{"num_free_blocks", "num_total_blocks"} of the KV pool."""
        return self.engine.get_kv_cache_stats()

    def reset_prefix_cache(self) -> bool:
        return self.engine.reset_prefix_cache()
