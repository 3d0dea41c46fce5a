"""StructuredOutputManager: grammars compiled off the scheduling loop, one bitmask per step.

It lives in the EngineCore next to the scheduler. A request with a constraint gets its grammar compiled
in a thread pool (xgrammar releases the GIL while compiling), so the busy loop keeps stepping the other
requests; the scheduler leaves the request waiting until its compile is done. Each step the manager
fills an int32 bitmask row for every constrained request that samples, and after the step it advances
each request's matcher with the accepted token. Compiled grammars are cached by their canonical spec.

The tokenizer (and xgrammar's TokenizerInfo built from it) is loaded lazily on the first constrained
request, in the pool, so engines that never see one pay nothing at start-up.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from brigade.sampling_params import StructuredOutputsParams
from brigade.structured_output.grammar import RequestGrammar
from brigade.structured_output.spec import GrammarSpec

logger = logging.getLogger("brigade.structured_output")

__all__ = ["StructuredOutputManager"]

DEFAULT_CACHE_SIZE = 256  # compiled grammars kept; a real deployment reuses a handful of schemas


@dataclass(slots=True)
class _RequestEntry:
    future: concurrent.futures.Future  # -> xgrammar CompiledGrammar
    grammar: RequestGrammar | None = None  # built on first use, once the compile is done


class StructuredOutputManager:
    """Owns the compile pool, the compiled-grammar cache and every constrained request's matcher.

    Every method is called from the engine's busy-loop thread; only compiles run on the pool.

    Args:
        load_tokenizer: returns the model's HF tokenizer; called once, in the pool.
        vocab_size: the model's vocabulary (lm_head rows, from the HF config); may exceed the tokenizer's.
        stop_token_ids: the model's EOS ids; the grammar allows them only where it may end.
        max_workers: compile threads (default: half the CPUs, at least one).
        cache_size: compiled grammars kept, least recently used dropped first.
    """

    def __init__(self, load_tokenizer: Callable[[], object], vocab_size: int, stop_token_ids: list[int], *,
                 max_workers: int | None = None, cache_size: int = DEFAULT_CACHE_SIZE):
        self.vocab_size = vocab_size
        self.bitmask_width = -(-vocab_size // 32)
        self._load_tokenizer = load_tokenizer
        self._stop_token_ids = list(stop_token_ids)
        workers = max_workers or max(1, (os.cpu_count() or 2) // 2)
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=workers,
                                                           thread_name_prefix="brigade-grammar")
        self._compile_threads = workers
        self._compiler: concurrent.futures.Future | None = None
        self._cache: OrderedDict[GrammarSpec, concurrent.futures.Future] = OrderedDict()
        self._cache_size = cache_size
        self._requests: dict[str, _RequestEntry] = {}

    @classmethod
    def from_config(cls, config, hf_config) -> StructuredOutputManager | None:
        """The manager of an engine, or None when it runs without a tokenizer (token ids only)."""
        if config.model_config.skip_tokenizer_init:
            return None
        from brigade.tokenizer import get_tokenizer

        eos = getattr(hf_config, "eos_token_id", None)
        stop = [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
        return cls(lambda: get_tokenizer(config.model_config), hf_config.vocab_size, stop)

    # ---- compiling ------------------------------------------------------------------------------
    def _build_compiler(self):
        import xgrammar as xgr

        tokenizer = self._load_tokenizer()
        stop = sorted(set(self._stop_token_ids) | ({tokenizer.eos_token_id} - {None}))
        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=self.vocab_size, stop_token_ids=stop)
        # Our own LRU keys by canonical spec and dedups in-flight compiles, so xgrammar's cache is off.
        return xgr.GrammarCompiler(info, max_threads=self._compile_threads, cache_enabled=False)

    def _compile(self, spec: GrammarSpec):
        compiler = self._compiler.result()  # submitted first, so it never waits behind this task
        return compiler.compile_grammar(spec.build_grammar())

    def _compiled(self, spec: GrammarSpec) -> concurrent.futures.Future:
        if self._compiler is None:
            self._compiler = self._pool.submit(self._build_compiler)
        future = self._cache.get(spec)
        if future is None:
            future = self._pool.submit(self._compile, spec)
            self._cache[spec] = future
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(spec)
        return future

    # ---- requests -------------------------------------------------------------------------------
    def add_request(self, request_id: str, params: StructuredOutputsParams) -> None:
        """Start compiling a request's grammar (or reuse the cached one). Never blocks.

        A constraint the front end let through but that fails here is reported by ``take_failure``.
        """
        try:
            spec = GrammarSpec.from_params(params)
        except ValueError as exc:  # InvalidParamError: the front end should have refused it
            failed: concurrent.futures.Future = concurrent.futures.Future()
            failed.set_exception(exc)
            self._requests[request_id] = _RequestEntry(failed)
            return
        self._requests[request_id] = _RequestEntry(self._compiled(spec))

    def is_waiting_for_grammar(self, request_id: str) -> bool:
        """True while the request's grammar is still compiling (the scheduler must not admit it yet)."""
        entry = self._requests.get(request_id)
        return entry is not None and not entry.future.done()

    def take_failure(self, request_id: str) -> str | None:
        """The compile error of a request whose grammar failed (then forgotten), else None."""
        entry = self._requests.get(request_id)
        if entry is None or not entry.future.done() or entry.future.exception() is None:
            return None
        del self._requests[request_id]
        exc = entry.future.exception()
        logger.error("grammar of request %s failed to compile: %s", request_id, exc)
        return f"the output constraint failed to compile: {exc}"

    def _grammar(self, request_id: str) -> RequestGrammar:
        entry = self._requests[request_id]
        if entry.grammar is None:
            entry.grammar = RequestGrammar(entry.future.result())
        return entry.grammar

    def has_request(self, request_id: str) -> bool:
        return request_id in self._requests

    def remove_request(self, request_id: str) -> None:
        """Forget a finished, aborted or failed request (its matcher is dropped; the compile stays cached)."""
        self._requests.pop(request_id, None)

    # ---- one step -------------------------------------------------------------------------------
    def grammar_bitmask(self, request_ids: list[str]) -> np.ndarray:
        """The allowed next tokens of each request, one row per id in order.

        Returns: [len(request_ids), ceil(vocab_size / 32)] int32; bit j of word w allows token 32w + j.
        Every request must have a compiled grammar (``is_waiting_for_grammar`` false).
        """
        bitmask = np.full((len(request_ids), self.bitmask_width), -1, dtype=np.int32)
        for row, request_id in enumerate(request_ids):
            self._grammar(request_id).fill_bitmask(bitmask, row)
        return bitmask

    def accept_tokens(self, request_id: str, token_ids: list[int]) -> bool:
        """Advance a request's matcher by its newly sampled tokens; False if the grammar rejects one."""
        return self._grammar(request_id).accept(token_ids)

    def is_terminated(self, request_id: str) -> bool:
        """True once the request's grammar accepted its stop token: nothing more may be generated."""
        return self._grammar(request_id).is_terminated

    def has_pending_compiles(self) -> bool:
        return any(not e.future.done() for e in self._requests.values())

    def wait_for_compiles(self, timeout_s: float) -> None:
        """Block up to ``timeout_s`` until some pending compile finishes (the engine has nothing else to do)."""
        pending = [e.future for e in self._requests.values() if not e.future.done()]
        if pending:
            concurrent.futures.wait(pending, timeout=timeout_s, return_when=concurrent.futures.FIRST_COMPLETED)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
