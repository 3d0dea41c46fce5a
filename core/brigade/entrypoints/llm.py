"""LLM: the offline API. ``LLM(model).generate(prompts, SamplingParams(...))`` with a progress bar."""

from __future__ import annotations

import itertools
import os
from collections.abc import Sequence

import msgspec
from tqdm import tqdm

from brigade.config import BrigadeConfig, config_from_kwargs
from brigade.engine.llm_engine import LLMEngine
from brigade.interfaces import LoRARequest, RequestOutput
from brigade.sampling_params import InvalidParamError, RequestOutputKind, SamplingParams
from brigade.tokenizer import apply_chat_template

PromptType = str | list[int] | dict
"""A prompt: text, token ids, or vLLM's TextPrompt ``{"prompt": str}`` / TokensPrompt ``{"prompt_token_ids":
list[int]}`` dict (either may add ``"cache_salt": str``)."""

_PROMPT_TYPES = ('a str, a list of int token ids, {"prompt": str} or {"prompt_token_ids": list[int]} '
                 '(optionally with "cache_salt": str)')


def _is_token_ids(value) -> bool:
    return isinstance(value, (list, tuple)) and all(isinstance(t, int) and not isinstance(t, bool) for t in value)


def _normalize_prompt(prompt, where: str) -> tuple[str | list[int], str | None]:
    """(text or token ids, cache salt or None) of one prompt.

    Raises:
        TypeError: ``prompt`` is none of the accepted types, or a dict with unknown or missing keys.
    """
    if isinstance(prompt, str):
        return prompt, None
    if isinstance(prompt, (list, tuple)) and prompt and _is_token_ids(prompt):
        return list(prompt), None
    if isinstance(prompt, dict):
        unknown = sorted(map(str, set(prompt) - {"prompt", "prompt_token_ids", "cache_salt"}))
        if unknown:
            raise TypeError(f"{where} has unknown keys {unknown}; expected {_PROMPT_TYPES}")
        salt = prompt.get("cache_salt")
        if salt is not None and not isinstance(salt, str):
            raise TypeError(f"{where}['cache_salt'] must be a str, got {type(salt).__name__}")
        if "prompt_token_ids" in prompt:  # vLLM's TokensPrompt: the ids win over any "prompt" text
            ids = prompt["prompt_token_ids"]
            if not isinstance(ids, (list, tuple)) or not _is_token_ids(ids):
                raise TypeError(f"{where}['prompt_token_ids'] must be a list of int token ids, got "
                                f"{type(ids).__name__}" + (f" {ids!r:.60}" if isinstance(ids, (list, tuple)) else ""))
            return list(ids), salt
        if "prompt" in prompt:
            text = prompt["prompt"]
            if not isinstance(text, str):
                raise TypeError(f"{where}['prompt'] must be a str, got {type(text).__name__}")
            return text, salt
        raise TypeError(f"{where} has neither 'prompt' nor 'prompt_token_ids'; expected {_PROMPT_TYPES}")
    if isinstance(prompt, (list, tuple)) and not prompt:
        return [], None  # refused by the engine as an empty prompt (InvalidParamError)
    raise TypeError(f"{where} must be {_PROMPT_TYPES}; got {type(prompt).__name__} {prompt!r:.60}")


def normalize_prompts(prompts) -> list[tuple[str | list[int], str | None]]:
    """One prompt or a sequence of them, as a list of (text or token ids, cache salt or None).

    Raises:
        TypeError: ``prompts`` (or one of its items) is none of the accepted types.
    """
    if isinstance(prompts, (str, dict)) or (isinstance(prompts, (list, tuple)) and prompts
                                            and _is_token_ids(prompts)):
        return [_normalize_prompt(prompts, "prompts")]
    if not isinstance(prompts, (list, tuple)):
        raise TypeError(f"prompts must be {_PROMPT_TYPES}, or a list of them; got {type(prompts).__name__}")
    return [_normalize_prompt(p, f"prompts[{i}]") for i, p in enumerate(prompts)]


class LLM:
    """Runs a model in this process over the same EngineCore the server uses.

    Args:
        model: path of an HF-format model directory.
        **kwargs: engine arguments named like the config fields (dtype, max_model_len, block_size,
            enable_prefix_caching, max_num_seqs, max_num_batched_tokens, kv_cache_memory_gib, seed, ...).
            LoRA as in vLLM: ``enable_lora=True``, ``max_loras`` (default 1), ``max_cpu_loras`` (adapters kept in
            host memory; default ``max_loras``), ``max_lora_rank`` (default 16), optionally
            ``lora_modules={name: path}``; then ``generate(..., lora_request=LoRARequest(...))``.
            ``data_parallel_size=N`` (N > 1) runs N engine processes, each with its own scheduler and KV cache (on
            its own devices on a GPU platform), and sends each prompt to the least-loaded one, as the server does.
    """

    def __init__(self, model: str | os.PathLike, **kwargs):
        """Raises: TypeError: ``model`` is not a path, or an engine argument is unknown or of the wrong type.
        ConfigError (a ValueError): a bad value."""
        if not isinstance(model, (str, os.PathLike)):
            raise TypeError(f"model must be the path of an HF-format model directory (str or os.PathLike), "
                            f"got {type(model).__name__}")
        model = os.fspath(model)
        if not isinstance(model, str):
            raise TypeError(f"model must be a str path, got {type(model).__name__}")
        self._start(config_from_kwargs(model, **kwargs))

    @classmethod
    def from_config(cls, config: BrigadeConfig) -> LLM:
        """Build from a complete BrigadeConfig (the CLI's path).

        Raises:
            EngineStartupError: the engine could not start on this config and model (a backend the platform
                cannot run, a damaged checkpoint, ...): the ``ValueError`` that stopped it, as one message, which
                the CLI prints as one line, as ``brigade serve`` does for its engine process.
        """
        from brigade.config import ConfigError
        from brigade.engine.engine_procs import EngineStartupError

        llm = cls.__new__(cls)
        try:
            llm._start(config)
        except ConfigError:
            raise  # already one line for the CLI (exit 2)
        except ValueError as exc:
            raise EngineStartupError(" ".join(str(exc).split())) from exc
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
            prompts: a str, a list of int token ids, a TextPrompt ``{"prompt": str}`` or a TokensPrompt
                ``{"prompt_token_ids": list[int]}`` dict (vLLM's; either may carry ``"cache_salt": str``), or a
                list of these, mixed.
            sampling_params: a SamplingParams for all prompts, or a list of them, one per prompt (default:
                SamplingParams()).
            lora_request: the LoRA adapter for all prompts, or one per prompt (None: the base model); an
                adapter not yet registered is loaded first (needs ``enable_lora=True``).
        Raises:
            TypeError: a prompt or sampling_params is not of an accepted type (nothing is run then).
            InvalidParamError (a ValueError): a prompt or parameter does not fit the model, e.g. an empty prompt
                or a token id outside [0, vocab size) (nothing is run then).
            LoRAError: an adapter cannot be served (nothing is run then).
        """
        normalized = normalize_prompts(prompts)
        prompts = [prompt for prompt, _ in normalized]
        salts = [salt for _, salt in normalized]
        if sampling_params is None:
            sampling_params = SamplingParams()
        if isinstance(sampling_params, SamplingParams):
            params_list = [sampling_params] * len(prompts)
        elif isinstance(sampling_params, (list, tuple)) and all(isinstance(p, SamplingParams)
                                                               for p in sampling_params):
            params_list = list(sampling_params)
        else:
            hint = " (build it with SamplingParams(**params))" if isinstance(sampling_params, dict) else ""
            raise TypeError(f"sampling_params must be a SamplingParams or a list of them, one per prompt; got "
                            f"{type(sampling_params).__name__}{hint}")
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
                                        cache_salt=salts[i], lora_request=loras[i])
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
        """Render each conversation with the chat template, then generate (on ``lora_request``'s adapter).

        Args:
            messages: one conversation (a list of ``{"role": ..., "content": ...}`` dicts) or a list of them;
                a role is one the OpenAI server accepts (CHAT_ROLES: system, developer, user, assistant, tool,
                function).
        Raises:
            TypeError: ``messages`` is not a list of message dicts, or a list of such lists.
            InvalidParamError (a ValueError): a message's role is not one of CHAT_ROLES (the server's 400), or
                as ``generate``.
            ValueError: the model has no chat template and none was given.
        """
        from brigade.entrypoints.openai.protocol import CHAT_ROLES

        conversations = [messages] if isinstance(messages, (list, tuple)) and messages and \
            isinstance(messages[0], dict) else messages
        if not isinstance(conversations, (list, tuple)) or not all(
                isinstance(conv, (list, tuple)) and all(isinstance(m, dict) for m in conv) for conv in conversations):
            raise TypeError("messages must be a list of message dicts ({'role': str, 'content': str}) or a list of "
                            f"such lists; got {type(messages).__name__} {messages!r:.60}")
        for c, conv in enumerate(conversations):
            for i, message in enumerate(conv):
                if message.get("role") not in CHAT_ROLES:  # the server's ChatMessage.role refuses these with a 400
                    where = f"messages[{i}]" if conversations is not messages else f"messages[{c}][{i}]"
                    raise InvalidParamError(f"{where}.role must be one of {', '.join(CHAT_ROLES)}; got "
                                            f"{message.get('role')!r}", param="messages")
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

    def shutdown(self) -> None:
        """Stop the engine now (with ``data_parallel_size`` above 1 its processes, which otherwise stop when this
        LLM is garbage-collected or the interpreter exits)."""
        self.engine.shutdown()

    def get_kv_cache_stats(self) -> dict:
        """{"num_free_blocks", "num_total_blocks"} of the KV pool (summed over the data-parallel engines')."""
        return self.engine.get_kv_cache_stats()

    def reset_prefix_cache(self) -> bool:
        return self.engine.reset_prefix_cache()
