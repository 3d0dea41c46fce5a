"""LLMEngine: the synchronous front end over an in-process EngineCore, used by the offline LLM class (over
``data_parallel_size`` EngineCore processes, through ``SyncMPClient``, with data parallelism)."""

from __future__ import annotations

from brigade.config import BrigadeConfig
from brigade.engine.core import EngineCore, prepare_config
from brigade.engine.core_client import EngineDeadError
from brigade.engine.input_processor import InputProcessor, eos_token_id
from brigade.engine.output_processor import OutputProcessor
from brigade.interfaces import LoRARequest, RequestOutput
from brigade.lora.request import lora_module_requests
from brigade.sampling_params import SamplingParams
from brigade.tokenizer import get_tokenizer


class LLMEngine:
    """Adds requests and steps the engine; each ``step()`` returns the RequestOutputs it produced."""

    def __init__(self, config: BrigadeConfig):
        """Raises: ConfigError: a bad or unsupported setting. EngineStartupError: a data-parallel engine process
        failed to start (naming it)."""
        self.config = config
        # Before the engine: a tokenizer that cannot load is one line before minutes of weight loading, not after.
        self.tokenizer = get_tokenizer(config.model_config)
        if config.parallel_config.data_parallel_size > 1:
            from brigade.engine.sync_client import SyncMPClient

            config.check_supported()  # one line here rather than N engines failing to start with it
            hf_config = prepare_config(config)
            self.core: EngineCore | SyncMPClient = SyncMPClient(config)
        else:
            self.core = EngineCore(config)
            hf_config = self.core.executor.hf_config
        self.input_processor = InputProcessor(self.tokenizer, config.model_config.max_model_len,
                                              hf_config.vocab_size, eos_token_id(hf_config))
        self.output_processor = OutputProcessor(self.tokenizer)
        self._step_outputs: list[RequestOutput] = []
        self._dead: BaseException | None = None  # the error of a failed step; the engine refuses work after it
        lora = config.lora_config
        # Registered adapters by name, with the ids the engine knows them by (--lora-modules: 1, 2, ...).
        self.lora_requests: dict[str, LoRARequest] = lora_module_requests(lora.lora_modules) if lora else {}
        self._next_lora_id = len(self.lora_requests) + 1

    def _check_alive(self) -> None:
        if self._dead is not None:
            raise self._dead_error() from self._dead

    def _dead_error(self) -> EngineDeadError:
        return EngineDeadError(f"the engine stopped after an error in a step ({self._dead!r}); its state is "
                               f"unknown, so build a new LLM")

    def add_lora(self, lora_request: LoRARequest) -> bool:
        """Register a LoRA adapter with the engine (loaded and checked now); False when it already is.

        Adapters are known by name here: the engine gets the adapter under an id of this engine's own (the
        next unused one), whatever ``lora_int_id`` the caller chose, so two adapters never share one.

        Raises:
            LoRAError: LoRA is not enabled, the name is registered with another path, or the adapter cannot
                be served (one line naming it and the reason).
        """
        from brigade.lora.adapter import LoRAError

        name = lora_request.lora_name
        if self.config.lora_config is None:
            raise LoRAError(f"LoRA adapter {name!r}: LoRA is not enabled; build the LLM with enable_lora=True")
        known = self.lora_requests.get(name)
        if known is not None:
            if known.lora_path != lora_request.lora_path:
                raise LoRAError(f"LoRA adapter {name!r} is already registered with path {known.lora_path}, "
                                f"not {lora_request.lora_path}")
            return False
        if name in self.config.model_config.served_model_names:
            raise LoRAError(f"LoRA adapter {name!r} has the served model's name; give it another name")
        registered = LoRARequest(name, self._next_lora_id, lora_request.lora_path)
        added = self.core.add_lora(registered)
        self._next_lora_id += 1
        self.lora_requests[name] = registered
        return added

    def remove_lora(self, lora_name: str) -> bool:
        """Unregister a LoRA adapter (vLLM's ``LLMEngine.remove_lora``, by name here); False when none has that
        name. Requests already added on it finish on it; the engine drops its weights after the last one.
        The name may then be registered again, from any folder: it becomes a new adapter (a new id)."""
        lora = self.lora_requests.pop(lora_name, None)
        return lora is not None and self.core.remove_lora(lora.lora_int_id)

    def add_request(self, request_id: str, prompt: str | list[int], params: SamplingParams, *,
                    priority: int = 0, cache_salt: str | None = None,
                    lora_request: LoRARequest | None = None) -> None:
        """Validate and queue a request (with ``lora_request``, on that adapter, registered first if new).

        Raises:
            InvalidParamError: bad input (nothing is queued).
            LoRAError: the adapter cannot be registered (see ``add_lora``).
            EngineDeadError: an earlier step failed (see ``step``).
        """
        self._check_alive()
        lora = None
        if lora_request is not None:
            self.add_lora(lora_request)
            lora = self.lora_requests[lora_request.lora_name]
        text, token_ids, children = self.input_processor.process(
            prompt, params, request_id, priority=priority, cache_salt=cache_salt,
            lora_name=lora.lora_name if lora is not None else None,
            lora_int_id=lora.lora_int_id if lora is not None else None)
        self.output_processor.add_request(request_id, text, token_ids, params, [c.request_id for c in children],
                                          children[0].arrival_time, self._step_outputs.append)
        refused = self.core.add_requests(children)  # with data parallelism all go to one engine
        if refused:  # not on a registered adapter: finished as aborted, never silently dropped
            self.output_processor.process_outputs(refused)

    def abort_request(self, request_id: str) -> None:
        self.core.abort_requests(self.output_processor.abort_request(request_id))

    def has_unfinished_requests(self) -> bool:
        return self.output_processor.has_unfinished_requests()

    def step(self) -> list[RequestOutput]:
        """One engine step; returns the outputs it produced (per the requests' output kinds).

        Raises:
            EngineDeadError: this step (or an earlier one) failed inside the scheduler or the model; the
                scheduler's and the model runner's state may disagree after that, so every later call raises
                it too, naming the first error, instead of failing in unrelated ways (vLLM's EngineDeadError).
        """
        self._check_alive()
        try:
            engine_outputs = self.core.step()
        except Exception as exc:
            self._dead = exc
            raise self._dead_error() from exc
        processed = self.output_processor.process_outputs(engine_outputs.outputs, engine_outputs.timestamp or None)
        if processed.reqs_to_abort:
            self.core.abort_requests(processed.reqs_to_abort)
        outputs = list(self._step_outputs)
        self._step_outputs.clear()
        return outputs

    def shutdown(self) -> None:
        """Stop the engine: its executor's workers, or the data-parallel engine processes."""
        self.core.shutdown()

    def get_kv_cache_stats(self) -> dict:
        from brigade.interfaces import UtilityMethod

        return self.core.call_utility(UtilityMethod.GET_KV_CACHE_STATS)

    def reset_prefix_cache(self) -> bool:
        from brigade.interfaces import UtilityMethod

        return self.core.call_utility(UtilityMethod.RESET_PREFIX_CACHE)
