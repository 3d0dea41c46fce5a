"""Online serving benchmark: Poisson arrivals of streaming ``/v1/completions`` requests against a server.

Each request sends its prompt as token ids with ``ignore_eos`` and ``max_tokens = output_len``, streams
the answer (SSE) and notes the arrival time of every chunk. From those times (the metrics of
``vllm bench serve``):

* **TTFT**: request sent -> first chunk carrying a choice (prefill plus queueing);
* **ITL**: gaps between successive chunks (decode stability; a chunk may carry more than one token
  when the server coalesces steps);
* **TPOT**: ``(e2e - TTFT) / (output tokens - 1)`` per request, the token count from the stream's usage;
* **E2EL**: request sent -> ``[DONE]``.

Client overhead is kept low, so that it does not count in the figures: chunks are decoded into typed msgspec
structs holding only ``choices`` and ``usage``, and prompts are sent as prebuilt token-id lists.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field

import msgspec

from brigade.benchmarks.datasets import SampleRequest
from brigade.benchmarks.results import summarize


class ServerUnusableError(RuntimeError):
    """The server answered the benchmark's untimed test request with an error (wrong model name, bad key...)."""


class _Choice(msgspec.Struct):
    text: str = ""
    finish_reason: str | None = None


class _Usage(msgspec.Struct):
    prompt_tokens: int = 0
    completion_tokens: int = 0


class _Chunk(msgspec.Struct):
    """Only what the benchmark reads from a ``text_completion`` chunk; other fields are skipped."""

    choices: list[_Choice] = []
    usage: _Usage | None = None
    error: dict | None = None


_decode_chunk = msgspec.json.Decoder(_Chunk).decode


@dataclass(slots=True)
class RequestResult:
    """What one streamed request measured (seconds); ``error`` is set when it failed."""

    prompt_len: int
    output_len_wanted: int
    success: bool = False
    ttft_s: float = 0.0
    e2e_s: float = 0.0
    itls_s: list[float] = field(default_factory=list)
    num_output_tokens: int = 0
    num_chunks: int = 0
    error: str | None = None

    @property
    def tpot_s(self) -> float | None:
        if not self.success or self.num_output_tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.num_output_tokens - 1)


def completion_payload(model: str, request: SampleRequest) -> dict:
    """The /v1/completions body: token-id prompt, exact length (ignore_eos), vLLM's benchmark sampling."""
    return {"model": model, "prompt": request.prompt_token_ids, "max_tokens": request.output_len,
            "ignore_eos": True, "temperature": 1.0, "top_p": 1.0, "stream": True,
            "stream_options": {"include_usage": True}}


async def send_request(client, url: str, model: str, request: SampleRequest, headers: dict) -> RequestResult:
    """POST one streaming completion and time its chunks. Never raises for HTTP or stream errors: they
    are recorded in ``RequestResult.error`` so one failure does not end the run."""
    import httpx

    result = RequestResult(request.prompt_len, request.output_len)
    start = time.perf_counter()
    last = start
    try:
        async with client.stream("POST", url, json=completion_payload(model, request), headers=headers) as resp:
            if resp.status_code != 200:
                body = (await resp.aread()).decode(errors="replace")
                result.error = f"HTTP {resp.status_code}: {body[:300]}"
                return result
            async for line in resp.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[len("data: "):]
                if data == "[DONE]":
                    break
                now = time.perf_counter()
                chunk = _decode_chunk(data)
                if chunk.error is not None:
                    result.error = f"stream error: {chunk.error}"
                    return result
                if chunk.usage is not None:
                    result.num_output_tokens = chunk.usage.completion_tokens
                if not chunk.choices:
                    continue  # the usage-only chunk
                if result.num_chunks == 0:
                    result.ttft_s = now - start
                else:
                    result.itls_s.append(now - last)
                result.num_chunks += 1
                last = now
        result.e2e_s = time.perf_counter() - start
    except (httpx.HTTPError, msgspec.DecodeError) as exc:
        result.error = f"{type(exc).__name__}: {exc}"
        return result
    if result.num_output_tokens == 0:
        result.num_output_tokens = result.num_chunks  # a server without usage: one chunk per token
    result.success = result.num_chunks > 0
    if not result.success:
        result.error = "the stream carried no output chunk"
    return result


def arrival_delays(num_requests: int, request_rate: float, seed: int) -> list[float]:
    """Gaps (s) before each request: exponential with mean 1/rate (a Poisson process); all 0 for inf."""
    if request_rate == float("inf"):
        return [0.0] * num_requests
    if request_rate <= 0:
        raise ValueError(f"--request-rate must be positive or inf, got {request_rate}")
    rng = random.Random(seed)
    return [rng.expovariate(request_rate) for _ in range(num_requests)]


async def run_serve_benchmark(base_url: str, model: str, requests: list[SampleRequest], *, request_rate: float,
                              seed: int, api_key: str | None = None, max_concurrency: int | None = None,
                              progress=None) -> tuple[list[RequestResult], float]:
    """Send ``requests`` with Poisson arrivals; returns (per-request results in order, duration s).

    The duration runs from the first send to the last request's end. Raises ServerUnusableError when the
    untimed test request (2 tokens) fails, since the server is then not usable.
    """
    import httpx

    url = base_url.rstrip("/") + "/v1/completions"
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=max_concurrency or len(requests))
    timeout = httpx.Timeout(connect=60.0, read=None, write=60.0, pool=None)
    async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
        # Reversed ids: the probe shares no prefix-cache block with the first timed request.
        probe = SampleRequest(requests[0].prompt_token_ids[::-1], 2)
        test = await send_request(client, url, model, probe, headers)
        if not test.success:
            raise ServerUnusableError(f"the test request to {url} failed: {test.error}")
        gate = asyncio.Semaphore(max_concurrency) if max_concurrency else None

        async def one(request: SampleRequest) -> RequestResult:
            if gate is None:
                result = await send_request(client, url, model, request, headers)
            else:
                async with gate:
                    result = await send_request(client, url, model, request, headers)
            if progress is not None:
                progress.update(1)
            return result

        tasks = []
        start = time.perf_counter()
        for request, delay in zip(requests, arrival_delays(len(requests), request_rate, seed)):
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(request)))
        results = await asyncio.gather(*tasks)
        duration = time.perf_counter() - start
    return list(results), duration


def serve_metrics(results: list[RequestResult], duration_s: float) -> dict:
    """vLLM's serving metrics: counts, request/s, output and total tok/s, TTFT/TPOT/ITL/E2EL stats (ms)."""
    ok = [r for r in results if r.success]
    num_output = sum(r.num_output_tokens for r in ok)
    num_prompt = sum(r.prompt_len for r in ok)
    return {
        "num_requests": len(results), "completed": len(ok), "failed": len(results) - len(ok),
        "errors": sorted({r.error for r in results if r.error})[:5],
        "duration_s": duration_s,
        "num_prompt_tokens": num_prompt, "num_output_tokens": num_output,
        "num_output_tokens_wanted": sum(r.output_len_wanted for r in ok),
        "requests_per_s": len(ok) / duration_s, "output_tokens_per_s": num_output / duration_s,
        "total_tokens_per_s": (num_prompt + num_output) / duration_s,
        "ttft_ms": summarize([r.ttft_s for r in ok], scale=1000.0),
        "tpot_ms": summarize([t for r in ok if (t := r.tpot_s) is not None], scale=1000.0),
        "itl_ms": summarize([t for r in ok for t in r.itls_s], scale=1000.0),
        "e2el_ms": summarize([r.e2e_s for r in ok], scale=1000.0),
    }
