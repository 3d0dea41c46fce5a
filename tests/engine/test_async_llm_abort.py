"""AsyncLLM.abort on a real engine (SmolLM2, fp32, CPU): a consumer waiting on generate() is released.

abort() ends the request's iterator as vLLM's does: one last RequestOutput with ``finished`` True and
``finish_reason`` "abort" on every sequence that was still running, then StopAsyncIteration. Other
requests run on, and every KV block goes back to the pool.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from brigade.config import config_from_kwargs
from brigade.engine.async_llm import AsyncLLM
from brigade.interfaces import RequestOutput
from brigade.sampling_params import RequestOutputKind, SamplingParams

PROMPT = "Once upon a time, in a small village by the sea,"
MAX_TOKENS = 200  # far more than the few steps a test lets run before it aborts
OTHER_TOKENS = 24  # the request beside the aborted one, still running when the abort comes, runs to this length
WAIT_S = 30.0  # a hang fails the test after this, instead of blocking the suite


@pytest.fixture(scope="module")
def loop():
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


@pytest.fixture(scope="module")
def engine(smollm2_path, loop):
    async def start() -> AsyncLLM:  # built inside the loop its sockets and output task will use
        return AsyncLLM(config_from_kwargs(str(smollm2_path), dtype="float32", max_model_len=256))

    async def stop() -> None:  # shut down, then let the cancelled output task finish inside the loop
        llm.shutdown()
        others = asyncio.all_tasks() - {asyncio.current_task()}
        await asyncio.gather(*others, return_exceptions=True)

    llm = loop.run_until_complete(start())
    yield llm
    loop.run_until_complete(stop())


def params(kind: RequestOutputKind = RequestOutputKind.DELTA, n: int = 1,
           max_tokens: int = MAX_TOKENS) -> SamplingParams:
    return SamplingParams(n=n, temperature=0.0, max_tokens=max_tokens, ignore_eos=True, output_kind=kind)


async def consume(llm: AsyncLLM, request_id: str, sampling_params: SamplingParams,
                  started: asyncio.Event | None = None) -> list[RequestOutput]:
    """Every output of one request; sets ``started`` at the first."""
    outputs = []
    async for output in llm.generate(PROMPT, sampling_params, request_id):
        outputs.append(output)
        if started is not None:
            started.set()
    return outputs


async def wait_blocks_free(llm: AsyncLLM) -> dict:
    deadline = time.monotonic() + WAIT_S
    while True:
        stats = await llm.get_kv_cache_stats()
        if stats["num_free_blocks"] == stats["num_total_blocks"]:
            return stats
        assert time.monotonic() < deadline, f"KV blocks not returned after the abort: {stats}"
        await asyncio.sleep(0.05)


@pytest.mark.parametrize("n", [1, 2])
def test_abort_ends_a_waiting_delta_stream_with_a_final_abort_output(engine, loop, n):
    async def scenario():
        started = asyncio.Event()
        aborted = asyncio.ensure_future(consume(engine, f"abort-delta-{n}", params(n=n), started))
        other = asyncio.ensure_future(consume(engine, f"other-delta-{n}", params(n=1, max_tokens=OTHER_TOKENS)))
        await asyncio.wait_for(started.wait(), WAIT_S)
        await engine.abort(f"abort-delta-{n}")
        outputs = await asyncio.wait_for(aborted, WAIT_S)  # the consumer was released, not left hanging
        finals = [c for o in outputs for c in o.outputs if c.finish_reason is not None]
        assert sorted(c.index for c in finals) == list(range(n))
        assert all(c.finish_reason == "abort" for c in finals)
        assert outputs[-1].finished and not any(o.finished for o in outputs[:-n])
        generated = sum(len(c.token_ids) for o in outputs for c in o.outputs)
        assert 1 <= generated < n * MAX_TOKENS
        # The other request was not touched: it runs to its length.
        rest = await asyncio.wait_for(other, 120)
        assert rest[-1].finished and rest[-1].outputs[0].finish_reason == "length"
        assert sum(len(o.outputs[0].token_ids) for o in rest) == OTHER_TOKENS
        await wait_blocks_free(engine)

    loop.run_until_complete(scenario())


def test_abort_ends_a_final_only_request_that_has_sent_nothing_yet(engine, loop):
    async def scenario():
        total = (await wait_blocks_free(engine))["num_total_blocks"]
        task = asyncio.ensure_future(consume(engine, "abort-final", params(RequestOutputKind.FINAL_ONLY)))
        deadline = time.monotonic() + WAIT_S
        while (await engine.get_kv_cache_stats())["num_free_blocks"] == total:
            assert time.monotonic() < deadline, "the request never reached the engine"
            await asyncio.sleep(0.01)  # wait until the engine holds blocks for it
        assert not task.done()
        await engine.abort("abort-final")
        outputs = await asyncio.wait_for(task, WAIT_S)
        assert len(outputs) == 1 and outputs[0].finished
        completion = outputs[0].outputs[0]
        assert completion.finish_reason == "abort" and len(completion.token_ids) < MAX_TOKENS
        await wait_blocks_free(engine)

    loop.run_until_complete(scenario())


def test_abort_of_unknown_or_finished_request_is_a_no_op(engine, loop):
    async def scenario():
        await engine.abort("never-submitted")
        short = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True, output_kind=RequestOutputKind.DELTA)
        outputs = await asyncio.wait_for(consume(engine, "finished-first", short), WAIT_S)
        assert outputs[-1].outputs[0].finish_reason == "length"
        await engine.abort("finished-first")
        again = await asyncio.wait_for(consume(engine, "after-aborts", short), WAIT_S)
        assert again[-1].finished and sum(len(o.outputs[0].token_ids) for o in again) == 3
        await wait_blocks_free(engine)

    loop.run_until_complete(scenario())
