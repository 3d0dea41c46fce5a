"""Shared test fixtures: the real SmolLM2 model directory, a transformers reference on it, a free port.

The model directory is built offline by ``scripts/fetch_model.py`` (run by ``scripts/setup.sh``).
The reference is HF transformers in fp32 on the CPU on the same files, the
correctness oracle: greedy tokens must match exactly and logprobs closely. Sub-folders add
their own fixtures in their own ``conftest.py``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import importlib.util
import socket
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
NUM_TOP_LOGPROBS = 20  # how many alternatives the reference keeps per generated position


def _fetch_model_module():
    """Import scripts/fetch_model.py by path, so the cache-location rule lives in one place."""
    spec = importlib.util.spec_from_file_location("brigade_fetch_model", REPO_ROOT / "scripts" / "fetch_model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    """The converted SmolLM2-135M-Instruct HF directory (bf16 safetensors, tokenizer, chat template)."""
    fetch_model = _fetch_model_module()
    path = fetch_model.model_dir()
    if not fetch_model.is_complete(path):
        pytest.fail(
            f"SmolLM2-135M-Instruct is not at {path} (cache root: $BRIGADE_CACHE_DIR or ~/.cache/brigade). "
            "Run ./scripts/setup.sh (or .venv/bin/python scripts/fetch_model.py) first.",
            pytrace=False,
        )
    return path


@dataclass(frozen=True)
class GreedyResult:
    """One prompt's greedy continuation by transformers.

    token_ids: generated ids (stops after EOS unless ``ignore_eos``), at most ``max_new_tokens``.
    logprobs: per generated token, its log-probability = log_softmax of the raw fp32 logits.
    top_logprobs: per generated position, the ``NUM_TOP_LOGPROBS`` best ``{token_id: logprob}``.
    """

    token_ids: list[int]
    logprobs: list[float]
    top_logprobs: list[dict[int, float]]

    def truncated(self, max_new_tokens: int) -> "GreedyResult":
        return GreedyResult(self.token_ids[:max_new_tokens], self.logprobs[:max_new_tokens],
                            self.top_logprobs[:max_new_tokens])


class HFReference:
    """transformers ``LlamaForCausalLM`` in fp32 on the CPU, with per-(prompt, length) result caching.

    The prompts of one ``generate`` call that no cached run answers decode together, left-padded with an attention
    mask, ``do_sample=False`` (one token at a time, transformers on the CPU reads every weight per step, so a batch
    costs little more than one prompt). Padding changes fp32 summation order only: on this suite's prompts the
    tokens are those of each prompt decoded alone and the logprobs within 1e-5 of them, under the 1e-4 the tests
    allow. Logprobs come from ``output_logits`` (raw logits, before any logits processor), like Brigade's sampler.
    Greedy decoding is prefix-consistent, so a cached longer run answers a shorter request.
    """

    def __init__(self, model_path: Path):
        import torch
        from transformers import AutoTokenizer, LlamaForCausalLM

        self._torch = torch
        self.model_path = model_path
        self.tokenizer = AutoTokenizer.from_pretrained(str(model_path))
        self.model = LlamaForCausalLM.from_pretrained(str(model_path), dtype=torch.float32).eval()
        self.eos_token_id: int = self.model.generation_config.eos_token_id
        self._cache: dict[tuple[tuple[int, ...], bool], tuple[int, GreedyResult]] = {}

    def generate(self, prompts: list[list[int]], max_new_tokens: int, *,
                 ignore_eos: bool = False) -> list[GreedyResult]:
        """Greedy-decode each prompt (list of token ids) for up to ``max_new_tokens`` tokens."""
        missing = list(dict.fromkeys(tuple(p) for p in prompts if self._cached(list(p), max_new_tokens,
                                                                                ignore_eos) is None))
        if missing:
            self._decode_batch([list(p) for p in missing], max_new_tokens, ignore_eos)
        return [self._cached(list(p), max_new_tokens, ignore_eos) for p in prompts]

    def greedy(self, prompts: list[list[int]], max_new_tokens: int, *, ignore_eos: bool = False) -> list[list[int]]:
        """Generated token ids per prompt."""
        return [r.token_ids for r in self.generate(prompts, max_new_tokens, ignore_eos=ignore_eos)]

    def greedy_logprobs(self, prompts: list[list[int]], max_new_tokens: int, *,
                        ignore_eos: bool = False) -> list[list[float]]:
        """Log-probability of each generated (chosen) token, per prompt."""
        return [r.logprobs for r in self.generate(prompts, max_new_tokens, ignore_eos=ignore_eos)]

    def prompt_logprobs(self, prompt: list[int]) -> list[float | None]:
        """Log-probability of each prompt token given the ones before it (``None`` for the first)."""
        torch = self._torch
        with torch.inference_mode():
            logits = self.model(torch.tensor([prompt])).logits[0].float()  # [T, vocab]
        logprobs = torch.log_softmax(logits[:-1], dim=-1)
        chosen = logprobs.gather(1, torch.tensor(prompt[1:]).unsqueeze(1)).squeeze(1)
        return [None] + chosen.tolist()

    def _cached(self, prompt: list[int], max_new_tokens: int, ignore_eos: bool) -> GreedyResult | None:
        cached = self._cache.get((tuple(prompt), ignore_eos))
        # A cached run answers if it was at least as long, or if it already stopped at EOS.
        if cached and (cached[0] >= max_new_tokens or len(cached[1].token_ids) < cached[0]):
            return cached[1].truncated(max_new_tokens)
        return None

    def _decode_batch(self, prompts: list[list[int]], max_new_tokens: int, ignore_eos: bool) -> None:
        torch = self._torch
        width = max(len(p) for p in prompts)
        ids = torch.tensor([[self.eos_token_id] * (width - len(p)) + p for p in prompts])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        stop = {"eos_token_id": []} if ignore_eos else {}
        with torch.inference_mode():
            out = self.model.generate(
                ids, attention_mask=mask, max_new_tokens=max_new_tokens, min_new_tokens=0, do_sample=False,
                output_logits=True, return_dict_in_generate=True, pad_token_id=self.eos_token_id, **stop,
            )
        for row, prompt in enumerate(prompts):
            token_ids = out.sequences[row, width:].tolist()
            if not ignore_eos and self.eos_token_id in token_ids:  # a finished row is padded with EOS after it
                token_ids = token_ids[:token_ids.index(self.eos_token_id) + 1]
            logprobs, top = [], []
            for token_id, step_logits in zip(token_ids, out.logits):
                step = torch.log_softmax(step_logits[row].float(), dim=-1)  # [vocab]
                logprobs.append(step[token_id].item())
                values, top_ids = step.topk(NUM_TOP_LOGPROBS)
                top.append(dict(zip(top_ids.tolist(), values.tolist())))
            self._cache[(tuple(prompt), ignore_eos)] = (max_new_tokens, GreedyResult(token_ids, logprobs, top))


@pytest.fixture(scope="session")
def hf_reference(smollm2_path: Path) -> HFReference:
    """Session-wide transformers fp32 reference on the SmolLM2 files (loaded once, results cached)."""
    return HFReference(smollm2_path)


@pytest.fixture(autouse=True)
def release_frozen_engines():
    """After a test that built an in-process engine, give its memory back.

    An EngineCore freezes its process's start-up heap (``brigade.utils.freeze_gc_heap``), so the cyclic garbage
    of an in-process ``LLM`` dropped at the end of a test (its tokenizer's and config's objects, a few hundred MB
    on SmolLM2) would stay frozen for the rest of the test process. Unfreezing, collecting and handing the free
    heap back to the OS keeps each pytest-xdist worker near its baseline.
    """
    yield
    if gc.get_freeze_count():
        gc.unfreeze()
        gc.collect()
        if _LIBC is not None:
            _LIBC.malloc_trim(0)


_LIBC_NAME = ctypes.util.find_library("c")
_LIBC = ctypes.CDLL(_LIBC_NAME) if _LIBC_NAME and hasattr(ctypes.CDLL(_LIBC_NAME), "malloc_trim") else None


@pytest.fixture(scope="module")
def one_torch_thread():
    """One intra-op thread for a module's tests, the previous count restored after it. For transformers' MoE
    models on the CPU: they add each expert's output with ``index_add_``, whose parallel CPU kernel takes tens of
    milliseconds per call on a busy two-core machine, against microseconds on one thread."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
