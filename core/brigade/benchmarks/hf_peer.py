"""The HF transformers peer: the same model and the same token-id prompts, run in the benchmark's process.

Two ways of running HF are measured (docs/benchmarks.md, "How `brigade bench` measures"):

* ``generate``: static batches of ``batch_size`` prompts, left-padded to the batch's longest prompt, each
  generating ``max(output_len)`` of its batch (``min_new_tokens = max_new_tokens``, so EOS never stops
  it early). Tokens past a request's own ``output_len`` are generated but not counted: that waste is
  the cost of static batching.
* ``generate_batch``: transformers' continuous-batching manager (``init_continuous_batching``), with
  the same per-request ``max_new_tokens`` and EOS disabled; its warm-up runs before the clock starts.
  On an accelerator its paged cache takes HF's memory-based default. On the CPU (where that default
  zero-fills half the RAM) it is sized to hold every request at once, as Brigade's 1 GiB pool does here.

Sampling matches Brigade's benchmark: temperature 1.0, top_p 1.0, top_k off.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from brigade.benchmarks.datasets import SampleRequest
from brigade.benchmarks.throughput import ThroughputFigures

class PeerUnavailableError(RuntimeError):
    """The installed transformers lacks what a peer mode needs (the message says what)."""


def load_hf_model(model_dir: str, *, dtype: torch.dtype, device: torch.device, load_format: str, seed: int,
                  trust_remote_code: bool = False):
    """The HF ``AutoModelForCausalLM`` for ``model_dir``: its safetensors, or random weights for ``dummy``
    (the folder's own code runs only with ``trust_remote_code``, ``--trust-remote-code``).

    Random weights are created directly on ``device`` (an 8B model initialised on the CPU takes minutes).
    Raises:
        PeerUnavailableError: for ``--load-format gguf`` (HF cannot read it here).
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    if load_format == "gguf":
        raise PeerUnavailableError("the HF peer cannot load --load-format gguf; use safetensors or dummy")
    if load_format == "dummy":
        hf_config = AutoConfig.from_pretrained(model_dir, local_files_only=True, trust_remote_code=trust_remote_code)
        torch.manual_seed(seed)
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(hf_config, dtype=dtype, trust_remote_code=trust_remote_code)
    else:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, local_files_only=True,
                                                     trust_remote_code=trust_remote_code).to(device)
    return model.eval()


def _generation_config(model, max_new_tokens: int, *, pad_token_id: int):
    from transformers import GenerationConfig

    return GenerationConfig(do_sample=True, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=max_new_tokens,
                            min_new_tokens=max_new_tokens, pad_token_id=pad_token_id,
                            eos_token_id=model.config.eos_token_id, use_cache=True)


def pad_token_id_of(model) -> int:
    """The model's pad id, else its first EOS id, else 0 (the id only fills left padding, masked out)."""
    pad = model.config.pad_token_id
    if pad is None:
        eos = model.config.eos_token_id
        pad = eos[0] if isinstance(eos, list) else eos
    return 0 if pad is None else int(pad)


def left_padded_batch(prompts: list[list[int]], pad_token_id: int,
                      device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids [B, L] int64, attention_mask [B, L] int64), left-padded to the longest prompt L."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt):] = torch.tensor(prompt, dtype=torch.long)
        mask[row, width - len(prompt):] = 1
    return ids.to(device), mask.to(device)


class TimingStreamer:
    """A ``generate`` streamer that notes when each step's tokens exist (after a device synchronize).

    ``generate`` calls ``put`` once with the prompt, then once per generated step; ``token_times[0]``
    is therefore the time of the first output token of the whole batch.
    """

    def __init__(self, synchronize: Callable[[], None]):
        self._synchronize = synchronize
        self._seen_prompt = False
        self.token_times: list[float] = []

    def put(self, value: torch.Tensor) -> None:
        if not self._seen_prompt:
            self._seen_prompt = True
            return
        self._synchronize()
        self.token_times.append(time.perf_counter())

    def end(self) -> None:
        """Called by ``generate`` when it finishes; nothing to flush."""


@torch.inference_mode()
def hf_generate(model, prompts: list[list[int]], max_new_tokens: int, *, synchronize: Callable[[], None],
                streamer: TimingStreamer | None = None) -> torch.Tensor:
    """One static ``generate`` call over left-padded prompts; returns the new tokens [B, max_new_tokens]."""
    pad = pad_token_id_of(model)
    ids, mask = left_padded_batch(prompts, pad, model.device)
    out = model.generate(input_ids=ids, attention_mask=mask, streamer=streamer,
                         generation_config=_generation_config(model, max_new_tokens, pad_token_id=pad))
    synchronize()
    return out[:, ids.shape[1]:]


def run_hf_generate_throughput(model, requests: list[SampleRequest], *, batch_size: int,
                               synchronize: Callable[[], None]) -> tuple[ThroughputFigures, int]:
    """Time HF ``generate`` over static batches of ``batch_size`` requests in the given order.

    Returns:
        (figures counting each request's own output_len, number of tokens actually generated).
    Raises:
        RuntimeError: a batch came back shorter than asked.
    """
    synchronize()
    start, cpu_start = time.perf_counter(), time.process_time()
    generated = 0
    for first in range(0, len(requests), batch_size):
        batch = requests[first:first + batch_size]
        max_new = max(r.output_len for r in batch)
        new_tokens = hf_generate(model, [r.prompt_token_ids for r in batch], max_new, synchronize=synchronize)
        if new_tokens.shape[1] != max_new:
            raise RuntimeError(f"HF generate returned {new_tokens.shape[1]} new tokens, expected {max_new}")
        generated += new_tokens.numel()
    elapsed, cpu_time = time.perf_counter() - start, time.process_time() - cpu_start
    figures = ThroughputFigures(elapsed, len(requests), sum(r.prompt_len for r in requests),
                                sum(r.output_len for r in requests), cpu_time)
    return figures, generated


def _workload_hints(requests: list[SampleRequest]):
    """transformers' WorkloadHints (sizes the paged cache as ``generate_batch`` does), or None if absent."""
    try:
        from transformers.generation.continuous_batching.utils import WorkloadHints
    except ImportError:
        return None
    return WorkloadHints(max_prompt_length=max(r.prompt_len for r in requests),
                         max_generated_length=max(r.output_len for r in requests), num_requests=len(requests))


def _cpu_cache_config(requests: list[SampleRequest]):
    """A ContinuousBatchingConfig whose cache holds all requests at once (plus a quarter), for the CPU."""
    import transformers

    config_cls = getattr(transformers, "ContinuousBatchingConfig", None)
    if config_cls is None:
        return None
    page_size = config_cls().page_size
    pages = sum(-(-(r.prompt_len + r.output_len) // page_size) for r in requests)
    return config_cls(num_blocks=pages + pages // 4 + 1)


@torch.no_grad()  # generate_batch updates its cache tensors from its own thread: no inference tensors
def run_hf_generate_batch_throughput(model, requests: list[SampleRequest], *,
                                     synchronize: Callable[[], None]) -> ThroughputFigures:
    """Time transformers' continuous batching over all requests (added together, like ``generate_batch``).

    Raises:
        PeerUnavailableError: this transformers has no continuous-batching API.
        RuntimeError: a request failed or came back with the wrong number of tokens.
    """
    if not hasattr(model, "init_continuous_batching"):
        raise PeerUnavailableError("this transformers has no continuous batching (model.init_continuous_batching)")
    gen_config = _generation_config(model, max(r.output_len for r in requests), pad_token_id=pad_token_id_of(model))
    gen_config.min_new_tokens = None  # EOS is disabled per request below instead
    options = {}
    hints = _workload_hints(requests)
    if hints is not None:
        options["workload_hints"] = hints
    cb_config = _cpu_cache_config(requests) if model.device.type == "cpu" else None
    if cb_config is not None:
        options["continuous_batching_config"] = cb_config
    manager = model.init_continuous_batching(generation_config=gen_config, **options)
    manager.warmup()  # untimed, like Brigade's start-up: allocations and CUDA-graph capture
    manager.start()
    try:
        synchronize()
        start, cpu_start = time.perf_counter(), time.process_time()
        wanted = {}
        for r in requests:
            # eos_token_id=-1 is transformers' "no EOS": the HF spelling of ignore_eos.
            request_id = manager.add_request(input_ids=r.prompt_token_ids, max_new_tokens=r.output_len,
                                             eos_token_id=-1)
            wanted[request_id] = r.output_len
        done: dict[str, int] = {}
        while len(done) < len(wanted):
            result = manager.get_result(timeout=1.0)
            if result is None:
                if not manager.is_running():
                    raise RuntimeError("transformers' continuous batching thread stopped before finishing")
                continue
            if result.is_finished():
                if result.error:
                    raise RuntimeError(f"HF continuous batching request {result.request_id} failed: {result.error}")
                done[result.request_id] = len(result.generated_tokens)
        synchronize()
        elapsed, cpu_time = time.perf_counter() - start, time.process_time() - cpu_start
    finally:
        manager.stop(block=True)
    wrong = {k: (v, wanted[k]) for k, v in done.items() if v != wanted[k]}
    if wrong:
        raise RuntimeError(f"HF continuous batching returned wrong token counts (got, wanted): {wrong}")
    return ThroughputFigures(elapsed, len(requests), sum(r.prompt_len for r in requests), sum(done.values()),
                             cpu_time)
